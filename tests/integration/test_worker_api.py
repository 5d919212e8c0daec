"""psrv.Worker in a researcher's own loop (tests/integration/user_loop.py): two worker processes, each
with its own DataLoader over a DistributedSampler shard and told its place by the environment, against
two shards served from threads of the test process (psrv.Server, as `psrv serve` runs it) on
127.0.0.1. In sync mode the model ends exactly where single-process SGD on the global batch ends; in
async and SSP it trains; the loop needs no more than four lines of psrv."""
import io
import json
import os
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest
import torch

import psrv
from psrv.cli import build_parser
from psrv.config import ServerConfig
from psrv.config.cli_args import config_from_args
from tests.helpers import ROOT
from tests.integration import user_loop

SCRIPT = Path(user_loop.__file__)
WORKERS, SHARDS, LR, MOMENTUM = 2, 2, 0.1, 0.9


def _cluster(procs, tmp_path: Path, *mode: str, epochs: int, momentum: float = MOMENTUM) -> list[dict]:
    """Start the shards (the `psrv serve` of these options, in threads: the shards' being processes is
    not what this file tests) and the user's script as WORKERS processes; return each rank's output."""
    servers = [psrv.Server(config_from_args(ServerConfig, build_parser().parse_args(
        ["serve", "--bind", "tcp://127.0.0.1:0", "--shard", str(s), "--num-shards", str(SHARDS), "--workers",
         str(WORKERS), *mode, "--optimizer", "sgd", "--lr", str(LR), "--momentum", str(momentum),
         "--worker-timeout", "60"]))).start() for s in range(SHARDS)]
    try:
        return _workers(procs, tmp_path, servers, epochs=epochs)
    finally:
        for s in servers:
            s.stop()


def _workers(procs, tmp_path: Path, servers: list[psrv.Server], *, epochs: int) -> list[dict]:
    addresses, workers = [s.address for s in servers], []
    for rank in range(WORKERS):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(WORKERS), "PSRV_SERVERS": ",".join(addresses),
               "PYTHONUNBUFFERED": "1"}
        with open(tmp_path / f"worker-{rank}.log", "w") as log:
            p = subprocess.Popen([sys.executable, str(SCRIPT), str(epochs), str(tmp_path / f"worker-{rank}.json")],
                                 cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        p.name = f"worker-{rank}"
        procs.started.append(p)  # killed by PID at teardown if still running
        workers.append(p)
    for p in workers:
        assert procs.wait(p, timeout=120) == 0, procs.log(p.name)[-3000:]
    for server in servers:
        server.join(timeout=30)  # every worker left: they end (a shard's failure is raised here)
    return [json.loads((tmp_path / f"worker-{rank}.json").read_text()) for rank in range(WORKERS)]


def _global_batch_sgd(steps: int) -> torch.Tensor:
    """Single-process SGD over the same model: each step one batch of both ranks' batches, mean loss."""
    data, net = user_loop.dataset(), user_loop.model()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    samplers = [torch.utils.data.DistributedSampler(data, num_replicas=WORKERS, rank=r, shuffle=True, seed=0)
                for r in range(WORKERS)]
    loaders = [iter(torch.utils.data.DataLoader(data, batch_size=user_loop.BATCH, sampler=s)) for s in samplers]
    for _ in range(steps):
        x, y = (torch.cat(t) for t in zip(*(next(it) for it in loaders)))
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


@pytest.mark.timeout(240)
def test_sync_workers_own_loop_equals_single_process_sgd_on_the_global_batch(procs, tmp_path):
    out = _cluster(procs, tmp_path, "--mode", "sync", epochs=1)
    steps = user_loop.SAMPLES // WORKERS // user_loop.BATCH
    want = _global_batch_sgd(steps)
    initial = torch.cat([p.detach().reshape(-1) for p in user_loop.model().parameters()])
    assert (want - initial).abs().max() > 1e-2                      # the reference really moved
    assert [n for n, _ in user_loop.model().named_parameters()][0] == "unused"
    assert torch.equal(want[:3], initial[:3])                        # `unused` got no gradient: it stays
    for rank, got in enumerate(out):                                 # rank 0 after close(), rank 1 after its last step
        torch.testing.assert_close(torch.tensor(got["params"]), want, rtol=0, atol=1e-5)
        infos = got["infos"]
        assert [i["step"] for i in infos] == list(range(steps)), rank
        assert [i["version"] for i in infos] == list(range(1, steps + 1)), rank   # one update per clock
        assert {i["staleness"] for i in infos} == {0}, rank
        assert [i["clock"] for i in infos] == list(range(1, steps + 1)), rank
        assert got["batches_seen"] == steps + 1, rank                 # its own buffer: 20 batches and the check


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", [("--mode", "async"), ("--mode", "ssp", "--staleness", "1")], ids=["async", "ssp"])
def test_the_same_loop_trains_in_async_and_ssp(mode, procs, tmp_path):
    # Momentum 0.9 on gradients one or two updates stale diverges at this lr (so does a single-process
    # simulation of it): asynchrony adds momentum of its own (Mitliagkas et al., 2016).
    out = _cluster(procs, tmp_path, *mode, epochs=3, momentum=0.5)
    data, net = user_loop.dataset(), user_loop.model()
    with torch.no_grad():
        before = torch.nn.functional.mse_loss(net(data.tensors[0]), data.tensors[1]).item()
    assert out[0]["full_loss"] < 0.5 * before, (before, out[0]["full_loss"])   # rank 0 holds the final weights
    for got in out:
        assert [i["step"] for i in got["infos"]] == list(range(3 * user_loop.SAMPLES // WORKERS // user_loop.BATCH))


def test_the_users_loop_has_at_most_four_lines_of_psrv():
    """Lines of code (not imports, comments or docstrings) that name `psrv` or `ps.`."""
    tokens = list(tokenize.generate_tokens(io.StringIO(SCRIPT.read_text()).readline))
    lines = SCRIPT.read_text().splitlines()
    marked = {t.start[0] for k, t in enumerate(tokens) if t.type == tokenize.NAME and (
        t.string == "psrv" or (t.string == "ps" and k + 1 < len(tokens) and tokens[k + 1].string == "."))}
    code = sorted(n for n in marked if not lines[n - 1].lstrip().startswith(("import ", "from ")))
    assert [lines[n - 1].strip() for n in code] == ["ps = psrv.Worker(net)", "infos.append(ps.step())",
                                                    "ps.close()"]
    assert len(code) <= 4


def test_a_parameter_psrv_cannot_keep_is_a_one_line_value_error_naming_it():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1).double())
    with pytest.raises(ValueError, match=r"^parameter '1.weight' is float64; psrv keeps parameters as float32"):
        psrv.Worker(model, ["tcp://127.0.0.1:9"], rank=0, world_size=1)   # refused before any connection
    with pytest.raises(ValueError, match="no parameters"):
        psrv.Worker(torch.nn.ReLU(), ["tcp://127.0.0.1:9"], rank=0, world_size=1)


def test_without_servers_or_rank_the_environment_is_named(monkeypatch):
    monkeypatch.delenv("PSRV_SERVERS", raising=False)
    with pytest.raises(ValueError, match="PSRV_SERVERS"):
        psrv.Worker(torch.nn.Linear(2, 1), rank=0, world_size=1)
    monkeypatch.setenv("PSRV_SERVERS", "tcp://127.0.0.1:9")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match="RANK"):
        psrv.Worker(torch.nn.Linear(2, 1), world_size=1)
