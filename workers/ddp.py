"""A rank of the all-reduce baselines (workers/allreduce): DDP, FSDP or ZeRO-1 as --mode says (ddp when
not given). `torchrun --nproc-per-node 2 -m psrv.workers.ddp --mode fsdp --steps 20 --out run/worker-{rank}.json`,
or `psrv run --mode fsdp`."""
from __future__ import annotations

import logging
import os
import sys

from psrv.workers.allreduce.loop import train_allreduce
from psrv.workers.allreduce.main import build_parser, main, rank_path

__all__ = ["build_parser", "main", "rank_path", "train_allreduce"]

if __name__ == "__main__":
    code = main()
    # Every output is written and closed by now. Leave without running C++ destructors: gloo's
    # threads, torn down at interpreter exit, sometimes abort a rank that has finished cleanly
    # ("terminate called without an active exception"), turning a good run into a failed one.
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)
