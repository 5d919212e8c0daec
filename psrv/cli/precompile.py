"""`python -m psrv.cli.precompile`: import what psrv's processes import, so that each of those modules' bytecode
is written once. The Makefile's set-up installs with `pip --no-compile` (pip would compile every module of torch
and of the test extras, most of which nothing here imports) and then runs this with bytecode writing on."""
from __future__ import annotations

import importlib

from psrv.cli.forkserver import PRELOAD

# beyond a run's processes: the harness's report and its plots (matplotlib), and torch RPC's transport
MORE = ("psrv.experiments.harness.report", "torch.distributed.rpc", "psrv.client")

if __name__ == "__main__":
    for name in PRELOAD + MORE:
        try:
            importlib.import_module(name)
        except ImportError:  # as the fork server skips what is not installed
            pass
