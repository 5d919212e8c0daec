"""psrv simulate: the controllers' invariants, read back from what the simulation recorded, and the
learning level against single-process big-batch SGD (psrv's sync reference)."""
import csv
import json
import logging

import pytest
import torch

import psrv.experiments.simulate.cluster as cluster_module
from psrv.experiments.simulate.config import SimulationConfig
from psrv.experiments.simulate.run import simulate
from psrv.cli import main
from psrv.config import ConfigError, from_dict
from psrv.server.consistency import Decision
from tests.integration.test_sync_reference import BATCH, LR, MOMENTUM, STEPS, WORKERS, big_batch_sgd


def sim(tmp_path=None, **tree) -> dict:
    data = {"job": {"steps": 60}, "faults": {"compute_ms": 20.0}, **tree}
    return simulate(from_dict(SimulationConfig, data), out=tmp_path)


def steps_rows(path) -> list[dict]:
    with open(path / "steps.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_ssp_never_exceeds_its_bound_and_reaches_it(tmp_path):
    stragglers = {"compute_ms": 20.0, "transient_stragglers": "0.2:4"}
    ssp = sim(tmp_path, mode="ssp", staleness=2, cluster={"workers": 8, "servers": 2}, faults=stragglers)
    gaps = {int(k) for k in ssp["clock_gap_histogram"]}
    assert max(gaps) == ssp["max_clock_gap"] == 2      # held at the bound, never past it
    asynchronous = sim(mode="async", cluster={"workers": 8, "servers": 2}, faults=stragglers)
    assert asynchronous["max_clock_gap"] > 2           # the same stragglers unbounded
    assert ssp["wait_fraction"] > asynchronous["wait_fraction"] == 0.0


def test_sync_has_staleness_zero_and_one_update_per_clock(tmp_path):
    s = sim(tmp_path, mode="sync", cluster={"workers": 4, "servers": 3},
            faults={"compute_ms": 20.0, "transient_stragglers": "0.2:4"})
    assert s["staleness_histogram"] == {"0": 4 * 60} and s["max_clock_gap"] == 0
    assert s["updates_applied_per_shard"] == [60, 60, 60] and s["dropped"] == 0
    assert s["wait_fraction"] > 0.1                    # everyone waits for each clock's straggler
    assert {r["staleness"] for r in steps_rows(tmp_path)} == {"0"}


def test_backup_workers_close_clocks_without_the_straggler():
    stragglers = {"compute_ms": 20.0, "transient_stragglers": "0.2:4"}
    plain = sim(mode="sync", cluster={"workers": 4, "servers": 1}, faults=stragglers)
    backup = sim(mode="sync", backup_workers=1, cluster={"workers": 4, "servers": 1}, faults=stragglers)
    # a late gradient is dropped and its worker goes on at the open clock, so clocks close faster
    assert backup["dropped"] > 0 and backup["updates_applied"] > plain["updates_applied"] == 60
    assert backup["max_staleness"] == 0 and backup["samples_per_second"] > plain["samples_per_second"]


@pytest.mark.parametrize("workers", [4, 16])
def test_async_staleness_is_about_n_minus_1_at_equal_speeds(workers):
    s = sim(mode="async", cluster={"workers": workers, "servers": 2})
    assert s["mean_staleness"] == pytest.approx(workers - 1, abs=0.2)
    assert s["max_staleness"] == workers - 1


def test_constant_compute_gives_its_throughput():
    s = sim(mode="async", cluster={"workers": 4, "servers": 1}, simulate={"model_ms": 0.0, "latency_ms": 0.0})
    one_step = 0.020 + 2 * s["message_bytes"][0] / 1.25e9   # compute, then a push and its reply at 10 Gbit/s
    assert s["samples_per_second"] == pytest.approx(4 * 32 / one_step, rel=0.01)


def test_sync_learning_equals_single_process_big_batch_sgd(tmp_path):
    s = sim(tmp_path, mode="sync", cluster={"workers": WORKERS, "servers": 2},
            job={"steps": STEPS, "batch_size": BATCH}, optimizer={"lr": LR, "momentum": MOMENTUM},
            simulate={"level": "learning"})
    torch.testing.assert_close(torch.load(tmp_path / "params.pt"), big_batch_sgd(), rtol=0, atol=1e-5)
    assert s["final_loss"] < s["initial_loss"] and s["simulated"] is True


def test_the_command_writes_a_run_folder_marked_simulated(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["simulate", "--mode", "ssp", "--workers", "3", "--servers", "2", "--steps", "20",
                 "--compute", "lognormal", "--sample-workers", "2", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["simulated"] is True and summary["pushes"] == 60
    assert {r["worker"] for r in steps_rows(out)} == {"0", "1"}    # the sampled workers only
    assert (out / "plots" / "staleness.png").stat().st_size > 0
    assert "simulated" in capsys.readouterr().out


def test_what_is_not_simulated_is_refused():
    with pytest.raises(ConfigError, match="mode"):
        from_dict(SimulationConfig, {"mode": "ddp"})
    with pytest.raises(ConfigError, match="not simulated"):
        from_dict(SimulationConfig, {"cluster": {"transport": "rpc"}})
    with pytest.raises(ConfigError, match="compute_csv"):
        from_dict(SimulationConfig, {"simulate": {"compute": "steps.csv"}})


def test_a_scripts_run_is_refused_in_one_line_never_simulated_as_the_default_job(tmp_path, capsys):
    """A script's config.json also names the default job (digits_mlp); simulating that would answer for
    another model without a word."""
    from psrv.config import RunConfig, to_dict
    run = tmp_path / "run"
    run.mkdir()
    cfg = from_dict(RunConfig, {"mode": "async", "job": {"script": "train.py", "script_sha256": "0" * 64}})
    (run / "config.json").write_text(json.dumps(to_dict(cfg)))
    (run / "steps.csv").write_text("wall_time,worker,step,loss,staleness,compute_seconds,communication_seconds,"
                                   "wait_seconds,batch_size,pushed\n1.0,0,0,1.0,0,0.01,0.01,0.0,32,True\n")
    for args, says in ((["--config", str(run / "config.json"), "--workers", "512"], "train.py is a script's run"),
                       (["--against", str(run)], "a script's run whose records hold no param_shapes")):
        assert main(["simulate", *args, "--out", str(tmp_path / "sim")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "sim" / "summary.json").exists()
    with pytest.raises(ValueError, match="train.py is a script's run"):  # the library's own guard
        simulate(from_dict(SimulationConfig, {"job": {"script": "train.py"}}))


def test_a_simulation_spec_runs_every_variant_at_every_n(tmp_path):
    spec = tmp_path / "simulate_tiny.toml"
    spec.write_text('name = "tiny"\nworkers = [4, 8]\n[job]\nsteps = 10\n[cluster]\nservers = 2\n'
                    '[faults]\ncompute_ms = 20.0\n[simulate]\ncompute = "lognormal"\n'
                    '[[variants]]\nname = "sync-b"\nmode = "sync"\nbackup_fraction = 0.25\n'
                    '[[variants]]\nname = "ssp-1"\nmode = "ssp"\nstaleness = 1\n')
    assert main(["simulate", "--spec", str(spec), "--out", str(tmp_path / "out")]) == 0
    with open(tmp_path / "out" / "summary.csv", newline="") as f:
        rows = {(r["variant"], r["workers"]): r for r in csv.DictReader(f)}
    assert set(rows) == {("sync-b", "4"), ("sync-b", "8"), ("ssp-1", "4"), ("ssp-1", "8")}
    assert [rows["sync-b", n]["backup_workers"] for n in ("4", "8")] == ["1", "2"]
    assert max(int(rows["ssp-1", n]["max_clock_gap"]) for n in ("4", "8")) == 1
    assert "(simulated)" in (tmp_path / "out" / "report.md").read_text()
    summary = json.loads((tmp_path / "out" / "ssp-1" / "N-8" / "summary.json").read_text())
    assert summary["simulated"] is True and summary["num_workers"] == 8


def test_a_quorum_fraction_follows_n_and_goodput_gets_its_table(tmp_path):
    spec = tmp_path / "simulate_quorum.toml"
    spec.write_text('name = "q"\nworkers = [4, 10]\n[job]\nsteps = 10\n[faults]\ncompute_ms = 20.0\n'
                    '[simulate]\ngoodput = true\n'
                    '[[variants]]\nname = "q75"\nmode = "sync"\nquorum_fraction = 0.75\n'
                    '[[variants]]\nname = "async-straggler"\nmode = "async"\nfaults = { straggler = "0:4" }\n')
    assert main(["simulate", "--spec", str(spec), "--out", str(tmp_path / "out")]) == 0
    assert [json.loads((tmp_path / "out" / "q75" / f"N-{n}" / "summary.json").read_text())["quorum"]
            for n in (4, 10)] == [3, 8]  # round(0.75 x N)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## goodput while every rank ran" in report and "## goodput end to end" in report
    assert (tmp_path / "out" / "plots" / "goodput.png").exists()
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "b"\nworkers = [4]\n[[variants]]\nname = "q"\nmode = "sync"\nquorum_fraction = 1.5\n')
    from psrv.experiments.simulate.sweep import load
    with pytest.raises(ValueError, match="quorum_fraction must be in"):
        load(bad)


def test_the_shipped_simulation_spec_loads():
    from pathlib import Path

    from psrv.experiments.simulate.sweep import load
    spec = Path(__file__).resolve().parents[2] / "experiments" / "specs" / "simulate_ssp_backup.toml"
    header, runs = load(spec)
    assert header["workers"] == [16, 64, 256, 1024] and len(runs) == 7 * 4
    assert {cfg.simulate.compute for _, _, cfg in runs} == {"lognormal"}
    assert {(name, cfg.backup_workers) for name, n, cfg in runs if n == 1024 and cfg.mode == "sync"} == \
        {("sync", 0), ("sync-backup-5pct", 51), ("sync-backup-20pct", 204)}


def test_the_shipped_scale_spec_loads_with_a_quorum_of_three_quarters():
    from pathlib import Path

    from psrv.experiments.simulate.sweep import load
    spec = Path(__file__).resolve().parents[2] / "experiments" / "specs" / "simulate_scale.toml"
    header, runs = load(spec)
    assert header["workers"] == [1000, 10000, 100000] and len(runs) == 5 * 3
    assert {n: cfg.quorum for name, n, cfg in runs if name == "quorum75"} == {1000: 750, 10000: 7500, 100000: 75000}
    assert {cfg.hierarchy.regions for name, _, cfg in runs if name == "regions10"} == {10}
    assert all(cfg.simulate.goodput and cfg.faults.transient_stragglers for _, _, cfg in runs)


class _CountingController:
    """A controller as the simulator made it, counting its own DROP decisions (the recount)."""

    def __init__(self, inner, drops: list[int]):
        self._inner, self._drops, self._shard = inner, drops, len(drops)
        drops.append(0)

    def push(self, worker, clock, age=0, part=None):
        decision = self._inner.push(worker, clock, age, part)
        if decision is Decision.DROP:
            self._drops[self._shard] += 1
        return decision

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_dropped_is_one_shards_count_whatever_the_number_of_shards(monkeypatch):
    """A real run's summary counts shard 0's dropped gradients (every shard drops the same late push);
    the same simulated run at 1, 2 and 4 shards says the same count, the one its controllers decided."""
    made, reported, recounted = cluster_module.make_controller, {}, {}
    for servers in (1, 2, 4):
        drops: list[int] = []
        monkeypatch.setattr(cluster_module, "make_controller",
                            lambda *a, drops=drops, **k: _CountingController(made(*a, **k), drops))
        s = sim(mode="sync", backup_workers=1, cluster={"workers": 4, "servers": servers},
                faults={"compute_ms": 20.0, "transient_stragglers": "0.2:4"})
        assert len(drops) == servers and len(set(drops)) == 1, drops   # every shard drops the same pushes
        reported[servers], recounted[servers] = (s["dropped"], s.get("dropped_per_shard")), (drops[0], drops)
    assert recounted[1][0] > 0 and reported == recounted, (reported, recounted)
    assert len({dropped for dropped, _ in reported.values()}) == 1, reported


class _MergeLog:
    """A quorum controller as the simulator made it, noting each merge's part and workers as it closes."""

    def __init__(self, inner, merges: list):
        self._inner, self._merges = inner, merges

    def committed(self):
        self._merges.append((self._inner.part, set(self._inner.gradients), self._inner.pushing_count()))
        self._inner.committed()

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_a_simulated_quorum_merges_each_fragment_on_its_own(monkeypatch):
    """Streaming DiLoCo (H 4, F 2) under quorum 2 of 3, one worker slower: as psrv's shards, each merge is of one
    fragment (a worker's k-th push carries fragment k mod 2) and holds two workers' pushes of it while two
    still push; each is one update."""
    made, merges = cluster_module.make_controller, []
    monkeypatch.setattr(cluster_module, "make_controller", lambda *a, **k: _MergeLog(made(*a, **k), merges))
    s = sim(mode="sync", quorum=2, cluster={"workers": 3, "servers": 1}, worker={"local_steps": 4, "fragments": 2},
            faults={"compute_ms": 20.0, "straggler": "2:3"})
    assert s["updates_applied"] == len(merges) > 0
    assert {part for part, _, _ in merges} == {0, 1}, merges
    assert all(len(workers) >= 2 for _, workers, pushing in merges if pushing >= 2), merges


@pytest.mark.parametrize("lr", [5.0, 1e30])
def test_a_diverged_learning_simulation_says_so(lr, tmp_path, caplog):
    """lr 5 sends the held-out loss from 2.3 to about 100 and the accuracy to chance; lr 1e30 overflows
    to a non-finite loss. Both are said in one warning line and in summary.json."""
    out = tmp_path / "sim"
    caplog.set_level(logging.WARNING, logger="psrv")
    assert main(["simulate", "--level", "learning", "--mode", "async", "--workers", "4", "--servers", "2",
                 "--steps", "30", "--lr", str(lr), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary.get("diverged") is True, {k: summary.get(k) for k in ("initial_loss", "final_loss",
                                                                           "eval_accuracy", "diverged")}
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "diverged" in r.getMessage()]
    assert len(said) == 1 and summary["diverged_why"] in said[0], said
    why = "non-finite" if lr > 1e6 else "above the initial"
    assert why in summary["diverged_why"], summary["diverged_why"]


def test_a_learning_simulation_that_learns_has_not_diverged(tmp_path):
    s = sim(tmp_path, mode="sync", cluster={"workers": 2, "servers": 1}, job={"steps": 60},
            simulate={"level": "learning"})
    assert s["eval_accuracy"] > 0.5 and s.get("diverged") is False and s.get("diverged_why") is None, s
    assert sim(mode="sync").get("diverged") is None               # the timing level trains nothing


def test_a_simulation_spec_names_its_diverged_runs(tmp_path):
    spec = tmp_path / "simulate_lr.toml"
    spec.write_text('name = "lr"\nworkers = [4]\n[job]\nsteps = 30\n[simulate]\nlevel = "learning"\n'
                    '[[variants]]\nname = "sane"\nmode = "sync"\n'
                    '[[variants]]\nname = "huge-lr"\nmode = "async"\noptimizer = { lr = 5.0 }\n')
    assert main(["simulate", "--spec", str(spec), "--out", str(tmp_path / "out")]) == 0
    with open(tmp_path / "out" / "summary.csv", newline="") as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    assert (rows["sane"]["diverged"], rows["huge-lr"]["diverged"]) == ("False", "True"), rows
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"- **huge-lr at N=4 diverged**: {rows['huge-lr']['diverged_why']}" in report and "sane at" not in report


def test_a_quorum_merges_without_the_slow_worker_and_a_grace_window_lets_it_in():
    """sync's quorum on the simulator's own controllers: 4 workers, one 4x slower. Quorum 3 merges more often
    than sync's 60 clocks, with stale pushes; a window longer than the slow worker's lag makes every merge wait
    for it (60 merges, as sync), one shorter than the fast workers' spread changes nothing."""
    base = {"mode": "sync", "cluster": {"workers": 4, "servers": 1}, "faults": {"compute_ms": 20.0, "straggler": "3:4"}}
    barrier = sim(**base)
    quorum = sim(**base, quorum=3)
    assert barrier["updates_applied"] == 60 and barrier["max_staleness"] == 0
    assert quorum["updates_applied"] > 60 and quorum["max_staleness"] >= 2 and quorum["quorum"] == 3
    assert sim(**base, quorum=3, quorum_grace=10.0)["updates_applied"] == 60
    assert sim(**base, quorum=3, quorum_grace=1e-6)["updates_applied"] == quorum["updates_applied"]


def test_an_adaptive_window_waits_for_the_slow_worker_only_when_it_is_due_first():
    """The same cluster under an adaptive window of at most 10 s (psrv/server/pushes/grace.py, on the
    simulator's clock): the slow worker is waited for only where its push is due before a fast worker's next,
    so there are more merges than the fixed window's 60, and fewer than with no window, each of which holds
    the slow worker's push with the fast ones' where it waits."""
    base = {"mode": "sync", "cluster": {"workers": 4, "servers": 1}, "faults": {"compute_ms": 20.0, "straggler": "3:4"}}
    quorum = sim(**base, quorum=3)
    adaptive = sim(**base, quorum=3, quorum_grace=10.0, quorum_grace_adaptive=True)
    assert adaptive["quorum_grace_adaptive"] is True
    assert 60 < adaptive["updates_applied"] < quorum["updates_applied"], (adaptive, quorum["updates_applied"])


def test_a_single_simulation_with_goodput_prints_it(tmp_path, capsys):
    """`psrv simulate --goodput` ends with its summary table: the simulator's goodput is a ratio, not a real run's
    goodput block (printing it as one crashed, after summary.json was written)."""
    assert main(["simulate", "--mode", "sync", "--quorum", "3", "--workers", "4", "--servers", "1", "--steps", "40",
                 "--compute-ms", "5", "--straggler", "1:4", "--goodput", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert f"goodput             {s['goodput']:.3f} (while every worker ran), end to end " in printed, printed
