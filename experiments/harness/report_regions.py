"""The report's "Regions" section: for each variant run under `--regions R` (its stored config), what crossed
between the regions and the global shards (summary.json's `hierarchy`), since the summary table's bytes / sample
counts the workers' own pushes and pulls, which under regional shards stay on their region's host."""
from __future__ import annotations

import json
from statistics import mean


def regions_lines(runs) -> list[str]:
    """`runs`: report_configs.stored_runs. Nothing where no variant ran in regions."""
    by_variant: dict[str, list[dict]] = {}
    for run in runs:
        if run.config is None or run.config.hierarchy.regions < 2:
            continue
        try:
            summary = json.loads((run.path / "summary.json").read_text())
        except (OSError, ValueError):
            continue
        by_variant.setdefault(run.variant, []).append(summary)
    if not by_variant:
        return []
    lines = ["## Regions", "", "Variants run with `--regions` (docs/algorithms.md, \"A hierarchy of servers\"): with "
             "regional shards, their syncs with the global shards are all that crosses between regions; the summary "
             "table's bytes / sample counts the workers' pushes and pulls, which then stay in their region. Means "
             "over repeats.", "",
             "| variant | regions | sync every | syncs | bytes between regions / sample | sync seconds |",
             "|---|---|---|---|---|---|"]
    for variant, summaries in by_variant.items():
        h = [s.get("hierarchy", {}) for s in summaries]
        if "syncs" not in h[0]:
            lines.append(f"| `{variant}` | {h[0].get('regions')} | flat (no regional shards) | — | see bytes / sample "
                         "| — |")
            continue
        samples = [s["samples_per_second"] * max(s["wall_seconds"] - s.get("eval_seconds", 0.0), 1e-9)
                   for s in summaries]
        per_sample = mean(x["sync_bytes"] / max(n, 1.0) for x, n in zip(h, samples))
        lines.append(f"| `{variant}` | {h[0]['regions']} | {h[0]['region_every']} | {mean(x['syncs'] for x in h):.1f} "
                     f"| {per_sample:.4g} | {mean(x['sync_seconds'] for x in h):.3g} |")
    return [*lines, ""]
