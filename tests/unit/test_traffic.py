"""The placement measurements: a process's TCP bytes as the kernel counts them (ss), the busiest process's
bytes per training step from a run's samples and step logs, and a variant whose device is absent skipped
with a note rather than dropped."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from psrv.experiments.harness.report_traffic import skipped_lines
from psrv.experiments.harness.runner import _absent_devices
from psrv.experiments.harness.spec import spec_from_dict
from psrv.experiments.harness.traffic import busiest, per_step


# The exchange runs in a process of its own: the pytest process may hold other tests' sockets (a thread still
# sending on one in a run under load counted 34,518 bytes more than the exchange, 2026-12-04).
EXCHANGE = """
import json, os, socket
from psrv.experiments.harness.traffic import socket_bytes
server = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(server.getsockname())
peer, _ = server.accept()
before = socket_bytes()[os.getpid()]
client.sendall(b"x" * 100_000)
got = 0
while got < 100_000:
    got += len(peer.recv(1 << 20))
peer.sendall(b"y" * 7_000)
back = 0
while back < 7_000:
    back += len(client.recv(1 << 20))
after = socket_bytes()[os.getpid()]
print(json.dumps([after[0] - before[0], after[1] - before[1]]))
"""


@pytest.mark.skipif(shutil.which("ss") is None, reason="ss (iproute2) is not installed here")
def test_socket_bytes_are_what_this_process_sent_and_received() -> None:
    done = subprocess.run([sys.executable, "-c", EXCHANGE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # both ends are the process's: it sent what it received, 100,000 bytes one way and 7,000 back
    assert json.loads(done.stdout) == [107_000, 107_000]


def _run(path: Path, samples: list[tuple[float, dict]], *, workers: int = 2, steps: int = 10) -> Path:
    """A run whose workers finish step k at time 100 + k, sampled at the given (time, bytes) points."""
    path.mkdir(parents=True)
    for w in range(workers):
        rows = [{"wall_time": 100.0 + k + 0.1 * w} for k in range(1, steps + 1)]
        (path / f"worker-{w}.json").write_text(json.dumps({"step_log": rows}))
    (path / "traffic.json").write_text(json.dumps({"method": "test", "samples": [
        {"time": t, "bytes": b} for t, b in samples]}))
    (path / "summary.json").write_text(json.dumps({"steps": steps}))
    return path


def test_bytes_per_step_is_the_rate_over_the_samples_taken_while_every_worker_trained(tmp_path: Path) -> None:
    # the start (10 MB before every worker trained) and the end are left out; 3 KB out, 2 KB in per step
    run = _run(tmp_path / "r", [(100.5, {"server-0": (10_000_000, 10_000_000)}),   # before any step: ignored
                                (103.5, {"server-0": (10_006_000, 10_004_000), "worker-0": (10, 10)}),
                                (109.5, {"server-0": (10_024_000, 10_016_000), "worker-0": (20, 30)}),
                                # after worker 0's last step its socket closed: ss no longer counts it
                                (110.5, {"server-0": (5_000_000, 5_000_000)})])
    (run / "server-0.json").write_text(json.dumps({"bytes_in": 40_000, "bytes_out": 60_000}))
    rates = per_step(run)
    assert rates["server-0"] == {"out": 3000.0, "in": 2000.0}  # 18,000 and 12,000 bytes over 6 steps
    top = busiest(run)
    assert (top["process"], top["in"], top["out"]) == ("server-0", 2000.0, 3000.0)
    assert top["own_count"] == 10_000.0  # the server's own count: 100,000 bytes over 10 steps


def test_an_allreduce_run_reports_its_busiest_rank_and_too_few_samples_none(tmp_path: Path) -> None:
    run = _run(tmp_path / "r", [(102.5, {"worker-0": (0, 0), "worker-1": (0, 0)}),
                                (104.5, {"worker-0": (200, 100), "worker-1": (300, 300)})])
    top = busiest(run)
    assert (top["process"], top["in"], top["out"]) == ("worker-1", 150.0, 150.0) and "own_count" not in top
    one = _run(tmp_path / "one", [(104.5, {"worker-0": (200, 100)})])
    assert busiest(one) is None  # one sample gives no rate: not measured, not made up


def test_a_variant_on_an_absent_device_is_skipped_with_its_reason(tmp_path: Path) -> None:
    raw = {"name": "p", "target": {"eval_loss": 1.0}, "cluster": {"servers": 1},
           "variants": [{"name": "cpu", "mode": "sync"}, {"name": "gpu", "mode": "sync", "cluster": {"device": "cuda:99"}}]}
    skipped = _absent_devices(spec_from_dict(raw), "p.toml")
    assert list(skipped) == ["gpu"] and "cuda:99" in skipped["gpu"]
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "skipped.txt").write_text(skipped["gpu"])
    [_, _, note, _] = skipped_lines(tmp_path, spec_from_dict(raw))
    assert note.startswith("- `gpu` was skipped here: its device is not on this machine") and "cuda:99" in note
    raw["variants"] = raw["variants"][1:]
    with pytest.raises(ValueError, match="no variant can run here"):
        _absent_devices(spec_from_dict(raw), "p.toml")


def test_the_placement_spec_runs_the_three_architectures_at_2_4_and_8_workers() -> None:
    from psrv.experiments.harness.plots.traffic import architecture
    from psrv.experiments.harness.spec import load_spec
    spec = load_spec(Path(__file__).resolve().parents[2] / "experiments" / "specs" / "placement.toml")
    assert spec.repeats >= 3
    found = {(architecture(v.config), v.config.cluster.workers) for v in spec.variants}
    kinds = {"1 server on cpu (sync)", "4 servers on cpu (sync)", "1 server on cuda:0 (sync)", "ddp all-reduce (per rank)"}
    assert found == {(kind, n) for kind in kinds for n in (2, 4, 8)}


def test_the_traffic_plot_draws_one_line_per_variant_and_joins_only_a_worker_count_sweep(tmp_path, monkeypatch):
    """Variants that differ only in the number of workers (placement.toml's cpu-1server-2w, -4w, -8w) are
    one setting's points and make one line; a variant that differs in anything else (here a codec) is a
    line of its own, though it shares the architecture '1 server on cpu (sync)'."""
    from matplotlib.axes import Axes

    from psrv.experiments.harness.collect import Stat, VariantSummary
    from psrv.experiments.harness.plots.traffic import plot_traffic
    spec = spec_from_dict({"name": "t", "target": {"eval_loss": 1.0}, "cluster": {"servers": 1}, "variants": [
        {"name": "dense-2w", "mode": "sync", "cluster": {"workers": 2}},
        {"name": "dense-4w", "mode": "sync", "cluster": {"workers": 4}},
        {"name": "topk-2w", "mode": "sync", "cluster": {"workers": 2}, "worker": {"compress": "topk:0.01"}},
        {"name": "topk-4w", "mode": "sync", "cluster": {"workers": 4}, "worker": {"compress": "topk:0.01"}},
        {"name": "ddp-2w", "mode": "ddp", "cluster": {"workers": 2}}]})
    kib = {"dense-2w": 75, "dense-4w": 150, "topk-2w": 40, "topk-4w": 80, "ddp-2w": 38}
    summaries = [VariantSummary(variant=name, mode="sync", staleness=None, repeats=1, target_reached=1,
                                stats={"busiest_bytes_in_per_step": Stat(1024.0 * k, None),
                                       "busiest_bytes_out_per_step": Stat(1024.0 * k, None),
                                       "seconds_per_step": Stat(0.01, None)}) for name, k in kib.items()]
    drawn = []  # (label, x, y) of each line on the first panel (bytes in)
    real = Axes.errorbar
    monkeypatch.setattr(Axes, "errorbar", lambda ax, x, y, *a, **k: drawn.append((k.get("label"), list(x), list(y)))
                        or real(ax, x, y, *a, **k))
    assert plot_traffic(tmp_path / "traffic.png", spec, summaries)
    lines = {label: (x, y) for label, x, y in drawn[:len(drawn) // 3]}
    assert sorted(lines.values()) == sorted([([2], [38.0]), ([2, 4], [75.0, 150.0]), ([2, 4], [40.0, 80.0])]), lines
    assert any("dense" in label for label in lines) and any("topk" in label for label in lines), lines
