"""Error feedback's quality grid (experiments/specs/ef_quality.toml): the held-out loss of top-k and sign
with error feedback against dense pushes and against the same codec without error feedback, cell by
cell, from each run's stored config.json and summary.json (never from the spec's text).

    python -m psrv.experiments.ef_quality runs/ef_quality-digits_mlp runs/ef_quality-mnist1d_mlp ...

A cell is one job, momentum, lr and seed. It holds where, for each codec, the error-feedback run's loss is
within RATIO (1.3) of the dense run's and no worse than the run without error feedback. The grid is split
by job before any of it ran: CHOSEN_ON are the jobs the defaults were chosen on, every other job is
held out; the claim in docs/compression.md is the held-out half's.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from psrv.experiments.provenance import stored_config

RATIO = 1.3  # error feedback's loss within this factor of dense pushes'
CHOSEN_ON = ("digits_mlp", "mnist1d_mlp")  # the warm-up, masking and sign scale were chosen on these
CODECS = ("topk:0.005", "sign")


@dataclass(frozen=True)
class Run:
    job: str
    momentum: float
    lr: float
    seed: int
    push: str  # "dense", or "<codec> ef" / "<codec> no ef"
    loss: float


def read_runs(folder: Path) -> list[Run]:
    """Every finished run under an experiment's folder (<variant>/rep-<k>/ with a summary.json)."""
    runs = []
    for summary in sorted(folder.glob("*/rep-*/summary.json")):
        cfg = stored_config(summary.parent)
        codec = cfg.worker.compress
        push = "dense" if not codec else f"{codec} {'ef' if cfg.worker.error_feedback else 'no ef'}"
        loss = json.loads(summary.read_text()).get("final_loss")
        runs.append(Run(cfg.job.name, cfg.optimizer.momentum, cfg.optimizer.lr, cfg.seed, push,
                        float("nan") if loss is None else float(loss)))
    return runs


@dataclass(frozen=True)
class Cell:
    """One job, momentum, lr and seed: each push form's loss, and what the criterion says of it."""

    job: str
    momentum: float
    lr: float
    seed: int
    losses: dict[str, float]

    def ratio(self, push: str) -> float:
        return self.losses.get(push, math.nan) / self.losses.get("dense", math.nan)

    def failures(self) -> list[str]:
        """What this cell misses: '<codec>: x dense' past RATIO, '<codec>: worse than no ef', or a run missing."""
        out = []
        for codec in CODECS:
            ef, no_ef = self.losses.get(f"{codec} ef"), self.losses.get(f"{codec} no ef")
            if ef is None or no_ef is None or "dense" not in self.losses:
                out.append(f"{codec}: a run is missing")
                continue
            ratio = self.ratio(f"{codec} ef")
            if not ratio <= RATIO:  # a NaN fails
                out.append(f"{codec}: {ratio:.2f}x dense")
            if not ef <= no_ef:
                out.append(f"{codec}: worse than no ef ({ef:.4f} > {no_ef:.4f})")
        return out


def cells(runs: list[Run]) -> list[Cell]:
    grouped: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in runs:
        key = (r.job, r.momentum, r.lr, r.seed)
        if r.push in grouped[key]:
            raise ValueError(f"two runs of {r.push} for {key}: give each experiment's folder once")
        grouped[key][r.push] = r.loss
    return [Cell(*key, losses) for key, losses in sorted(grouped.items())]


def table(half: list[Cell]) -> str:
    """A markdown table: one row per job, momentum and lr, each codec's x dense per seed (with and without
    error feedback), and the cells that miss."""
    rows = ["| job | momentum | lr | dense loss | top-k EF x dense | top-k no EF | sign EF x dense | sign no EF | misses |",
            "|---|---|---|---|---|---|---|---|---|"]
    by_setting: dict[tuple, list[Cell]] = defaultdict(list)
    for c in half:
        by_setting[(c.job, c.momentum, c.lr)].append(c)
    for (job, momentum, lr), group in by_setting.items():
        per_seed = lambda push: ", ".join(f"{c.ratio(push):.2f}" for c in group)  # noqa: E731
        dense = ", ".join(f"{c.losses.get('dense', math.nan):.4f}" for c in group)
        misses = "; ".join(f"seed {c.seed}: {f}" for c in group for f in c.failures()) or "none"
        rows.append(f"| {job} | {momentum:g} | {lr:g} | {dense} | {per_seed('topk:0.005 ef')} | "
                    f"{per_seed('topk:0.005 no ef')} | {per_seed('sign ef')} | {per_seed('sign no ef')} | {misses} |")
    return "\n".join(rows)


def report(all_cells: list[Cell]) -> str:
    chosen = [c for c in all_cells if c.job in CHOSEN_ON]
    held = [c for c in all_cells if c.job not in CHOSEN_ON]
    out = []
    for title, half in (("Chosen-on half", chosen), ("Held-out half", held)):
        ok = sum(not c.failures() for c in half)
        out += [f"### {title} ({', '.join(sorted({c.job for c in half})) or 'no runs'}): "
                f"{ok} of {len(half)} cells hold", "", table(half), ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m psrv.experiments.ef_quality", description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="the experiments' output folders")
    args = parser.parse_args(argv)
    runs = [r for folder in args.folders for r in read_runs(folder)]
    if not runs:
        print(f"no finished runs under {', '.join(map(str, args.folders))}", file=sys.stderr)
        return 2
    print(report(cells(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
