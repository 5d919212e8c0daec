"""The server's step on its flat shard equals torch.optim's step on the same vector."""
import pytest
import torch

from psrv.config import OptimConfig
from psrv.server.optim import FUSED_MIN_ELEMENTS
from psrv.server.shard import Shard

CASES = [
    OptimConfig("sgd", lr=0.1, momentum=0.0),
    OptimConfig("sgd", lr=0.1, momentum=0.9),
    OptimConfig("sgd", lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
    OptimConfig("adam", lr=1e-3, momentum=0.0),
    OptimConfig("adamw", lr=1e-3, momentum=0.0, weight_decay=1e-2),
    OptimConfig("onebit_adam", lr=1e-3, weight_decay=1e-2, freeze_step=5),  # its warm-up: AdamW
]


def reference(cfg: OptimConfig, param: torch.nn.Parameter) -> torch.optim.Optimizer:
    if cfg.name == "sgd":
        return torch.optim.SGD([param], lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                               weight_decay=cfg.weight_decay)
    cls = torch.optim.Adam if cfg.name == "adam" else torch.optim.AdamW
    return cls([param], lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)


@pytest.mark.parametrize("size", [10_000, FUSED_MIN_ELEMENTS], ids=["plain", "fused"])
@pytest.mark.parametrize("cfg", CASES, ids=lambda c: f"{c.name}-m{c.momentum}-n{c.nesterov}-wd{c.weight_decay}")
def test_server_step_equals_torch_optim(cfg, size):
    gen = torch.Generator().manual_seed(0)
    init = torch.randn(size, generator=gen)
    shard = Shard(init.numel(), cfg)
    shard.init(init)
    ref = torch.nn.Parameter(init.clone())
    opt = reference(cfg, ref)
    for _ in range(5):
        grad = torch.randn(size, generator=gen)
        shard.apply(grad)
        ref.grad = grad.clone()
        opt.step()
    assert shard.version == 5
    torch.testing.assert_close(shard.weights, ref.detach(), rtol=1e-6, atol=1e-6)


def test_sync_step_applies_the_mean_of_the_accumulated_gradients():
    cfg = OptimConfig("sgd", lr=0.5, momentum=0.0)
    shard = Shard(4, cfg)
    shard.init(torch.zeros(4))
    shard.accumulate(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    shard.accumulate(torch.tensor([3.0, 2.0, 1.0, 0.0]))
    assert shard.version == 0
    assert shard.apply_accumulated() == 2
    assert shard.version == 1
    torch.testing.assert_close(shard.weights, torch.tensor([-1.0, -1.0, -1.0, -1.0]))
