"""psrv.make_worker under an all-reduce run (PSRV_MODE ddp or zero1, PSRV_CONFIG the run's config.json) is the
all-reduce worker (psrv/client/allreduce.py), and psrv.Worker itself is refused there. Here one rank in this process
(a world of one needs no rendezvous): it steps the run's optimizer, clip and schedule, writes its record, tears down
the group it made, and refuses in one line what it cannot do. The ranks together:
tests/integration/test_script_allreduce.py."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import psrv
from psrv.config import RunConfig, to_dict
from psrv.config.base import from_dict
from psrv.client.steplog import RecordFiles, StepLog
from tests.helpers import ROOT
from tests.reference_sgd import clipped_warmup_sgd

LR, MOMENTUM, CLIP, WARMUP = 0.1, 0.9, 0.5, 2


@pytest.fixture
def run_env(tmp_path, monkeypatch):
    """Set the environment `psrv run --mode MODE --script` gives a lone rank; returns the setter."""
    for name in ("MASTER_ADDR", "MASTER_PORT", "PSRV_SERVERS", "PSRV_RECORD", "PSRV_PARAMS_OUT", "PSRV_PROGRESS",
                 "PSRV_METRICS_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)

    def set_run(mode: str = "ddp", *, config_mode: str | None = None, world_size: int = 1, **optimizer):
        cfg = from_dict(RunConfig, {"mode": config_mode or mode, "cluster": {"workers": world_size},
                                    "optimizer": {"lr": LR, "momentum": MOMENTUM, **optimizer}})
        path = tmp_path / "config.json"
        path.write_text(json.dumps(to_dict(cfg)))
        for name, value in {"PSRV_MODE": mode, "PSRV_CONFIG": str(path), "RANK": "0",
                            "WORLD_SIZE": str(world_size)}.items():
            monkeypatch.setenv(name, value)
    yield set_run
    assert not dist.is_initialized()  # whatever happened, no process group is left behind
    monkeypatch.undo()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _batches(steps: int):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)) for _ in range(steps)]


def _reference(steps: int) -> tuple[torch.Tensor, int]:
    """torch's SGD on the same batches, clipped to CLIP, at the warm-up's lr; final weights, steps clipped."""
    return clipped_warmup_sgd(_model(), _batches(steps), lr=LR, momentum=MOMENTUM, clip=CLIP, warmup=WARMUP)


@pytest.mark.parametrize("mode", ["ddp", "zero1"])
def test_a_lone_rank_steps_the_runs_optimizer_clip_and_schedule_and_writes_its_record(mode, run_env, tmp_path):
    run_env(mode, clip_grad_norm=CLIP, warmup_steps=WARMUP)
    net, steps = _model(), 5
    files = RecordFiles(record=tmp_path / "worker-0.json", params=tmp_path / "params.pt")
    # psrv.Worker's defaults, given explicitly, change nothing; the clip given is the run's
    with psrv.make_worker(net, overlap=True, compress="", clip_grad_norm=CLIP, step_log=StepLog(files)) as ps:
        assert type(ps).__name__ == "AllReduceWorker" and dist.is_initialized()
        infos = []
        for x, y in _batches(steps):
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            infos.append(ps.step(loss=loss, batch_size=len(x)))
    want, clipped = _reference(steps)
    assert clipped > 0                                                   # the clip bit, so it is tested
    final = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    torch.testing.assert_close(final, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(torch.load(files.params), final, rtol=0, atol=0)
    assert [(i.step, i.clock, i.version, i.staleness) for i in infos] == [(k, k + 1, k + 1, 0) for k in range(steps)]
    assert all(p.grad is not None and not p.grad.any() for p in net.parameters())  # step() zeroed them
    record = json.loads(files.record.read_text())
    assert (record["mode"], record["backend"], record["world_size"], record["job"]) == (mode, "gloo", 1, None)
    assert (record["pushes"], record["updates_applied"], record["steps"], record["batch_size"]) == (steps, steps,
                                                                                                   steps, 16)
    assert "staleness" not in record["step_log"][0] and "interrupted" not in record


def test_an_error_inside_the_block_writes_what_ran_marked_interrupted_and_no_weights(run_env, tmp_path):
    run_env()
    net = _model()
    files = RecordFiles(record=tmp_path / "worker-0.json", params=tmp_path / "params.pt")
    with pytest.raises(RuntimeError, match="the loop fails"):
        with psrv.make_worker(net, step_log=StepLog(files)) as ps:
            x, y = _batches(1)[0]
            torch.nn.functional.mse_loss(net(x), y).backward()
            ps.step()
            raise RuntimeError("the loop fails")
    record = json.loads(files.record.read_text())
    assert (record["interrupted"], record["steps_done"]) == (True, 1) and not files.params.exists()
    with pytest.raises(RuntimeError, match="has ended"):
        ps.step()


# A fresh interpreter (this process has long imported what matters): one rank steps, closes, and lists the
# threads left. gloo's outliving destroy_process_group into the interpreter's exit aborted zero1 ranks
# ("terminate called without an active exception"; psrv/client/collective.py init_group says why).
_GLOO_THREADS_AFTER_CLOSE = """
import json, os, sys, torch
import psrv
from psrv.config import RunConfig, from_dict
from psrv.workers.allreduce.loop import train_allreduce
def gloo():
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    return sorted(n for n in names if "gloo" in n or "tcpstore" in n)
left = {}
for mode in ("ddp", "zero1"):
    os.environ["PSRV_MODE"] = mode
    os.environ["PSRV_CONFIG"] = sys.argv[1] + "/" + mode + ".json"
    net = torch.nn.Linear(3, 2)
    with psrv.make_worker(net) as ps:
        net(torch.randn(4, 3)).sum().backward()
        ps.step()
    left["psrv.make_worker " + mode] = gloo()
    del os.environ["PSRV_MODE"]
    cfg = from_dict(RunConfig, {"mode": mode, "cluster": {"workers": 1}, "job": {"name": "digits_mlp", "steps": 1}})
    train_allreduce(cfg, backend="gloo")
    left["shipped loop " + mode] = gloo()
print(json.dumps(left))
"""


def test_no_gloo_thread_outlives_the_group_in_a_fresh_interpreter(tmp_path):
    for mode in ("ddp", "zero1"):
        (tmp_path / f"{mode}.json").write_text(json.dumps(to_dict(from_dict(RunConfig, {"mode": mode}))))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "PSRV_RECORD")}
    proc = subprocess.run([sys.executable, "-c", _GLOO_THREADS_AFTER_CLOSE, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={**env, "RANK": "0", "WORLD_SIZE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    left = json.loads(proc.stdout.strip().splitlines()[-1])
    assert left == {f"{where} {mode}": [] for mode in ("ddp", "zero1")
                    for where in ("psrv.make_worker", "shipped loop")}


@pytest.mark.parametrize("setup, keywords, says", [
    ({}, {"compress": "topk:0.1"}, r"psrv.make_worker\(compress=...\): a parameter-server option, and mode 'ddp' "
                                   r"all-reduces the gradients among the ranks, with no shards; remove it"),
    ({}, {"local_steps": 4}, r"psrv.make_worker\(local_steps=...\): a parameter-server option"),
    ({}, {"servers": ["tcp://127.0.0.1:1"]}, r"psrv.make_worker\(servers=...\): a parameter-server option"),
    ({"clip_grad_norm": CLIP}, {"clip_grad_norm": 2.0}, r"clip_grad_norm=2, but the run clips by 0.5"),
    ({"mode": "fsdp"}, {}, r"mode 'fsdp' does not run a psrv.Worker loop: fully_shard would turn"),
    ({"config_mode": "sync"}, {}, r"PSRV_MODE is 'ddp' but PSRV_CONFIG .* is a 'sync' run's; they must agree"),
    ({"world_size": 2}, {}, r"WORLD_SIZE > 1 under an all-reduce mode needs MASTER_ADDR and MASTER_PORT"),
], ids=["compress", "local_steps", "servers", "clip", "fsdp", "modes-differ", "no-rendezvous"])
def test_what_the_all_reduce_worker_cannot_do_is_refused_in_one_line(setup, keywords, says, run_env):
    run_env(**setup)
    with pytest.raises(ValueError, match=says):
        psrv.make_worker(_model(), **keywords)


def test_an_all_reduce_mode_without_the_runs_config_is_refused(run_env, monkeypatch):
    run_env()
    monkeypatch.delenv("PSRV_CONFIG")
    with pytest.raises(ValueError, match=r"under PSRV_MODE=ddp: set PSRV_CONFIG to the run's config.json"):
        psrv.make_worker(_model())
    monkeypatch.setenv("PSRV_CONFIG", "/nonexistent/config.json")
    with pytest.raises(ValueError, match=r"PSRV_CONFIG /nonexistent/config.json: No such file"):
        psrv.make_worker(_model())


@pytest.mark.parametrize("mode", [None, "sync"])
def test_without_an_all_reduce_run_psrv_worker_is_the_parameter_server_worker_as_before(mode, monkeypatch):
    for name in ("PSRV_MODE", "PSRV_SERVERS", "PSRV_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    if mode:
        monkeypatch.setenv("PSRV_MODE", mode)
    with pytest.raises(ValueError, match="set PSRV_SERVERS in the environment"):
        psrv.make_worker(_model(), rank=0, world_size=1)


@pytest.mark.parametrize("mode", ["ddp", "zero1"])
def test_psrv_worker_is_one_class_refused_under_an_all_reduce_run_naming_the_factory(mode, run_env):
    run_env(mode)
    with pytest.raises(ValueError, match=rf"psrv.Worker is the parameter-server worker, and this run all-reduces "
                                         rf"\(PSRV_MODE={mode}\): call psrv.make_worker\(model\)"):
        psrv.Worker(_model())
    with psrv.make_worker(_model()) as ps:
        assert type(ps) is psrv.AllReduceWorker and ps.mode == mode
    assert psrv.Worker.__new__ is object.__new__  # no class swapped in behind the call


def test_make_worker_outside_an_all_reduce_run_is_psrv_worker(monkeypatch):
    """No PSRV_MODE: psrv.make_worker(...) is psrv.Worker(...) with the same keywords (here refused the same
    way: a bad keyword's TypeError, then a local_steps of 0), and takes psrv.Worker's signature."""
    monkeypatch.delenv("PSRV_MODE", raising=False)
    monkeypatch.delenv("PSRV_CONFIG", raising=False)
    import inspect
    assert inspect.signature(psrv.make_worker) == inspect.signature(psrv.Worker)
    for call in (psrv.Worker, psrv.make_worker):
        with pytest.raises(TypeError, match="no_such_keyword"):
            call(_model(), ["tcp://127.0.0.1:9"], rank=0, world_size=1, no_such_keyword=1)
        with pytest.raises(ValueError, match="local_steps"):
            call(_model(), ["tcp://127.0.0.1:9"], rank=0, world_size=1, local_steps=0)
