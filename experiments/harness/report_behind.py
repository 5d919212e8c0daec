"""The report's lines on variants that fell far behind: for each, what its runs' data show (staleness, a
quorum's merges, the momentum on the lr, the lr scale the update rule applied, compression without error
feedback, the workers' own training loss where the held-out loss of the servers' weights is far above it) and
the remedy settings to try, from those data alone (docs/experiments.md, "Variants far behind").

A variant is far behind when a repeat diverged, when its mean final loss is above its mean initial loss
(it learned nothing: collapsed), or when it is more than FAR times the best variant's.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from psrv.codec_names import parse
from psrv.experiments.harness.collect import VariantSummary
from psrv.experiments.harness.report_configs import StoredRun

FAR = 2.0  # a final loss this many times the best variant's is far behind
TAIL = 0.1  # the workers' training loss: over each one's last tenth of steps
APART = 2.0  # a held-out loss this many times the workers' training loss: the servers' weights lag theirs


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _recorded(runs: list[StoredRun], key: str) -> float | None:
    """The mean over a variant's runs of a number their summary.json holds (None where none does)."""
    values = []
    for run in runs:
        try:
            value = json.loads((Path(run.path) / "summary.json").read_text()).get(key)
        except (OSError, ValueError):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
            values.append(float(value))
    return _mean(values)


def _training_loss(runs: list[StoredRun]) -> float | None:
    """The workers' own training loss at the end: over each worker's last TAIL of steps (steps.csv), the mean over
    workers and runs (None where no run has rows)."""
    means = []
    for run in runs:
        try:
            with open(Path(run.path) / "steps.csv", newline="") as f:
                rows = list(csv.DictReader(f))
        except OSError:
            continue
        by_worker: dict[str, list[float]] = {}
        for row in rows:
            try:
                by_worker.setdefault(row["worker"], []).append(float(row["loss"]))
            except (KeyError, TypeError, ValueError):
                continue
        for losses in by_worker.values():
            tail = [v for v in losses[-max(1, int(len(losses) * TAIL)):] if math.isfinite(v)]
            if tail:
                means.append(sum(tail) / len(tail))
    return _mean(means)


def _why(s: VariantSummary, best: VariantSummary | None, runs: list[StoredRun]) -> str | None:
    """Why `s` is far behind, in words; None where it is not."""
    final, initial = s.stats["final_loss"].mean, _recorded(runs, "initial_loss")
    if s.diverged:
        return f"{s.diverged} of {s.repeats} repeats diverged (a non-finite held-out loss)"
    if final is None:
        return None
    if initial is not None and final >= initial:
        return f"it learned nothing: final loss {final:.3g}, initial {initial:.3g} (collapsed)"
    if best is not None and best is not s and best.stats["final_loss"].mean and \
            final > FAR * best.stats["final_loss"].mean:
        return f"final loss {final:.3g}, {final / best.stats['final_loss'].mean:.1f}x `{best.variant}`'s " \
               f"{best.stats['final_loss'].mean:.3g}"
    return None


def _data_and_remedies(s: VariantSummary, runs: list[StoredRun]) -> tuple[list[str], list[str]]:
    """What the data show, and the settings to try, for a variant far behind."""
    cfg = next((r.config for r in runs if r.config is not None), None)
    if cfg is None:
        return ["no stored config.json to read"], []
    data, remedies = [], []
    opt, lr, momentum = cfg.optimizer, cfg.optimizer.lr, cfg.optimizer.momentum
    stale = s.stats["mean_staleness"].mean
    if cfg.quorum and stale is not None:
        data.append(f"quorum {cfg.quorum} of {cfg.cluster.workers}, mean age {stale:.3g} merges"
                    + (f", a grace window of {cfg.quorum_grace:g} s" if cfg.quorum_grace else ", no grace window")
                    + (", fresh pushes' pulls held for their merge" if cfg.quorum_wait else ""))
        if stale > 0.5 and not cfg.quorum_grace_adaptive and not cfg.quorum_wait:
            remedies.append("`--quorum-grace 1 --quorum-grace-adaptive` (lets a late worker into the merge where "
                            "it is due first)")
    if cfg.mode in ("async", "ssp") and stale is not None:
        worst = s.stats["max_staleness"].mean or 0
        data.append(f"mean staleness {stale:.3g} (max {worst:.3g}" + (", the repeats' mean" if s.repeats > 1 else "") + ")")
        scale = _recorded(runs, "mean_lr_scale")
        data.append(f"update rule {opt.update_rule}" + (f", lr scale {scale:.3g}" if scale is not None else ""))
        if stale >= 1 and opt.update_rule == "plain":
            remedies += ["`--update-rule staleness-lr`", "`--update-rule dc-asgd-a`"]
        if stale >= 1 and cfg.mode == "async":
            remedies.append("`--mode ssp --staleness 2`")
    if opt.name == "sgd" and momentum:
        effective = lr / (1 - momentum) if momentum < 1 else float("inf")
        data.append(f"momentum {momentum:g} on lr {lr:g} (lr/(1-momentum) = {effective:.3g})")
        if stale is not None and stale >= 1 and cfg.mode in ("async", "ssp"):
            remedies.append("`--momentum 0` (momentum compounds stale gradients)")
        elif effective >= 1:
            remedies.append(f"`--momentum {momentum / 2:g}`")
    else:
        data.append(f"{opt.name}, lr {lr:g}")
    if s.diverged or (opt.name == "sgd" and momentum < 1 and lr / (1 - momentum) >= 1):
        remedies += [f"`--lr {lr / 2:g}`", "`--clip-grad-norm 1.0`"]
    trained, final = _training_loss(runs), s.stats["final_loss"].mean
    if trained is not None and final is not None and final > APART * trained:
        data.append(f"the workers' own training loss over their last {TAIL:.0%} of steps was {trained:.3g}: the "
                    "held-out loss is of the servers' final weights (rank 0's final pull), "
                    f"{final / trained:.1f}x that")
    w = cfg.worker
    if w.compress:
        data.append(f"pushes compressed {w.compress}" + ("" if w.error_feedback else " without error feedback"))
        if not w.error_feedback:
            remedies.append("error feedback (drop `--no-error-feedback`)")
        name, ratio = parse(w.compress)
        if ratio is not None and ratio <= 0.005:
            remedies.append(f"a larger {name} ratio than {ratio:g}")
    return data, remedies


def behind_lines(summaries: list[VariantSummary], runs: list[StoredRun]) -> list[str]:
    """The section, or nothing where no variant fell far behind."""
    finite = [s for s in summaries if s.repeats and s.stats["final_loss"].mean is not None and not s.diverged]
    best = min(finite, key=lambda s: s.stats["final_loss"].mean, default=None)
    lines = []
    for s in summaries:
        mine = [r for r in runs if r.variant == s.variant]
        why = _why(s, best, mine) if s.repeats else None
        if why is None:
            continue
        data, remedies = _data_and_remedies(s, mine)
        try_ = f" Try: {', '.join(dict.fromkeys(remedies))}." if remedies else \
            " The data name no remedy psrv has; compare the variants' settings."
        lines.append(f"- `{s.variant}` is far behind: {why}. The data: {'; '.join(data)}.{try_}")
    if not lines:
        return []
    return ["## Variants far behind", "",
            "What each one's runs show (summary.json, config.json), and settings to try (docs/algorithms.md, "
            "docs/compression.md); a variant is far behind when a repeat diverged, when it ended above its "
            f"initial loss, or at over {FAR:g}x the best variant's final loss.", "", *lines, ""]
