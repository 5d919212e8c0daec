"""psrv/client/inner_step.py: an inner step on a NaN gradient leaves the optimizer's state as it was, so
after the worker's pull brings finite weights back, the run goes on as if that step had not been taken."""
import torch

from psrv.client.inner_step import inner_step


def test_a_nan_step_leaves_adamw_as_if_it_had_not_been_taken():
    torch.manual_seed(0)
    w0, g1, g2 = torch.randn(5), torch.randn(5), torch.randn(5)
    nan = torch.full((5,), float("nan"))

    w = torch.nn.Parameter(w0.clone())
    opt = torch.optim.AdamW([w], lr=0.1)
    for g in (g1, nan, g2):
        before = w.detach().clone()
        w.grad = g.clone()
        assert inner_step(opt) == bool(torch.isfinite(g).all())
        if g is nan:
            assert not torch.isfinite(w).any()  # the weights took it: the round's push carries the NaN
            with torch.no_grad():
                w.copy_(before)  # as psrv.Worker's pull brings finite weights back

    v = torch.nn.Parameter(w0.clone())  # AdamW by itself, the two finite gradients only
    clean = torch.optim.AdamW([v], lr=0.1)
    for g in (g1, g2):
        v.grad = g.clone()
        clean.step()
    assert torch.equal(w, v)
    assert opt.state[w]["step"] == clean.state[v]["step"] == 2
    assert torch.equal(opt.state[w]["exp_avg"], clean.state[v]["exp_avg"])
    assert torch.equal(opt.state[w]["exp_avg_sq"], clean.state[v]["exp_avg_sq"])


def test_a_finite_step_is_the_optimizers_own():
    w, v = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    a, b = torch.optim.SGD([w], lr=0.5, momentum=0.9), torch.optim.SGD([v], lr=0.5, momentum=0.9)
    for _ in range(2):
        w.grad, v.grad = torch.full((3,), 2.0), torch.full((3,), 2.0)
        assert inner_step(a)
        b.step()
    assert torch.equal(w, v) and torch.equal(a.state[w]["momentum_buffer"], b.state[v]["momentum_buffer"])
