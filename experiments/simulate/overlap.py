"""When a simulated worker's slices become ready during backward (a real worker's `overlap`, psrv/client/overlap.py).

With `overlap` on and several shards, a real worker sends each shard's slice from autograd's hook as soon as
backward has finished every parameter overlapping that shard's range: the hook encodes the slice on the worker's
own thread (so the encode delays the rest of backward) and hands the frames to the transport, whose link then
carries them while backward goes on. A step's recorded compute_seconds (from step() returning to step() being
called again) therefore holds forward, backward and every early slice's encode.

The model: a step's compute without the encodes is forward (`forward_fraction` of it) then backward, which
produces the parameters' gradients from the last to the first at a pace proportional to their element counts. A
shard's slice is ready when backward has passed the first parameter overlapping its range; slices finishing
together go out in shard order, as ShardReadiness calls them."""
from __future__ import annotations

import json
from pathlib import Path

from psrv.partition import PartitionPlan


def overlaps(cfg) -> bool:
    """Whether a real worker of `cfg` sends its slices during backward: the condition psrv.Worker arms
    ShardReadiness under (psrv/client/session.py)."""
    clip_here = bool(cfg.optimizer.clip_grad_norm) and cfg.mode != "sync"  # sync: the servers clip
    return (cfg.worker.overlap and cfg.cluster.servers > 1 and not clip_here
            and not cfg.worker.local_updates)


def ready_order(plan: PartitionPlan, forward_fraction: float) -> list[tuple[int, float]]:
    """[(shard, the fraction of a step's compute, encodes left out, after which its slice is final)], in the
    order a real worker sends them."""
    left = [0] * plan.num_shards
    owners, offset = [], 0
    for p in plan.params:
        lo, hi = offset, offset + p.numel
        offset = hi
        shards = [s for s, (a, b) in enumerate(plan.ranges) if a < hi and lo < b]
        owners.append(shards)
        for s in shards:
            left[s] += 1
    order, done = [], 0
    for p, shards in zip(reversed(plan.params), reversed(owners)):  # backward: the last parameter first
        done += p.numel
        for s in shards:
            left[s] -= 1
            if left[s] == 0:
                order.append((s, forward_fraction + (1.0 - forward_fraction) * done / plan.total))
    return order


def compute_holds_encodes(steps_csv: str | Path) -> bool:
    """Whether the real run that wrote `steps_csv` sent every shard's slice during backward at every push
    (its worker-N.json records: early_sends equal to pushes times shards), so that its steps' compute_seconds
    already hold those encodes. False without such records (a simulated run's steps, say)."""
    folder = Path(steps_csv).parent
    early = pushes = 0
    try:
        shards = int(json.loads((folder / "config.json").read_text())["cluster"]["servers"])
        for record in folder.glob("worker-*.json"):
            data = json.loads(record.read_text())
            early += int(data.get("early_sends") or 0)
            pushes += int(data.get("pushes") or 0)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return pushes > 0 and early == pushes * shards
