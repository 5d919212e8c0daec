"""The all-reduce baselines (no servers): DDP, FSDP (fully_shard) and ZeRO-1 (ZeroRedundancyOptimizer over
DDP), and local SGD over all-reduce, all on torch.distributed. One shared loop (`loop.py`) runs the PS
modes' job, data shards, seeds, optimizer, schedule, clip and evaluations under the wrapper the mode
names (`ddp.py`, `fsdp.py`, `zero.py`, `local.py`); `python -m psrv.workers.allreduce` is a rank of any of them."""
