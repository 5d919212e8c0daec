"""psrv run --replicas (experiments/launcher/replication.py): a sync run whose primary is SIGKILLed in the middle
(--kill-server) finishes, its backup having taken over, with exactly the weights of the same run without
the kill. Sync's math is the same only if every acknowledged update survived and none was applied twice:
one lost clock moves the weights by about lr * |g|, orders of magnitude above float rounding. The run
without the kill is the same config run in threads (tests/threaded_run.py: the same shards and loop)."""
from __future__ import annotations

import json

import pytest
import torch

from psrv.config import ConfigError, RunConfig, ServerConfig, from_dict
from psrv.experiments.launcher.launch import run_local
from psrv.experiments.launcher.summary import format_summary
from tests.threaded_run import run_in_threads

STEPS = 80


def _config(**more) -> RunConfig:
    return from_dict(RunConfig, {"mode": "sync", "cluster": {"servers": 1, "workers": 2, **more.pop("cluster", {})},
                                 "job": {"name": "digits_mlp", "steps": STEPS}, "faults": {"compute_ms": 20.0},
                                 "optimizer": {"name": "sgd", "momentum": 0.9}, **more})


@pytest.mark.parametrize("transport,servers", [("zmq", 1), ("rpc", 2)])
def test_a_killed_primary_loses_nothing_the_run_ends_with_the_weights_of_the_run_without_the_kill(
        tmp_path, transport, servers):
    """Over torch RPC with two shards: the backups are members of the RPC world (backup-0-1, backup-1-1), the
    stream and the workers' re-sent requests travel as RPCs, and shard 1 keeps its primary. The run without
    the kill is the zmq one: a transport moves bytes, so the weights are the same bit for bit."""
    cluster = {"servers": servers}
    summary = run_local(_config(cluster={**cluster, "replicas": 1, "transport": transport}, kill={"server": "0:30"}),
                        out=tmp_path / "killed", progress=False, timeout=180)
    (tmp_path / "plain").mkdir()
    run_in_threads(_config(cluster=cluster), tmp_path / "plain")

    [kill] = summary["faults"]["kills"]
    assert kill["process"] == "server-0" and kill["killed"] and 30 <= kill["step"] < STEPS
    [failover] = summary["replication"]["failovers"]
    assert failover["shard"] == 0 and failover["epoch"] == 2 and failover["version"] >= kill["step"] - 1
    assert summary["complete"] and summary["updates_applied"] == STEPS and summary["faults"]["restarts"] == []
    [dead] = summary["faults"]["dead_replicas"]  # a new backup started in its place, to follow the new primary;
    # none over torch RPC, whose world is fixed when it forms
    assert dead["process"] == "server-0" and dead["replaced_by"] == ("backup-0-2" if transport == "zmq" else None)
    shard = json.loads((tmp_path / "killed" / "server-0.json").read_text())
    assert shard["took_over"] and shard["address"] == failover["new_primary"]
    killed, plain = (torch.load(tmp_path / run / "params.pt") for run in ("killed", "plain"))
    print(f"\nprimary killed at worker 0's step {kill['step']}; backup took over at version {failover['version']}; "
          f"max |difference| of the final weights: {(killed - plain).abs().max().item():g}")
    assert torch.equal(killed, plain)
    assert f"shard 0 to {failover['new_primary']} at epoch 2, version {failover['version']}" in format_summary(summary)


@pytest.mark.parametrize("more,message", [
    ({"checkpoints": {"every": 1.0}}, "cluster.replicas: and checkpoints.every are two ways"),
    ({"mode": "ddp"}, "cluster.replicas: replicates shards; mode 'ddp' has none"),
])
def test_replicas_refuse_what_they_do_not_support_in_one_line(more, message):
    cluster = {"replicas": 1, **more.pop("cluster", {})}
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        _config(cluster=cluster, **more)


@pytest.mark.parametrize("more,message", [
    ({"backup_of": "127.0.0.1:5555"}, "backup_of: "),
    ({"backup_of": "tcp://127.0.0.1:5555", "checkpoint_dir": "ckpt"}, "checkpoint_dir: with backup_of: a backup "
                                                                       "keeps no checkpoint"),
    ({"backup_of": "tcp://127.0.0.1:5555", "transport": "rpc", "bind": "rpc://127.0.0.1:5556"},
     "backup_of: with transport rpc: follow rpc://HOST:PORT/server-0"),
    ({"backup_of": "rpc://127.0.0.1:5555/server-0", "transport": "rpc", "bind": "rpc://127.0.0.1:5556"},
     r"bind: a backup joins its primary's RPC world, .* bind rpc://127.0.0.1:5555 \(psrv serve --rpc-master"),
    ({"backup_of": "rpc://127.0.0.1:5555/server-1", "transport": "rpc", "bind": "rpc://127.0.0.1:5555",
      "num_shards": 2}, "backup_of: a backup of shard 0 follows rpc://HOST:PORT/server-0"),
    ({"backup_of": "rpc://127.0.0.1:5555/server-0,rpc://127.0.0.1:5555/server-0", "transport": "rpc",
      "bind": "rpc://127.0.0.1:5555"}, "backup_of: over transport rpc a backup follows one primary"),
    ({"backup_of": "rpc://127.0.0.1:5555/server-0"}, "backup_of: an rpc:// primary is followed over transport rpc"),
    ({"rpc_backups": 1}, "rpc_backups: sizes a torch RPC world"),
    ({"backup_of": "tcp://127.0.0.1:5555"}, "witness: is needed with backup_of"),
])
def test_a_backup_refuses_what_it_cannot_follow_with_in_one_line(more, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(ServerConfig, {"workers": 2, **more})


@pytest.mark.timeout(90)
@pytest.mark.parametrize("victim", ["server-0", "backup-0-2"])
def test_a_replica_killed_before_the_workers_start_restarts_its_shard_and_the_run_finishes(tmp_path, victim):
    """One of shard 0's processes SIGKILLed as soon as it starts (importing torch; its backups not following yet):
    nothing was acknowledged, so the launcher starts the shard's replicas again, whole, with a fresh witness, and
    the run finishes with every step. Before, it waited 120 s for backups that could not follow and lost the run."""
    import os
    import signal
    import subprocess
    import time
    from tests.helpers import psrv_argv
    out = tmp_path / "run"
    proc = subprocess.Popen(psrv_argv("run", "--no-progress", "--mode", "async", "--servers", "1", "--replicas",
                                      "2", "--workers", "2", "--steps", "40", "--out", str(out)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline, killed = time.monotonic() + 60, None
        mark = f"{out}/{victim}.json"
        while killed is None and time.monotonic() < deadline:
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
                except OSError:
                    continue
                words = b" ".join(argv)  # a forked process's title is its command line in one piece (setproctitle)
                if mark.encode() in words or (victim.startswith("backup") and f"{out}/{victim}.addr".encode() in words):
                    os.kill(int(pid), signal.SIGKILL)
                    killed = int(pid)
                    break
            time.sleep(0.01)
        assert killed is not None, f"{victim} never started"
        output, _ = proc.communicate(timeout=80)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and summary["updates_applied"] == 2 * 40  # async: every push of both workers
    [restart] = [d for d in summary["faults"]["dead_replicas"] if d.get("before_workers")]
    assert restart["process"] == victim and restart["exit_code"] == -9
