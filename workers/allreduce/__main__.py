"""`python -m psrv.workers.allreduce`: one rank of an all-reduce baseline, DDP, FSDP, ZeRO-1 or local SGD as
--mode says (ddp when not given). `torchrun --nproc-per-node 2 -m psrv.workers.allreduce --mode fsdp --steps 20
--out run/worker-{rank}.json`, or `psrv run --mode fsdp`."""
import logging
import os
import sys

from psrv.workers.allreduce.main import main

code = main()
# Every output is written and closed by now. Leave without running C++ destructors: gloo's
# threads, torn down at interpreter exit, sometimes aborted a rank that had finished cleanly
# ("terminate called without an active exception"). The known cause, a group kept alive past
# destroy_process_group, is gone (psrv/client/collective.py init_group); this exit stays as a guard.
sys.stdout.flush()
sys.stderr.flush()
logging.shutdown()
os._exit(code)
