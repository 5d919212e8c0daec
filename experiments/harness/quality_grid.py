"""A remedy's quality grid, judged cell by cell from each run's stored config.json and summary.json (never
from the spec's text): experiments/harness/ef_quality.py (error feedback under momentum) and
experiments/harness/async_quality.py (the async update rules) are two grids of this form.

A cell is one job, momentum, lr and seed. Each run in it is one `form` (what the grid varies: "dense",
"sign ef", "async staleness-lr"...). Each claim is a remedy's form against its baseline's and against the
same run without the remedy: a cell holds where every remedy's final loss is within `ratio` of the
baseline's and no worse than without it. The grid is split by job before any of it ran: `chosen_on` are
the jobs its settings were chosen on (or measured on, for docs' first figures); every other job is held
out, and the claim in docs is the held-out half's.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from psrv.config import RunConfig
from psrv.experiments.launcher.provenance import stored_config


@dataclass(frozen=True)
class Claim:
    """`remedy`'s loss within the grid's ratio of the baseline's, and no worse than `without`'s."""

    name: str  # what a miss is said as: "sign", "staleness-lr"
    remedy: str  # the forms, as Grid.form_of names them
    without: str


@dataclass(frozen=True)
class Grid:
    name: str
    form_of: Callable[[RunConfig], str]  # a run's form, from its stored config
    baseline: str  # the form each remedy is held to within `ratio`
    claims: tuple[Claim, ...]
    chosen_on: tuple[str, ...]  # the jobs its settings were chosen on
    ratio: float = 1.3
    columns: tuple[tuple[str, str], ...] = ()  # (header, form): x baseline per seed, in the table


@dataclass(frozen=True)
class Run:
    job: str
    momentum: float
    lr: float
    seed: int
    form: str
    loss: float


def read_runs(folder: Path, grid: Grid) -> list[Run]:
    """Every finished run under an experiment's folder (<variant>/rep-<k>/ with a summary.json)."""
    runs = []
    for summary in sorted(folder.glob("*/rep-*/summary.json")):
        cfg = stored_config(summary.parent)
        loss = json.loads(summary.read_text()).get("final_loss")
        runs.append(Run(cfg.job.name, cfg.optimizer.momentum, cfg.optimizer.lr, cfg.seed, grid.form_of(cfg),
                        float("nan") if loss is None else float(loss)))
    return runs


@dataclass(frozen=True)
class Cell:
    """One job, momentum, lr and seed: each form's loss, and what the grid's claims say of it."""

    job: str
    momentum: float
    lr: float
    seed: int
    losses: dict[str, float]
    grid: Grid

    def ratio(self, form: str) -> float:
        return self.losses.get(form, math.nan) / self.losses.get(self.grid.baseline, math.nan)

    def misses(self, claim: Claim) -> list[tuple[str, str]]:
        """What `claim` misses here, each as (kind, line): "missing" (a run is missing), "diverged" (the
        remedy's run has no final loss), "ratio" (past the grid's ratio of the baseline), "worse" (worse
        than the run without the remedy)."""
        remedy, without = self.losses.get(claim.remedy), self.losses.get(claim.without)
        if remedy is None or without is None or self.grid.baseline not in self.losses:
            return [("missing", f"{claim.name}: a run is missing")]
        if math.isnan(remedy):  # a run that diverged (or failed) has no final loss: a miss, said as one
            return [("diverged", f"{claim.name}: no final loss (diverged or failed)")]
        out = []
        ratio = self.ratio(claim.remedy)
        if not ratio <= self.grid.ratio:  # a baseline with no final loss fails too
            out.append(("ratio", f"{claim.name}: {ratio:.2f}x {self.grid.baseline}"))
        if not remedy <= without and not math.isnan(without):  # finite beats a run that diverged
            out.append(("worse", f"{claim.name}: worse than {claim.without} ({remedy:.4f} > {without:.4f})"))
        return out

    def failures(self) -> list[str]:
        """Every claim's misses here, as lines (`misses`)."""
        return [line for claim in self.grid.claims for _, line in self.misses(claim)]


def cells(runs: list[Run], grid: Grid) -> list[Cell]:
    grouped: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in runs:
        key = (r.job, r.momentum, r.lr, r.seed)
        if r.form in grouped[key]:
            raise ValueError(f"two runs of {r.form} for {key}: give each experiment's folder once")
        grouped[key][r.form] = r.loss
    return [Cell(*key, losses, grid) for key, losses in sorted(grouped.items())]


def table(half: list[Cell], grid: Grid) -> str:
    """A markdown table: one row per job, momentum and lr, the baseline's loss and each column's x baseline
    per seed, and the cells that miss."""
    headers = [h for h, _ in grid.columns]
    rows = [f"| job | momentum | lr | {grid.baseline} loss | " + " | ".join(headers) + " | misses |",
            "|---|---|---|---|" + "---|" * len(headers) + "---|"]
    by_setting: dict[tuple, list[Cell]] = defaultdict(list)
    for c in half:
        by_setting[(c.job, c.momentum, c.lr)].append(c)
    for (job, momentum, lr), group in by_setting.items():
        per_seed = lambda form: ", ".join(f"{c.ratio(form):.2f}" for c in group)  # noqa: E731
        base = ", ".join(f"{c.losses.get(grid.baseline, math.nan):.4f}" for c in group)
        misses = "; ".join(f"seed {c.seed}: {f}" for c in group for f in c.failures()) or "none"
        rows.append(f"| {job} | {momentum:g} | {lr:g} | {base} | "
                    + " | ".join(per_seed(form) for _, form in grid.columns) + f" | {misses} |")
    return "\n".join(rows)


def report(all_cells: list[Cell], grid: Grid) -> str:
    chosen = [c for c in all_cells if c.job in grid.chosen_on]
    held = [c for c in all_cells if c.job not in grid.chosen_on]
    out = []
    for title, half in (("Chosen-on half", chosen), ("Held-out half", held)):
        ok = sum(not c.failures() for c in half)
        out += [f"### {title} ({', '.join(sorted({c.job for c in half})) or 'no runs'}): "
                f"{ok} of {len(half)} cells hold", "", table(half, grid), ""]
        for claim in grid.claims:  # each remedy on its own, and each half of its claim on its own
            kinds = [{kind for kind, _ in c.misses(claim)} for c in half]
            near = sum(not k & {"missing", "diverged", "ratio"} for k in kinds)
            better = sum(not k & {"missing", "diverged", "worse"} for k in kinds)
            out.append(f"- {claim.name}: {sum(not k for k in kinds)} of {len(half)} cells; within {grid.ratio:g}x "
                       f"of {grid.baseline} in {near}, no worse than {claim.without} in {better}")
        out.append("")
    return "\n".join(out)


def main(grid: Grid, doc: str, argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m psrv.experiments.harness.{grid.name}", description=doc.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="the experiments' output folders")
    args = parser.parse_args(argv)
    runs = [r for folder in args.folders for r in read_runs(folder, grid)]
    if not runs:
        print(f"no finished runs under {', '.join(map(str, args.folders))}", file=sys.stderr)
        return 2
    print(report(cells(runs, grid), grid))
    return 0
