"""`psrv simulate --against RUN_DIR`: the simulator's prediction of a real run made already, from the run's own
setting, compute and (on emulated hosts) bandwidth, with no latency fitted to the run."""
from __future__ import annotations

import csv
import json
import shutil
import statistics
from pathlib import Path

import pytest

from psrv.cli.main import main
from psrv.experiments.harness.collect import read_csv
from psrv.experiments.simulate.against import gbps, simulation_of, steady_rate
from tests.threaded_run import threaded_run


def test_rates_read_as_tc_reads_them() -> None:
    assert (gbps("200mbit"), gbps("1gbit"), gbps("500kbit")) == (0.2, 1.0, 0.0005)


def test_the_steady_rate_leaves_each_worker_s_first_step_out() -> None:
    rows = [{"worker": w, "wall_time": t, "batch_size": "32"} for w, t in
            (("0", "1.0"), ("1", "2.0"), ("0", "3.0"), ("1", "4.0"), ("0", "6.0"))]
    assert steady_rate(rows) == 3 * 32 / (6.0 - 2.0)  # from the slowest first step's end: 3 steps of 32 in 4 s
    assert steady_rate(rows[:2]) is None  # first steps only


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("against") / "run"
    threaded_run(out, "--job", "synthetic_mlp", "--mode", "sync", "--servers", "1", "--workers", "2", "--steps", "4",
                 "--optimizer", "sgd", "--lr", "0.05", "--compress", "sign", "--compress-pull", "sign", timeout=120)
    return out


def _capped(run_dir: Path, tmp_path: Path, rate: str) -> Path:
    """The same run's folder, its config saying it ran with each host's egress capped at `rate`."""
    copy = tmp_path / f"run-{rate}"
    shutil.copytree(run_dir, copy)
    cfg = json.loads((copy / "config.json").read_text())
    cfg["network"] = {"bandwidth": rate}
    (copy / "config.json").write_text(json.dumps(cfg))
    return copy


def test_the_setting_is_the_run_s_own(run_dir: Path, tmp_path: Path) -> None:
    cfg, dropped = simulation_of(_capped(run_dir, tmp_path, "200mbit"))
    assert (cfg.mode, cfg.cluster.workers, cfg.job.name, cfg.job.steps) == ("sync", 2, "synthetic_mlp", 4)
    assert (cfg.worker.compress, cfg.worker.compress_pull) == ("sign", "sign")
    assert cfg.simulate.bandwidth_gbps == 0.2 and cfg.simulate.compute == "steps.csv"
    assert cfg.simulate.level == "timing" and cfg.simulate.latency_ms == 0.1
    assert "network.bandwidth" in dropped and cfg.network.bandwidth == ""


def test_a_capped_run_is_predicted_slower_by_its_bytes(run_dir: Path, tmp_path: Path, capsys) -> None:
    """The same steps on 10 Gbit/s links and on 200 Mbit/s ones: only the links differ, so the slower prediction
    is the byte model's. Sign both ways moves about 2 x 1 MB a step per worker (8.4M parameters at a bit):
    at 25 MB/s that is tens of ms a step, against well under one at 10 Gbit/s."""
    fast = tmp_path / "fast"
    assert main(["simulate", "--against", str(run_dir), "--out", str(fast)]) == 0
    slow = tmp_path / "slow"
    assert main(["simulate", "--against", str(_capped(run_dir, tmp_path, "200mbit")), "--out", str(slow)]) == 0
    assert "steady samples/s: real" in capsys.readouterr().out
    got = {name: json.loads((d / "against.json").read_text())["steady_samples_per_second"]
           for name, d in (("fast", fast), ("slow", slow))}
    assert got["fast"]["real"] == got["slow"]["real"] == steady_rate(read_csv(run_dir / "steps.csv"))
    assert got["slow"]["simulated"] == steady_rate(read_csv(slow / "steps.csv"))
    per_step = {k: 64 / v["simulated"] for k, v in got.items()}  # 2 workers x 32 samples
    assert per_step["slow"] - per_step["fast"] > 0.02


def test_other_options_are_refused_with_against(run_dir: Path, tmp_path: Path, capsys) -> None:
    assert main(["simulate", "--against", str(run_dir), "--workers", "4", "--out", str(tmp_path / "x")]) == 2
    assert "--against: the run's config.json holds the setting" in capsys.readouterr().err
    assert main(["simulate", "--against", str(tmp_path), "--out", str(tmp_path / "y")]) == 2
    assert "not a finished run's folder" in capsys.readouterr().err


def test_the_codec_cost_is_charged_and_written_unless_off(run_dir: Path, tmp_path: Path, capsys) -> None:
    """Sign both ways: the codecs' measured ms go into against.json and the printout; --codec-cost off predicts
    from the bytes alone, faster."""
    got = {}
    for mode in ("measured", "off"):
        assert main(["simulate", "--against", str(run_dir), "--codec-cost", mode, "--out", str(tmp_path / mode)]) == 0
        got[mode] = json.loads((tmp_path / mode / "against.json").read_text())
    out = capsys.readouterr().out
    assert "codec cost (measured), ms per message" in out and "codec cost: off (bytes alone)" in out
    assert got["measured"]["codec_cost_ms"]["shard_pull"][0] > 0 and got["off"]["codec_cost_ms"]["shard_pull"] == [0.0]
    rates = {k: v["steady_samples_per_second"]["simulated"] for k, v in got.items()}
    assert rates["measured"] < rates["off"]


def test_a_run_with_kills_is_simulated_with_its_schedule_and_its_kills_named_beside_the_real_ones(
        run_dir: Path, tmp_path: Path, capsys) -> None:
    """The run's config as if made with `--nemesis "kill worker:1 at 0.01s" --restart-workers 1` and its nemesis's
    record of that kill: the simulation kills rank 1 at 0.01 s too, and with --goodput says what it cost."""
    copy = tmp_path / "killed"
    shutil.copytree(run_dir, copy)
    # Every step's compute made the run's median: the simulation replays each rank's steps by their index, and the
    # restarted rank 1 resumes at the shards' clock, never doing the step it was killed in. Where that step was
    # much slower than the others (a first step's warm-up, under load: a fresh-clone suite beside two busy loops
    # saw goodput 1.007), the killed run ends sooner than the clean one. The kill's cost is what is checked here.
    rows = read_csv(copy / "steps.csv")
    median = statistics.median(float(r["compute_seconds"]) for r in rows)
    with open(copy / "steps.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({**r, "compute_seconds": repr(median)} for r in rows)
    cfg = json.loads((copy / "config.json").read_text())
    cfg["nemesis"], cfg["restarts"] = {"schedule": "kill worker:1 at 0.01s"}, {"workers": 1}
    (copy / "config.json").write_text(json.dumps(cfg))
    (copy / "nemesis.jsonl").write_text(json.dumps({"ev": "fault", "id": 1, "kind": "kill", "target": "worker:1",
                                                    "at": "0.01s", "done": True}) + "\n")
    out = tmp_path / "sim"
    assert main(["simulate", "--against", str(copy), "--goodput", "--fail-down", "0.02", "--out", str(out)]) == 0
    got = json.loads((out / "against.json").read_text())
    assert got["kills"] == [{"t": 0.01, "rank": 1, "restarted": True}] and got["real_kills"] == [
        {"at": "0.01s", "rank": 1}]
    assert 0 < got["goodput_end_to_end"] < 1 and got["fail_down"] == {"seconds": 0.02, "from": "--fail-down"}
    assert "kills: simulated rank 1 at 0.01s; the real run's rank 1 at 0.01s" in capsys.readouterr().out


def test_the_restarts_seconds_are_read_from_the_runs_logs(tmp_path: Path) -> None:
    """Each from the new life's first log line to shard 0's takeover line for its rank; a life started after the
    takeover (a later restart) is not the one taken over."""
    from psrv.experiments.simulate.against import restart_seconds
    line = "2026-12-02 05:{} worker 6 INFO psrv.process: torch threads 1\n"
    (tmp_path / "worker-6.log.1").write_text(line.format("37:09,216"))  # the first life
    (tmp_path / "worker-6.log.2").write_text(line.format("38:49,208"))  # killed at 05:38:49
    (tmp_path / "worker-6.log").write_text(line.format("39:49,352"))    # killed again at 05:39:49
    (tmp_path / "worker-2.log").write_text(line.format("37:09,100"))
    (tmp_path / "server-0.log").write_text(
        "2026-12-02 05:37:08,845 server 0 INFO psrv.server: shard 0/1 serving sync\n"
        "2026-12-02 05:38:52,420 server 0 INFO psrv.server: shard 0: a new process takes rank 6 over (the previous "
        "one died, its launcher says)\n"
        "2026-12-02 05:39:55,257 server 0 INFO psrv.server: shard 0: a new process takes rank 6 over (the previous "
        "one died, its launcher says)\n")
    assert restart_seconds(tmp_path) == pytest.approx([3.212, 5.905])
    (tmp_path / "server-0.log").write_text("")
    assert restart_seconds(tmp_path) == []


def test_a_kill_run_whose_logs_hold_no_restart_asks_for_fail_down(run_dir: Path, tmp_path: Path, capsys) -> None:
    copy = tmp_path / "killed"
    shutil.copytree(run_dir, copy)
    cfg = json.loads((copy / "config.json").read_text())
    cfg["nemesis"], cfg["restarts"] = {"schedule": "kill worker:1 at 0.01s"}, {"workers": 1}
    (copy / "config.json").write_text(json.dumps(cfg))
    assert main(["simulate", "--against", str(copy), "--out", str(tmp_path / "sim")]) == 2
    assert "its kills' restarts are not in its logs" in capsys.readouterr().err
