"""The report's Regions section (experiments/harness/report_regions.py): read from each run's stored config and
summary, the regional variant's bytes between regions per sample, a flat one said to be flat, none without regions."""
from __future__ import annotations

import json

from psrv.config import RunConfig, from_dict
from psrv.experiments.harness.report_configs import StoredRun
from psrv.experiments.harness.report_regions import regions_lines


def _run(tmp_path, name: str, tree: dict, hierarchy: dict | None) -> StoredRun:
    path = tmp_path / name
    path.mkdir()
    summary = {"samples_per_second": 1000.0, "wall_seconds": 2.5, "eval_seconds": 0.5,
               **({"hierarchy": hierarchy} if hierarchy else {})}
    (path / "summary.json").write_text(json.dumps(summary))
    return StoredRun(name, 0, path, from_dict(RunConfig, tree))


def test_regional_bytes_per_sample_and_flat_variants(tmp_path):
    runs = [_run(tmp_path, "regions", {"mode": "async", "cluster": {"workers": 4}, "hierarchy": {"regions": 2}},
                 {"regions": 2, "region_every": 20, "syncs": 10, "sync_bytes": 4000, "sync_seconds": 0.5}),
            _run(tmp_path, "flat", {"mode": "sync", "cluster": {"workers": 4},
                                    "hierarchy": {"regions": 2, "region_every": 0}}, {"regions": 2, "region_every": 0}),
            _run(tmp_path, "plain", {"mode": "sync"}, None)]
    text = "\n".join(regions_lines(runs))
    assert "| `regions` | 2 | 20 | 10.0 | 2 | 0.5 |" in text  # 4000 bytes over 1000 samples/s x (2.5 - 0.5) s
    assert "| `flat` | 2 | flat (no regional shards) |" in text and "`plain`" not in text
    assert regions_lines(runs[2:]) == []
