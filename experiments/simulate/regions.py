"""A hierarchy of servers, simulated at the timing level (`psrv simulate --regions R --region-every K`;
psrv/server/hierarchy/upstream.py is what runs for real).

Each region is a cluster of its own (experiments/simulate/cluster.py): its contiguous ranks and its `--servers`
shards, asynchronous, on the simulator's network (`--latency-ms`, `--bandwidth-gbps`). Its workers never wait
for the global shards, so the regions are simulated one after another, each worker with the compute times it
has in a flat run. Then each regional shard's syncs with its global shard are laid over the times its updates
were applied: a sync leaves once K updates have come since the last and none is in flight, carrying every
update applied by then; it crosses the link between regions (`--region-latency-ms`, `--region-bandwidth-gbps`)
as a float32 delta of the shard's slice, waits its turn on the global shard's link and thread (first come,
first served among the regions' syncs, by the time they leave), and comes back as the global weights. After a
region's last update a last sync takes what is left. What is not simulated: a merge's own time on the regional
shard's thread, the regional shard's link carrying the syncs beside its workers' messages, learning (the level
is timing), failures."""
from __future__ import annotations

import bisect
import heapq
from collections import Counter

from psrv.config.hierarchy import ranks_of
from psrv.experiments.simulate.cluster import Recorded

HEADER_BYTES = 64  # as experiments/simulate/network.py's


def merge(records: list[Recorded], firsts: list[int], sample: int) -> Recorded:
    """One Recorded of the regions' (region r's workers numbered from `firsts[r]`); the sampled workers are the
    run's first `sample` ranks. The span while every rank ran is not kept (no goodput with regions)."""
    out = Recorded(staleness=Counter(), clock_gap=Counter())
    for rec, first in zip(records, firsts):
        out.staleness.update(rec.staleness)
        out.clock_gap.update(rec.clock_gap)
        out.compute += rec.compute
        out.communication += rec.communication
        out.wait += rec.wait
        out.pushes += rec.pushes
        out.dropped += rec.dropped
        out.updates += rec.updates
        out.end += rec.end
        out.failures += rec.failures
        out.lost_steps += rec.lost_steps
        out.dropped_steps += rec.dropped_steps
        if rec.first_push is not None:
            out.first_push = rec.first_push if out.first_push is None else min(out.first_push, rec.first_push)
        out.rows += [{**row, "worker": row["worker"] + first} for row in rec.rows if row["worker"] + first < sample]
    out.rows.sort(key=lambda row: (row["worker"], row["step"]))
    return out


def syncs(update_times: list[list[list[float]]], *, every: int, slice_bytes: list[float], latency: float,
          bandwidth: float, server_seconds: float) -> dict:
    """The syncs of every regional shard: `update_times[r][s]`, the times region r's shard s applied its updates
    (sorted); `slice_bytes[s]`, shard s's float32 slice. summary.json's `hierarchy` block."""
    total_syncs, sync_bytes, global_updates, waits, ends = 0, 0.0, [], [], []
    for s, size in enumerate(slice_bytes):
        message = size + HEADER_BYTES
        transfer = message / bandwidth
        in_free = out_free = busy = 0.0
        sent = [0] * len(update_times)    # updates each region has synced
        queue = []                        # (when its next sync leaves, region)
        for r, times in enumerate(update_times):
            start = _next(times[s], 0, 0.0, every)
            if start is not None:
                heapq.heappush(queue, (start, r))
        count = 0
        while queue:
            start, r = heapq.heappop(queue)
            times = update_times[r][s]
            sent[r] = bisect.bisect_right(times, start)     # every update applied by then goes
            arrive = max(start + latency, in_free) + transfer  # the global shard's link, first come first served
            in_free = arrive
            done = max(arrive, busy) + server_seconds        # its thread: one step on the delta
            busy = done
            out = max(done, out_free) + transfer
            out_free = out
            back = out + latency
            waits.append(back - start)
            count += 1
            nxt = _next(times, sent[r], back, every)
            if nxt is None:
                ends.append(back)
            else:
                heapq.heappush(queue, (nxt, r))
        total_syncs += count
        sync_bytes += 2.0 * count * message
        global_updates.append(count)
    return {"syncs": total_syncs, "sync_bytes": sync_bytes, "global_updates": global_updates,
            "mean_sync_seconds": sum(waits) / len(waits) if waits else None,
            "syncs_end_seconds": max(ends, default=0.0)}


def _next(times: list[float], sent: int, free: float, every: int) -> float | None:
    """When a region's next sync leaves: once `every` updates have come since the `sent` synced and the last sync
    is back (`free`); after its last update, one more for what is left; None when nothing is left."""
    if sent + every <= len(times):
        return max(free, times[sent + every - 1])
    if sent < len(times):
        return max(free, times[-1])
    return None


def region_ranks(workers: int, regions: int) -> list[range]:
    return [ranks_of(r, workers, regions) for r in range(regions)]
