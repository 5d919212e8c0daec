"""collect + write_report on fabricated run directories: summary values, plots, report.md."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from matplotlib.axes import Axes

from psrv.experiments.harness.collect import (collect, is_finished, read_csv, read_summary, run_dir,
                                 time_to_target, wait_fraction)
from psrv.experiments.launcher.launch import write_config
from psrv.experiments.harness.report import write_report
from psrv.experiments.harness.spec import ExperimentSpec, TargetSpec, spec_from_dict

STEP_COLUMNS = ["wall_time", "worker", "step", "loss", "staleness", "compute_seconds",
                "communication_seconds", "wait_seconds", "batch_size"]
EVAL_COLUMNS = ["wall_time", "step", "eval_loss", "eval_accuracy"]
VERSIONS = {"python": "3.11", "torch": "2.13", "psrv": "0.1.0"}
PNG = b"\x89PNG\r\n\x1a\n"


def _spec(*modes: str, target: dict | None = None, eval_every: int = 1) -> ExperimentSpec:
    return spec_from_dict({"name": "fab", "job": {"name": "digits_mlp", "steps": 3, "eval_every": eval_every},
                           "target": target or {"eval_accuracy": 0.9}, "seeds": [0, 1],
                           "variants": [{"mode": mode} for mode in modes]})


def _write_csv(path: Path, columns: list[str], rows: list[list[float]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(rows)


def _run(out: Path, variant: str, repeat: int, *, summary: dict, evals: list[tuple],
         step_times: tuple[float, float, float], staleness: int | None = 0) -> None:
    """One fabricated run: 2 workers x 3 steps of (compute, communication, wait) seconds;
    staleness None leaves the column empty, as DDP's steps.csv does."""
    path = run_dir(out, variant, repeat)
    path.mkdir(parents=True)
    cell = "" if staleness is None else staleness
    steps = [[0.1 * s, w, s, 1.0 / s, cell, *step_times, 32] for s in (1, 2, 3) for w in (0, 1)]
    _write_csv(path / "steps.csv", STEP_COLUMNS, steps)
    _write_csv(path / "evals.csv", EVAL_COLUMNS, [list(e) for e in evals])
    (path / "summary.json").write_text(json.dumps({"mode": variant, "max_clock_gap": 1, **summary}))


def _summary(wall: float, sps: float, loss: float, acc: float, updates: int,
             mean_st: float | None, max_st: int | None) -> dict:
    return {"wall_seconds": wall, "samples_per_second": sps, "final_loss": loss,
            "eval_accuracy": acc, "updates_applied": updates, "mean_staleness": mean_st,
            "max_staleness": max_st}


def _fabricate(out: Path, second: str = "async") -> None:
    """Two variants x two repeats, each run with the config.json run_local would have stored."""
    # sync reaches 0.9 accuracy at 2.0 s (rep 0) and 4.0 s (rep 1): mean 3.0, std sqrt(2).
    _run(out, "sync", 0, summary=_summary(10.0, 100.0, 0.30, 0.95, 3, 0.0, 0),
         evals=[(1.0, 1, 1.0, 0.5), (2.0, 2, 0.5, 0.92), (3.0, 3, 0.3, 0.95)],
         step_times=(0.1, 0.05, 0.05))  # wait fraction 0.25
    _run(out, "sync", 1, summary=_summary(12.0, 140.0, 0.40, 0.91, 3, 0.0, 0),
         evals=[(1.5, 1, 0.9, 0.6), (4.0, 2, 0.4, 0.91), (5.0, 3, 0.4, 0.91)],
         step_times=(0.1, 0.1, 0.2))  # wait fraction 0.5
    # the second variant reaches it at 0.5 s in rep 0 and never in rep 1.
    # DDP records no staleness (summary.json null, steps.csv cells empty): it has none to measure.
    ddp = second == "ddp"
    _run(out, second, 0, summary=_summary(5.0, 240.0, 0.35, 0.93, 6, *((None, None) if ddp else (1.0, 2))),
         evals=[(0.5, 1, 0.6, 0.93), (1.0, 2, 0.5, 0.94), (2.0, 3, 0.35, 0.93)],
         step_times=(0.1, 0.1, 0.0), staleness=None if ddp else 1)
    _run(out, second, 1, summary=_summary(7.0, 240.0, 0.9, 0.8, 6, *((None, None) if ddp else (2.0, 4))),
         evals=[(0.5, 1, 1.0, 0.5), (1.0, 2, 0.95, 0.7), (2.0, 3, 0.9, 0.8)],
         step_times=(0.1, 0.1, 0.0), staleness=None if ddp else 2)
    spec = _spec("sync", second)
    for variant, seed, repeat in spec.runs():
        write_config(run_dir(out, variant.name, repeat) / "config.json", spec.run_config(variant, seed))


def _rows(out: Path) -> dict[str, dict[str, str]]:
    return {row["variant"]: row for row in read_csv(out / "summary.csv")}


def _f(text: str) -> float:
    return float(text)


def test_time_to_target_and_wait_fraction() -> None:
    evals = [{"wall_time": "3", "eval_loss": "0.1", "eval_accuracy": "0.99"},
             {"wall_time": "2", "eval_loss": "0.2", "eval_accuracy": ""},
             {"wall_time": "1", "eval_loss": "0.9", "eval_accuracy": "0.1"}]
    assert time_to_target(evals, TargetSpec(eval_loss=0.5)) == 2.0
    assert time_to_target(evals, TargetSpec(eval_accuracy=0.9)) == 3.0
    assert time_to_target(evals, TargetSpec(eval_loss=0.5, eval_accuracy=0.9)) == 3.0
    assert time_to_target(evals, TargetSpec(eval_loss=0.01)) is None
    ppl = [{"wall_time": "1", "eval_loss": "2.0", "eval_perplexity": "7.4"},
           {"wall_time": "2", "eval_loss": "1.0", "eval_perplexity": "2.7"}]
    assert time_to_target(ppl, TargetSpec(metric="perplexity", value=3.0)) == 2.0  # lower by name
    assert time_to_target(ppl, TargetSpec(metric="perplexity", value=3.0), lower=False) == 1.0
    assert time_to_target(ppl, TargetSpec(metric="perplexity", value=1.0)) is None
    assert time_to_target(ppl, TargetSpec(metric="f1", value=0.5)) is None  # a metric no row has
    f1 = [{"wall_time": "1", "eval_f1": "0.4"}, {"wall_time": "2", "eval_f1": "0.6"}]
    assert time_to_target(f1, TargetSpec(metric="f1", value=0.5)) == 2.0  # higher by name
    assert TargetSpec(metric="wer", value=0.1).lower("wer", True)  # the job's own direction
    assert not TargetSpec(metric="wer", value=0.1).lower("accuracy", True)  # not the job's metric: by name
    assert TargetSpec(metric="f1", value=0.1, lower_is_better=True).lower("f1", False)  # the spec wins
    steps = [{"compute_seconds": "0.3", "communication_seconds": "0.1", "wait_seconds": "0.1"},
             {"compute_seconds": "0.3", "communication_seconds": "0.1", "wait_seconds": "0.3"}]
    assert wait_fraction(steps) == pytest.approx(0.4 / 1.2)
    assert wait_fraction([]) is None


def test_collect_summary_values(tmp_path: Path) -> None:
    _fabricate(tmp_path)
    spec = _spec("sync", "async")
    summaries = collect(tmp_path, spec)
    assert [s.variant for s in summaries] == ["sync", "async"]
    sync, asynchronous = _rows(tmp_path)["sync"], _rows(tmp_path)["async"]
    assert (sync["mode"], sync["staleness"], sync["repeats"], sync["target_reached"]) == \
        ("sync", "", "2", "2")
    assert _f(sync["wall_seconds"]) == pytest.approx(11.0)
    assert _f(sync["wall_seconds_std"]) == pytest.approx(math.sqrt(2))
    assert _f(sync["samples_per_second"]) == pytest.approx(120.0)
    assert _f(sync["final_loss"]) == pytest.approx(0.35)
    assert _f(sync["eval_accuracy"]) == pytest.approx(0.93)
    assert _f(sync["time_to_target_seconds"]) == pytest.approx(3.0)
    assert _f(sync["time_to_target_seconds_std"]) == pytest.approx(math.sqrt(2))
    assert _f(sync["wait_fraction"]) == pytest.approx(0.375)
    assert _f(sync["wait_fraction_std"]) == pytest.approx(math.sqrt(2) * 0.125)
    assert _f(sync["updates_applied"]) == 3.0 and _f(sync["updates_applied_std"]) == 0.0
    # one repeat of async never reached the target: no time to target at all
    assert asynchronous["target_reached"] == "1"
    assert asynchronous["time_to_target_seconds"] == ""
    assert asynchronous["time_to_target_seconds_std"] == ""
    assert _f(asynchronous["mean_staleness"]) == pytest.approx(1.5)
    assert _f(asynchronous["max_staleness"]) == pytest.approx(3.0)
    assert _f(asynchronous["wait_fraction"]) == 0.0
    runs = read_csv(tmp_path / "runs.csv")
    assert [(r["variant"], r["repeat"], r["reached_target"]) for r in runs] == \
        [("sync", "0", "1"), ("sync", "1", "1"), ("async", "0", "1"), ("async", "1", "0")]
    assert [s.stats["wall_seconds"].mean for s in read_summary(tmp_path)] == [11.0, 6.0]


def test_collect_merges_repeats_and_skips_unfinished(tmp_path: Path) -> None:
    _fabricate(tmp_path)
    unfinished = run_dir(tmp_path, "sync", 2)
    unfinished.mkdir()
    (unfinished / "summary.json").write_text("{not json")
    assert not is_finished(unfinished) and is_finished(run_dir(tmp_path, "sync", 0))
    interrupted = run_dir(tmp_path, "async", 1) / "summary.json"  # what an interrupted run writes
    interrupted.write_text(json.dumps({**json.loads(interrupted.read_text()), "complete": False}))
    assert not is_finished(interrupted.parent)
    summaries = collect(tmp_path, _spec("sync", "async"))
    assert (summaries[0].repeats, summaries[1].repeats) == (2, 1)
    steps = read_csv(tmp_path / "sync" / "steps.csv")
    assert list(steps[0]) == ["repeat", *STEP_COLUMNS]
    assert [r["repeat"] for r in steps] == ["0"] * 6 + ["1"] * 6
    evals = read_csv(tmp_path / "async" / "evals.csv")
    assert list(evals[0]) == ["repeat", *EVAL_COLUMNS] and [r["repeat"] for r in evals] == ["0"] * 3


def test_report_plots_and_winner(tmp_path: Path) -> None:
    _fabricate(tmp_path)
    spec = _spec("sync", "async")
    collect(tmp_path, spec)
    report = write_report(tmp_path, spec, spec_path="specs/fab.toml", versions=VERSIONS)
    text = report.read_text()
    assert report == tmp_path / "report.md"
    assert "`sync` reached the target (eval_accuracy >= 0.9) first in wall time: 3 s" in text
    assert "`async` (1/2 repeats)" in text
    assert "`specs/fab.toml`" in text and "torch 2.13" in text and "psrv 0.1.0" in text
    assert "no `ddp` variant" in text
    assert "| `sync` | sync |" in text  # the summary table
    images = [line.split("](")[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]
    assert len(images) >= 5
    for rel in images:
        data = (tmp_path / rel).read_bytes()
        assert data.startswith(PNG) and len(data) > 1000, rel
    import matplotlib.image
    assert matplotlib.image.imread(tmp_path / images[0]).ndim == 3


def test_the_report_names_a_setting_a_scripts_worker_overrode(tmp_path: Path) -> None:
    _fabricate(tmp_path)
    spec = _spec("sync", "async")
    summary = tmp_path / run_dir(tmp_path, "async", 1).relative_to(tmp_path) / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "settings_overridden": {
        "rank 1": {"compress": {"run": "topk:0.01", "script": "int8"}}}}))
    collect(tmp_path, spec)
    text = write_report(tmp_path, spec, spec_path="specs/fab.toml", versions=VERSIONS).read_text()
    section = text.split("## Settings the script overrode")[1].split("##")[0]
    assert section.strip().splitlines()[-1] == "- `async` rep-1, rank 1: compress 'int8' (config.json: 'topk:0.01')"
    plain = write_report(tmp_path, _spec("sync"), spec_path="s", versions=VERSIONS).read_text()
    assert "the script overrode" not in plain


def test_report_ddp_gap(tmp_path: Path, monkeypatch) -> None:
    _fabricate(tmp_path, second="ddp")
    spec = _spec("sync", "ddp")
    collect(tmp_path, spec)
    ddp = _rows(tmp_path)["ddp"]
    assert (ddp["mean_staleness"], ddp["max_staleness"]) == ("", "")   # absent, not 0
    assert _f(_rows(tmp_path)["sync"]["max_staleness"]) == 0.0
    drawn = []  # (panel title, what was drawn) on the staleness plot
    real_hist, real_text = Axes.hist, Axes.text
    monkeypatch.setattr(Axes, "hist", lambda ax, *a, **k: drawn.append((ax.get_title(), "bars"))
                        or real_hist(ax, *a, **k))
    monkeypatch.setattr(Axes, "text", lambda ax, x, y, s, *a, **k: drawn.append((ax.get_title(), s))
                        or real_text(ax, x, y, s, *a, **k))
    text = write_report(tmp_path, spec, spec_path="x.toml", versions=VERSIONS).read_text()
    assert drawn == []  # sync's staleness is always 0 and ddp has none: no panel, no bar at 0
    assert "plots/staleness.png" not in text and not (tmp_path / "plots" / "staleness.png").exists()
    [sync_row] = [line for line in text.splitlines() if line.startswith("| `sync` | sync |")]
    [ddp_row] = [line for line in text.splitlines() if line.startswith("| `ddp` | ddp |")]
    assert sync_row.split(" | ")[10:12] == ["0 ± 0", "0 ± 0"]  # mean, max staleness: measured
    assert ddp_row.split(" | ")[10:12] == ["n/a", "n/a"]      # DDP has none to measure
    # ddp did not reach the target in every repeat: no time ratio; throughput 120 / 240, per repeat
    # 100 / 240 and 140 / 240
    assert "| `sync` | 3 ± 1.4 | — | 120 ± 28 | 0.50 (0.42–0.58) |" in text
    assert "| `ddp` | — | — | 240 ± 0 | 1 (baseline) |" in text
    assert "did not reach the target in every repeat, so no time ratio" in text


def test_the_ddp_gap_gives_each_ratio_its_spread_over_repeats(tmp_path: Path) -> None:
    """Repeat k of a variant against DDP's repeat k (the same seed, run in the same round): the ratio of
    the means, then the range of the per-repeat ratios; a range on both sides of 1 is inconclusive."""
    reach = {"sync": (2.5, 4.0), "async": (1.0, 6.0), "ddp": (2.0, 2.0)}       # time to 0.9 accuracy
    throughput = {"sync": (100.0, 140.0), "async": (150.0, 400.0), "ddp": (200.0, 280.0)}
    for name in reach:
        for rep in (0, 1):
            _run(tmp_path, name, rep, summary=_summary(10.0, throughput[name][rep], 0.3, 0.95, 3, None, None),
                 evals=[(reach[name][rep], 1, 0.3, 0.95)], step_times=(0.1, 0.0, 0.0), staleness=None)
    spec = _spec("sync", "async", "ddp")
    for variant, seed, repeat in spec.runs():
        write_config(run_dir(tmp_path, variant.name, repeat) / "config.json", spec.run_config(variant, seed))
    collect(tmp_path, spec)
    text = write_report(tmp_path, spec, spec_path="x.toml", versions=VERSIONS).read_text()
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| `")}
    # time: sync 2.5/2 and 4/2 -> 1.25 and 2.00, ratio of means 3.25/2; async 0.50 and 3.00
    # samples/s: sync 100/200 and 140/280 -> 0.50 twice; async 0.75 and 1.43, ratio of means 275/240
    assert "| `sync` | 3.25 ± 1.1 | 1.62 (1.25–2.00) | 120 ± 28 | 0.50 (0.50–0.50) |" in text, rows
    assert "| `async` | 3.5 ± 3.5 | 1.75 (0.50–3.00, inconclusive) | 275 ± 177 | 1.15 (0.75–1.43, " \
           "inconclusive) |" in text, rows
    assert "| `ddp` | 2 ± 0 | 1 (baseline) | 240 ± 57 | 1 (baseline) |" in text, rows


def test_report_when_no_variant_reaches_the_target(tmp_path: Path) -> None:
    _fabricate(tmp_path)
    spec = _spec("sync", "async", target={"eval_loss": 0.01}, eval_every=0)
    collect(tmp_path, spec)
    assert all(row["time_to_target_seconds"] == "" for row in _rows(tmp_path).values())
    text = write_report(tmp_path, spec, spec_path="x.toml", versions=VERSIONS).read_text()
    assert "No variant reached the target (eval_loss <= 0.01) in every repeat." in text


def test_write_report_needs_collect_first(tmp_path: Path) -> None:
    spec = _spec("sync")
    with pytest.raises(ValueError, match="collect"):
        write_report(tmp_path, spec, spec_path="x.toml", versions=VERSIONS)


def test_a_target_on_a_metric_the_job_does_not_report_is_a_clear_error(tmp_path: Path) -> None:
    _run(tmp_path, "sync", 0, summary={**_summary(1.0, 1.0, 0.3, 0.9, 3, 0.0, 0), "job": "digits_mlp",
                                       "eval_metrics": {"loss": 0.3, "accuracy": 0.9}},
         evals=[(1.0, 1, 0.3, 0.9)], step_times=(0.1, 0.0, 0.0))
    from psrv.experiments.harness.collect import run_metrics
    with pytest.raises(ValueError, match="'perplexity' is not among the metrics job 'digits_mlp' reports"):
        run_metrics(run_dir(tmp_path, "sync", 0), TargetSpec(metric="perplexity", value=3.0))


def test_a_metric_target_reads_the_jobs_direction_and_final_value(tmp_path: Path) -> None:
    """A custom metric 'wer' that the job declares lower-is-better: reached at 2.0 s, not at 1.0 s,
    though by name alone ('wer' is not loss-like) it would read as higher-is-better."""
    path = run_dir(tmp_path, "sync", 0)
    _run(tmp_path, "sync", 0, summary={**_summary(1.0, 1.0, 0.3, 0.9, 3, 0.0, 0), "job": "asr",
                                       "metric": "wer", "lower_is_better": True,
                                       "eval_metrics": {"loss": 0.3, "wer": 0.2}},
         evals=[], step_times=(0.1, 0.0, 0.0))
    _write_csv(path / "evals.csv", ["wall_time", "step", "eval_loss", "eval_wer"],
               [[1.0, 1, 0.5, 0.6], [2.0, 2, 0.3, 0.2]])
    from psrv.experiments.harness.collect import run_metrics
    values = run_metrics(path, TargetSpec(metric="wer", value=0.3)).values
    assert values["time_to_target_seconds"] == 2.0 and values["final_target_metric"] == 0.2


def test_the_setup_line_names_every_setting_that_changes_the_step() -> None:
    """A report that said 'sgd, lr 0.7, momentum 0.9' for a DiLoCo run with dn would hide what ran."""
    from psrv.experiments.harness.report_configs import _optimizer
    spec = spec_from_dict({"name": "t", "target": {"eval_loss": 1.0}, "variants": [
        {"mode": "sync"},
        {"mode": "async", "name": "dn", "optimizer": {"lr": 0.7, "nesterov": True, "update_rule": "dn",
                                                      "lr_schedule": "linear", "lr_decay_steps": 10},
         "worker": {"local_steps": 20}},
        {"mode": "async", "name": "dc", "optimizer": {"update_rule": "dc-asgd"}}]})
    plain, dn, dc = (_optimizer(v.config) for v in spec.variants)
    assert plain == "sgd, lr 0.05, momentum 0.9, weight decay 0"
    assert dn == ("sgd, lr 0.7, momentum 0.9 (Nesterov), weight decay 0; lr schedule linear; update rule dn "
                  "(period the workers); 20 local steps per push, inner adamw lr 0.001")
    assert dc.endswith("; update rule dc-asgd (lambda 0.04)")


def test_a_value_past_floats_range_reads_not_finite_and_a_huge_one_in_powers_of_ten(tmp_path: Path) -> None:
    """A collapsed language model's perplexity (exp of a loss of thousands) is Inf while its loss is finite, so
    the run did not diverge: its cell says the mean is not finite, not that nothing was measured ("—"); one of
    1e19 is written so, not as twenty digits."""
    _fabricate(tmp_path)
    path = run_dir(tmp_path, "async", 1) / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "eval_accuracy": math.inf}))
    spec = _spec("sync", "async")
    collect(tmp_path, spec)
    assert _rows(tmp_path)["async"]["eval_accuracy"] == "" and _rows(tmp_path)["async"]["diverged"] == "0"
    text = write_report(tmp_path, spec, spec_path="x.toml", versions=VERSIONS).read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `async` |"))
    assert "| not finite |" in row, row
    from psrv.experiments.harness.report import _num
    assert (_num(1.981430786e19, 4), _num(6939.1, 4), _num(9.1713, 4)) == ("1.981e+19", "6939", "9.171")


def test_the_steps_of_worker_lives_that_wrote_no_record_are_said_under_the_table(tmp_path: Path) -> None:
    """A worker killed and brought back wrote no record for its first life, so samples/s leaves those steps out
    (a run with kills read 344 samples/s against 492 clean, while its useful samples/s were 480): the report says
    how many lives and steps, per variant."""
    _fabricate(tmp_path)
    for repeat, steps in ((0, [240, 470]), (1, [230])):
        path = run_dir(tmp_path, "async", repeat) / "summary.json"
        restarts = [{"rank": 1, "rank_steps": n, "joined": True} for n in steps]
        path.write_text(json.dumps({**json.loads(path.read_text()), "faults": {"worker_restarts": restarts}}))
    spec = _spec("sync", "async")
    collect(tmp_path, spec)
    text = write_report(tmp_path, spec, spec_path="x.toml", versions=VERSIONS).read_text()
    assert "Left out, over all repeats: `async` 3 lives, 940 steps." in text, text
    assert "`sync`" not in text.split("Left out, over all repeats:")[1].split("\n")[0]


def test_a_curve_with_a_value_past_floats_range_says_so_in_the_legend() -> None:
    """matplotlib leaves an Inf out of a line: a variant whose every repeat ended Inf would look absent."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from psrv.experiments.harness.plots.progress import _draw
    fig, ax = plt.subplots()
    finite = {0: [{"samples": 0.0, "y": 300.0}, {"samples": 10.0, "y": 9.0}]}
    _draw(ax, 0, "sync", finite, "samples", markers=True)
    _draw(ax, 1, "async", {0: [{"samples": 0.0, "y": 300.0}, {"samples": 10.0, "y": math.inf}]}, "samples", markers=True)
    assert [line.get_label() for line in ax.get_lines()] == ["sync", "async (not finite: not drawn there)"]
    plt.close(fig)
