"""psrv.Worker's contract with a user's loop, against two shards served from threads on 127.0.0.1:
whatever the loop does to `.grad` (zero_grad to None, several backward passes), the pushed gradient
is the one backward computed, or the worker refuses and leaves."""
import dataclasses

import pytest
import torch

import psrv

pytestmark = pytest.mark.timeout(120)
LR, SHARDS = 0.1, 2


def _shards(workers: int = 1) -> list:
    opt = psrv.OptimConfig(name="sgd", lr=LR, momentum=0.0)
    return [psrv.Server(psrv.ServerConfig(shard=s, num_shards=SHARDS, workers=workers, mode="sync",
                                          worker_timeout=30.0, optimizer=opt)).start() for s in range(SHARDS)]


def _batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)) for _ in range(steps)]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _sgd(batches, *, accumulate: int = 1) -> torch.Tensor:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for k in range(0, len(batches), accumulate):
        opt.zero_grad()
        for x, y in batches[k:k + accumulate]:
            torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return _flat(model)


def _end(servers) -> None:
    for server in servers:
        server.join(30)  # returns once its only worker has left (TimeoutError otherwise)


@pytest.mark.parametrize("zero_grad", [False, True], ids=["step-zeroes", "model.zero_grad"])
def test_the_pushed_gradient_is_backwards_whatever_the_loop_does_to_grad(zero_grad):
    servers, batches = _shards(), _batches(6)
    model = _model()
    with psrv.Worker(model, [s.address for s in servers], rank=0, world_size=1) as ps:
        for x, y in batches:
            if zero_grad:
                model.zero_grad()  # sets every .grad to None: psrv.Worker takes backward's new one
            torch.nn.functional.mse_loss(model(x), y).backward()
            info = ps.step()
        assert ps.early_sends > 0  # the overlap was on: shards went out during backward
    _end(servers)
    torch.testing.assert_close(_flat(model), _sgd(batches), rtol=0, atol=1e-6)
    assert (info.step, info.version, info.staleness) == (5, 6, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.step = 0


def test_accumulating_gradients_needs_overlap_off_and_then_sums_them():
    servers, batches = _shards(), _batches(6)
    model = _model()
    with psrv.Worker(model, [s.address for s in servers], rank=0, world_size=1, overlap=False) as ps:
        for k in range(0, 6, 2):
            for x, y in batches[k:k + 2]:
                torch.nn.functional.mse_loss(model(x), y).backward()
            ps.step()
    _end(servers)
    torch.testing.assert_close(_flat(model), _sgd(batches, accumulate=2), rtol=0, atol=1e-6)

    servers = _shards()
    model = _model()
    ps = psrv.Worker(model, [s.address for s in servers], rank=0, world_size=1)
    for x, y in batches[:2]:
        torch.nn.functional.mse_loss(model(x), y).backward()
    with pytest.raises(RuntimeError, match="two backward passes between step"):
        ps.step()
    _end(servers)  # it left as it raised: the shards end
    with pytest.raises(RuntimeError, match="has left its shards"):
        ps.step()


def test_an_error_in_the_with_block_leaves_every_shard_and_the_others_go_on():
    servers = _shards(workers=2)
    addresses = [s.address for s in servers]
    first = psrv.Worker(_model(), addresses, rank=0, world_size=2)  # rank 0 first: its INIT
    other = psrv.Worker(_model(), addresses, rank=1, world_size=2, timeout=30)
    with pytest.raises(ZeroDivisionError):
        with first:
            1 / 0
    x, y = _batches(1)[0]
    for _ in range(3):  # the sync barrier no longer waits for rank 0
        torch.nn.functional.mse_loss(other.model(x), y).backward()
        assert other.step().waited < 5
    other.close()
    _end(servers)
