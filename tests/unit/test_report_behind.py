"""The report's "Variants far behind": which variants it names, what it says their data show, and the
remedies it names, from fabricated runs (summary.json and config.json as a run writes them)."""
from __future__ import annotations

import json
from pathlib import Path

from psrv.config import RunConfig, from_dict
from psrv.experiments.harness.collect import METRICS, Stat, VariantSummary
from psrv.experiments.harness.report_behind import behind_lines
from psrv.experiments.harness.report_configs import StoredRun


def _variant(tmp: Path, name: str, config: dict, *, final: float | None, initial: float = 2.3,
             stale: float | None = None, diverged: int = 0, lr_scale: float = 1.0):
    path = tmp / name / "rep-0"
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({"initial_loss": initial, "final_loss": final,
                                                   "mean_lr_scale": lr_scale}))
    cfg = from_dict(RunConfig, config)
    stats = {m: Stat(None, None) for m in METRICS}
    stats.update(final_loss=Stat(final, None), mean_staleness=Stat(stale, None), max_staleness=Stat(stale, None))
    summary = VariantSummary(variant=name, mode=cfg.mode, staleness=None, repeats=1, target_reached=0,
                             stats=stats, diverged=diverged)
    return summary, StoredRun(variant=name, repeat=0, path=path, config=cfg)


def test_a_collapsed_async_variant_gets_its_data_and_remedies_and_a_good_one_nothing(tmp_path):
    sync = _variant(tmp_path, "sync", {"mode": "sync"}, final=0.2)
    close = _variant(tmp_path, "ssp", {"mode": "ssp", "staleness": 1}, final=0.35, stale=0.8)
    collapsed = _variant(tmp_path, "async", {"mode": "async", "optimizer": {"lr": 0.2, "momentum": 0.9}},
                         final=2.4, stale=6.5)
    lines = behind_lines(*map(list, zip(sync, close, collapsed)))
    named = [line for line in lines if line.startswith("- ")]
    assert named == [
        "- `async` is far behind: it learned nothing: final loss 2.4, initial 2.3 (collapsed). The data: mean "
        "staleness 6.5 (max 6.5); update rule plain, lr scale 1; momentum 0.9 on lr 0.2 (lr/(1-momentum) = 2). "
        "Try: `--update-rule staleness-lr`, `--update-rule dc-asgd-a`, `--mode ssp --staleness 2`, `--momentum 0` "
        "(momentum compounds stale gradients), `--lr 0.1`, `--clip-grad-norm 1.0`."]


def test_diverged_and_far_behind_and_compression_without_error_feedback(tmp_path):
    sync = _variant(tmp_path, "sync", {"mode": "sync"}, final=0.2)
    nan = _variant(tmp_path, "hot", {"mode": "sync", "optimizer": {"lr": 0.4}}, final=None, diverged=1)
    topk = _variant(tmp_path, "topk", {"mode": "sync", "worker": {"compress": "topk:0.001",
                                                                  "error_feedback": False}}, final=0.9)
    lines = [line for line in behind_lines(*map(list, zip(sync, nan, topk))) if line.startswith("- ")]
    assert lines[0].startswith("- `hot` is far behind: 1 of 1 repeats diverged") and "`--lr 0.2`" in lines[0]
    assert lines[1].startswith("- `topk` is far behind: final loss 0.9, 4.5x `sync`'s 0.2.")
    assert "pushes compressed topk:0.001 without error feedback" in lines[1]
    assert "error feedback (drop `--no-error-feedback`)" in lines[1] and "a larger topk ratio than 0.001" in lines[1]
    assert behind_lines([sync[0]], [sync[1]]) == []  # nothing behind: no section


def test_a_quorum_far_behind_says_its_merges_and_where_the_workers_own_loss_was(tmp_path):
    """A quorum's data: its merges' mean age and window, the adaptive window to try; where the held-out loss of the
    servers' weights is over 2x the workers' own training loss at the end (their last tenth of steps.csv), it
    says so; a variant whose workers' loss is as high says nothing of it."""
    sync = _variant(tmp_path, "sync", {"mode": "sync"}, final=0.3)
    quorum = _variant(tmp_path, "q3", {"mode": "sync", "quorum": 3, "cluster": {"workers": 4}}, final=1.0, stale=0.97)
    near = _variant(tmp_path, "q3-near", {"mode": "sync", "quorum": 3, "cluster": {"workers": 4},
                                          "quorum_grace": 1.0, "quorum_grace_adaptive": True}, final=0.9, stale=0.7)
    for run, late in ((quorum[1], 0.4), (near[1], 0.6)):
        rows = ["wall_time,worker,step,loss"] + [f"{s},{w},{s},{2.0 if s < 18 else late}" for w in (0, 1)
                                                 for s in range(20)] + ["9,1,20,nan"]
        (run.path / "steps.csv").write_text("\n".join(rows) + "\n")
    lines = [line for line in behind_lines(*map(list, zip(sync, quorum, near))) if line.startswith("- ")]
    assert lines[0] == (
        "- `q3` is far behind: final loss 1, 3.3x `sync`'s 0.3. The data: quorum 3 of 4, mean age 0.97 merges, no "
        "grace window; momentum 0.9 on lr 0.05 (lr/(1-momentum) = 0.5); the workers' own training loss over their last 10% of steps was 0.4: the "
        "held-out loss is of the servers' final weights (rank 0's final pull), 2.5x that. Try: `--quorum-grace 1 "
        "--quorum-grace-adaptive` (lets a late worker into the merge where it is due first).")
    assert "a grace window of 1 s" in lines[1] and "training loss" not in lines[1] and "Try" not in lines[1]
