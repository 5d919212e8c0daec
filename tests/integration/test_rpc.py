"""The torch RPC transport behind the same service: two workers under ssp over `psrv run --transport rpc`,
and a clear error (never a hang) when the RPC world is wrong. Every mode's weights over RPC against zmq's
and the reference's: tests/conformance/test_matrix.py's RPC cases."""
import csv
import json
import os
import signal
import subprocess
import sys

import pytest

from psrv.experiments.launcher.cluster import free_port
from tests.helpers import ROOT, psrv_argv

rpc = pytest.importorskip("torch.distributed.rpc")
pytestmark = pytest.mark.skipif(not rpc.is_available(), reason="this torch build has no torch.distributed.rpc")

STEPS = 40


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run argv in its own process group; on overrun the whole group (servers, workers) is killed."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(argv[2:6])}... still running after {timeout}s:\n{out[-2000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def psrv_run(out, *args: str, timeout: float = 150.0) -> dict:
    p = _run(psrv_argv("run", "--no-progress", "--log-level", "WARNING", "--out", str(out), *args), timeout)
    assert p.returncode == 0, f"psrv run failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    return json.loads((out / "summary.json").read_text())


def accuracy_first_last(out) -> tuple[float, float]:
    with open(out / "evals.csv") as f:
        rows = list(csv.DictReader(f))
    return float(rows[0]["eval_accuracy"]), float(rows[-1]["eval_accuracy"])


def _args(mode: str) -> list[str]:
    # ssp also carries compressed pushes: the codec's parts as a list of tensors (psrv/codecs)
    extra = ["--staleness", "1", "--compress", "topk:0.1", "--compress-min-numel", "0",
             "--compress-warmup", "0"] if mode == "ssp" else []
    return ["--mode", mode, "--servers", "2", "--workers", "2", "--steps", str(STEPS), *extra]


@pytest.mark.timeout(180)
def test_two_workers_learn_under_ssp_over_rpc_within_the_bound(tmp_path):
    """Two free-running workers over RPC, compressed pushes among them: each push applied once, the clock
    gap within the bound, and the job learns. (Each mode's weights over RPC, bit for bit those over zmq
    and the reference's, are tests/conformance's RPC cases.)"""
    s = psrv_run(tmp_path, "--transport", "rpc", *_args("ssp"))
    assert s["transport"] == "rpc" and s["num_servers"] == 2 and s["num_workers"] == 2
    assert s["compress"] == "topk:0.1" and 4.5 < s["compression_ratio"] < 5, s
    assert s["updates_applied"] == s["pushes"] == 2 * STEPS, s  # one update per push
    assert s["max_clock_gap"] <= 1, s
    first, last = accuracy_first_last(tmp_path)
    assert last > first + 0.2, (first, last)
    assert s["final_loss"] < s["initial_loss"]


@pytest.mark.timeout(120)
def test_a_world_size_mismatch_fails_fast_on_both_sides(tmp_path):
    master = f"127.0.0.1:{free_port()}"
    server = subprocess.Popen(psrv_argv("serve", "--transport", "rpc", "--rpc-master", master, "--num-shards", "1",
                                        "--workers", "1"), cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        worker = _run(psrv_argv("worker", "--transport", "rpc", "--servers", f"rpc://{master}/server-0",
                                "--rank", "0", "--world-size", "2", "--steps", "1"), timeout=90)
        out, _ = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert worker.returncode == 2 and "RPC world mismatch" in worker.stderr, worker.stderr[-2000:]
    assert "--world-size" in worker.stderr
    assert server.returncode == 2 and "RPC world mismatch" in out, out[-2000:]


LONE = """
import sys, time
from psrv.transport.torch_rpc import RpcClient, RpcServer
t0 = time.monotonic()
try:
    if sys.argv[1] == "server":
        RpcServer("rpc://" + sys.argv[2], num_shards=1, workers=1, init_timeout=3).recv(0.1)
    else:
        RpcClient(["rpc://%s/server-0" % sys.argv[2]], worker=0, world_size=1, init_timeout=3)
except Exception as exc:
    print(type(exc).__name__, exc, "after %.1fs" % (time.monotonic() - t0))
"""


@pytest.mark.timeout(120)
def test_a_missing_peer_is_a_clear_timeout_not_a_hang(tmp_path):
    lone = [subprocess.Popen([sys.executable, "-c", LONE, role, f"127.0.0.1:{free_port()}"], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
            for role in ("server", "worker")]
    try:
        (server, _), (worker, _) = (p.communicate(timeout=90) for p in lone)
    finally:
        for p in lone:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    # shard 0 hosts the rendezvous and names who never came; a worker without a master says where it looked
    assert "TimeoutError" in server and "only 1 of 2" in server and "missing: worker-0" in server, server
    assert "TimeoutError" in worker and "no RPC rendezvous at 127.0.0.1:" in worker, worker
    for text in (server, worker):
        assert float(text.rsplit("after ", 1)[1].split("s")[0]) < 30, text
