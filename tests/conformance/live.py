"""Which of a case's levels psrv can take at all: a level is *live* in a case where its path runs there (chunks
sent, early sends made, the NaN pushed, a staleness to correct), and *inert* where psrv cannot take it (the
case then equals the same case at another level). The covering array counts a pair only where both its
levels are live (covering.py), and every case shows what it claims (test_matrix.py: psrv's own counts for
the path and protocol levels, the reference's weights for the numeric ones, in both directions).

A non-default level's liveness is a rule of its own (`why_inert`). An axis's default level is live where
the axis is: where some other level of it would be a valid case and live there; a case's default
correction=on with no codec is as inert as its correction=off would be."""
from __future__ import annotations

import itertools

from tests.conformance.axes import AXES, DEFAULT, PATH_AXES, refusal, workers_of
from tests.conformance.job import CLASSES, FEATURES, HIDDEN

CHUNK_BYTES = int(0.1 * 2**20)  # axes.CHUNK_MB
PARAMS = FEATURES * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES
FREEZE = 2  # axes.run_config's onebit_adam freeze_step
BYTES = ("wire", "outer", "pull")  # shown by the bytes a shard took in or sent (evidence.py)
COUNTED = ("nonfinite", "backup")  # shown by the run's counts
MEASURED = tuple(a for a in AXES if a not in PATH_AXES + BYTES + COUNTED + ("shards",))  # by the reference


def _slice_bytes(c: dict) -> int:
    """The largest shard's dense push in bytes (wire dtype, or a bfloat16 outer gradient)."""
    two = c["wire"] != "float32" or (c["local"] > 1 and c["outer"] == "bfloat16")
    return -(-PARAMS // c["shards"]) * (2 if two else 4)


def why_inert(axis: str, c: dict) -> str | None:
    """Why axis's (non-default) level in case c cannot change what psrv does, or None where it is live."""
    level, rpc, pushers = c[axis], c["transport"] == "rpc", workers_of(c)
    if axis == "plane" and rpc:
        return "torch RPC has no zmq payload plane (auto finds none)"
    if axis == "chunks":
        for cond, why in ((rpc, "torch RPC sends a push whole"),
                          (c["mode"] == "sync", "a sync shard takes pushes whole (its clock's mean)"),
                          (c["rule"] not in ("plain", "staleness-lr", "cgad"), f"{c['rule']} takes a push whole"),
                          (c["codec"] != "none", "a compressed push goes whole"),
                          (c["fragments"] > 1, "a fragment goes whole"),
                          (c["local"] > 1 and c["outer"] in ("int8", "fp4"), "a quantised outer gradient goes whole"),
                          (c["plane"] == "shm" and c["wire"] == "float32" and (c["local"] == 1 or c["outer"] == "float32"),
                           "the shard reads the shared gradient in place over shm: it goes whole"),
                          (_slice_bytes(c) <= CHUNK_BYTES, "a shard's push fits one chunk")):
            if cond:
                return why
    if axis == "overlap":
        if rpc:
            return "psrv run's records hold no early-send count over torch RPC"
        if c["shards"] == 1:
            return "one shard: nothing to send before backward ends"
        if c["local"] > 1:
            return "local steps push after their inner steps, not during backward"
        if c["mode"] != "sync" and c["clip"]:
            return "a worker's clip (async, ssp) needs the whole gradient first"
    if axis == "ef":
        lossy = c["codec"] != "none" or c["optimizer"] == "onebit_adam" or c["pull"] != "none"
        if not lossy:
            return "no lossy codec either way: nothing to feed back"
    if axis == "correction":
        if not (c["codec"] != "none" and c["ef"] == "on" and c["optimizer"] in ("sgd", "nesterov")):
            return "momentum correction needs a lossy push codec, its error feedback and SGD momentum"
    if axis == "warmup" and c["optimizer"] == "onebit_adam":
        return f"onebit_adam compresses from its freeze step ({FREEZE}), after the warm-up's pushes"
    if axis == "rule":
        if c["mode"] == "sync":
            return "in sync every push is fresh (dn is SGD-Nesterov there)"
        if pushers < 2:
            return "one worker: every push is fresh (staleness 0)"
    if axis == "nonfinite":
        if pushers < 2:
            return "the NaN is rank 1's, and one worker runs"
        if c["mode"] == "sync" and c["backup"] and level == "skip" and (c["local"] == 1 or c["fragments"] > 1):
            return "with a backup worker the NaN push is second in its clock: dropped as late before it is looked at"
    if axis in ("quorum", "grace", "wait") and pushers < 2:
        return "one worker: each push merges alone, as sync's clock of one"
    if axis == "grace" and c["quorum"] == pushers:
        return "a quorum of every worker: its merges wait for all of them anyway"
    if axis == "mode" and level == "ssp" and pushers < 2:
        return "one worker: ssp is async"
    return None


def axis_inert(axis: str, c: dict) -> str | None:
    """Why axis is inert in case c (its own level's rule; for a default level, every other level's), or None."""
    if c[axis] != DEFAULT[axis]:
        return why_inert(axis, c)
    whys = []
    for other in AXES[axis][1:]:
        alt = {**c, axis: other}
        why = refusal(alt) or why_inert(axis, alt)
        if why is None:
            return None
        whys.append(why)
    return "no other level is live here: " + "; ".join(dict.fromkeys(whys))


def inert(c: dict, measured: dict | None = None) -> dict[str, str]:
    """axis -> why, for every axis whose level in case c is inert (by the rules; `measured`: what
    measure.py found besides, for this case)."""
    return {**{axis: why for axis in AXES if (why := axis_inert(axis, c))}, **(measured or {})}


def live_pairs(c: dict, measured: dict | None = None) -> set:
    """The pairs of case c's levels that are both live (each a pair of (axis, level) items, sorted)."""
    dead = inert(c, measured)
    items = sorted((a, v) for a, v in c.items() if a not in dead)
    return set(itertools.combinations(items, 2))


__all__ = ["BYTES", "COUNTED", "MEASURED", "axis_inert", "inert", "live_pairs", "why_inert"]
