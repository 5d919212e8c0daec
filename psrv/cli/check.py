"""`psrv check`: a run folder's history held against the model of a replicated parameter server.

    psrv check runs/default        # exit 0 clean, 1 a rule broken, 2 nothing to check
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from psrv.cli.common import log_level

DESCRIPTION = (
    "Read the events every process of a run recorded in DIR/history (docs/history.md) and check them against "
    "the model: (1) every push a worker was told was applied is applied exactly once in its shard's final "
    "lineage, and nothing no worker sent is applied; (2) no split brain: epochs begin in order, one replica "
    "acknowledges per epoch and none after it was fenced, whatever any replica acknowledged is in the final "
    "lineage, and no worker takes an answer from an older epoch than one it took; (3) sync: each commit holds "
    "exactly the pushes it needs and each clock commits once; (4) ssp: no pull is answered beyond the staleness "
    "bound; (5) summary.json's and server-K.json's pushes, updates_applied and version equal what the lineages "
    "hold. Prints the first violation (file:line, the rule, the event) or the counts checked. Exit status: 0 "
    "clean, 1 a rule broken, 2 nothing to check (not a run folder, no history, a corrupt one); --log-level INFO "
    "lists every violation. "
    "Example: psrv check runs/default")


def add(sub) -> None:
    c = sub.add_parser("check", help="check a run's recorded history: nothing lost, no split brain, the barrier, "
                       "the bound, the counts", description=DESCRIPTION)
    c.add_argument("run", type=Path, metavar="RUN_DIR", help="a run folder (psrv run --out DIR) with a history/")
    log_level(c, "WARNING")  # INFO: every violation, one line each


def command(a: argparse.Namespace) -> int:
    from psrv.experiments.launcher.history import check_run  # the harness: loaded by this command only
    result = check_run(a.run)
    log = logging.getLogger("psrv.check")
    for v in result.violations:
        log.info("%s", v)
    for why in result.skipped:
        log.info("not compared: %s", why)
    print(result.line())
    return 0 if result.ok else 1
