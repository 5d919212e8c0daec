"""Error feedback's quality grid at other top-k ratios (experiments/specs/ef_ratios.toml): top-k 0.1% and 2%
with and without error feedback against dense pushes, judged as experiments/harness/ef_quality.py judges 0.5% and
sign (the same jobs, split, ratio and claim), from each run's stored config.json and summary.json.

    python -m psrv.experiments.harness.ef_ratios runs/ef_ratios-digits_mlp runs/ef_ratios-mnist1d_mlp ...
"""
from __future__ import annotations

import sys

from psrv.experiments.harness import quality_grid
from psrv.experiments.harness.ef_quality import grid

CODECS = ("topk:0.001", "topk:0.02")
GRID = grid("ef_ratios", CODECS)

if __name__ == "__main__":
    sys.exit(quality_grid.main(GRID, __doc__))
