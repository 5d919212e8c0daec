"""Streaming DiLoCo on a shard (Douillard et al. 2025, arXiv:2501.18512): a push that carries one fragment of
the model, and the outer optimizer of that fragment alone.

A worker syncing fragment f sends, in its push's field `fragment`, the shard-relative [start, stop) ranges
the fragment holds in this shard (sorted, disjoint: the pieces of the fragment's tensors here), and as its
tensor (or compressed parts) only those elements, in that order. The shard keeps one `Shard` per fragment
(keyed by its ranges) with its own optimizer and update-rule state over the fragment's elements: in the
paper every fragment has its outer optimizer to itself, so an outer Nesterov momentum moves a fragment only
when that fragment is synced, never on another's clock. A step gathers the fragment's weights into its
Shard, steps it with the push (async, ssp: `apply`; sync: the clock's mean, `apply_accumulated`) and
scatters them back; the shard's version counts every fragment step. The reply of a push_pull carries the
fragment's weights only (`weights`), or under compressed pulls their compressed change since the worker's
copy of them (psrv/server/pulls/copies.py `answer_fragment`), so a fragment push and its pull each move 1/F of the
model.

A fragment may have no piece in a shard: that shard gets an empty push, stepped as an empty update so its
version moves with the others'. So that every shard decides alike on a non-finite push, the worker marks a
fragment push whose pseudo-gradient has a NaN or Inf anywhere with `nonfinite` (to every shard): each shard
then treats it as non-finite (--nonfinite), an empty or finite piece too.

Every push of a sync clock must carry the same fragment (the workers sync them in one order); a push of
another fragment, or a whole push, into a clock open with a fragment is refused, NOT_ALLOWED. Under a quorum
(`--quorum`, Decoupled DiLoCo's setting) each fragment has a merge of its own (psrv/server/consistency/quorum.py,
its part: `part_of`), which takes that fragment's pushes as workers at different clocks send them and steps it
once, on their mean, when it closes; merges of several fragments are open at once (a whole push still cannot
join fragments, nor they it). The
per-fragment optimizer states are in the shard's state (`state_dict`, checkpoints/snapshot.py), so a checkpoint
holds them (a --resume goes on with each fragment's lr schedule) and a backup that joins gets them, so a
failover loses none.
"""
from __future__ import annotations

from collections import Counter

import torch

from psrv.codecs import Decoded
from psrv.protocol import ErrorCode, Message, ProtocolError
from psrv.server.rules import PushContext
from psrv.server.shard import Shard

MAX_RANGES = 4096  # keeps the header far under its 64 KiB

Key = tuple[tuple[int, int], ...]


def fragment_key(msg: Message, size: int) -> Key | None:
    """The fragment a push or pull names (field `fragment`), checked against a shard of `size`: sorted,
    disjoint [start, stop) pairs within it; None where it names none; MALFORMED otherwise."""
    ranges = msg.fields.get("fragment")
    if ranges is None:
        return None
    if "chunk" in msg.fields:
        raise ProtocolError(ErrorCode.MALFORMED, "a fragment push goes whole, not in chunks")
    if not isinstance(ranges, list) or len(ranges) > MAX_RANGES:
        raise ProtocolError(ErrorCode.MALFORMED, f"fragment must be a list of at most {MAX_RANGES} [start, stop] pairs")
    end = 0
    for r in ranges:
        if not (isinstance(r, list) and len(r) == 2 and all(type(v) is int for v in r) and end <= r[0] < r[1] <= size):
            raise ProtocolError(ErrorCode.MALFORMED, f"fragment range {r!r} is not a sorted, disjoint "
                                f"[start, stop) within [0, {size})")
        end = r[1]
    return tuple((a, b) for a, b in ranges)


def numel(key: Key) -> int:
    return sum(b - a for a, b in key)


def part_of(key: Key) -> int:
    """The fragment's id in this shard, a quorum's merge's part: its first element (fragments are disjoint);
    -1 for one with no piece here (all such fragments of a shard share one empty Shard, and so one merge)."""
    return key[0][0] if key else -1


class FragmentShards:
    """The per-fragment optimizers of one shard, and the fragments of the open sync clock or quorum merges."""

    def __init__(self) -> None:
        self._shards: dict[Key, Shard] = {}
        self.open: list[Key] = []  # the fragments the open sync clock (one) or quorum merges accumulate, as they came

    @property
    def accumulated(self) -> int:
        """Pushes in the open clock's or merges' fragment sums."""
        return sum(self._shards[key].accumulated for key in self.open)

    def _keys(self, part: int | None) -> list[Key]:
        return list(self.open) if part is None else [key for key in self.open if part_of(key) == part]

    def rule_counts(self) -> Counter:
        """What the fragments' update rules did (UpdateRule.counts), summed."""
        return sum((Counter(sub.rule.counts()) for sub in self._shards.values()), Counter())

    def apply(self, shard: Shard, key: Key, grad: torch.Tensor | Decoded, ctx: PushContext) -> float:
        """One step of the fragment's own optimizer with `grad` (async, ssp); returns the rule's lr scale."""
        sub = self._gathered(shard, key)  # a fragment with no piece here steps an empty one: the rule still counts it
        scale = sub.apply(grad, ctx)
        self._scatter(shard, key, sub)
        return scale

    def accumulate(self, shard: Shard, key: Key, grad: torch.Tensor | Decoded, *, merge: bool, weight: int) -> None:
        """Add `grad` (times `weight`) to fragment `key`'s sum in the open sync clock, or with `merge` in its
        open quorum merge (other fragments' may be open beside it); NOT_ALLOWED for a fragment where whole pushes are
        accumulating, and in a sync clock for another fragment than its own."""
        if shard.accumulated or not merge and self.open and self.open != [key]:
            raise ProtocolError(ErrorCode.NOT_ALLOWED, "this sync clock accumulates another fragment (or the whole "
                                "shard): every worker must sync the same fragment at the same clock")
        self._sub(shard, key).accumulate(grad, weight=weight)
        if key not in self.open:
            self.open.append(key)

    def check_whole(self) -> None:
        """A whole push may join the open sync clock or merge only where no fragment accumulates."""
        if self.open:
            raise ProtocolError(ErrorCode.NOT_ALLOWED, "this sync clock accumulates a fragment; a whole push "
                                "cannot join it")

    def apply_accumulated(self, shard: Shard, part: int | None = None) -> list[int]:
        """The open clock's step, or a quorum's merge's of `part`: the fragment's optimizer with the mean of its
        pushes (an update: it moves the shard's version by one); returns its pushes, in a list."""
        keys, steps = self._keys(part), []
        self.open = [key for key in self.open if key not in keys]
        for key in keys:
            sub = self._gathered(shard, key)
            steps.append(sub.apply_accumulated())
            self._scatter(shard, key, sub)
        return steps

    def state_dict(self) -> dict:
        """Each fragment's ranges and its Shard's state_dict (its outer optimizer), and the open clock's."""
        return {"opened": [[list(r) for r in key] for key in self.open],
                "fragments": [[[list(r) for r in key], sub.state_dict()] for key, sub in self._shards.items()]}

    def load_state_dict(self, state: dict, shard: Shard) -> None:
        """Take the fragments of `state` (from state_dict) in place of these, beside `shard`."""
        subs = {}
        for ranges, saved in state["fragments"]:
            key = tuple((int(a), int(b)) for a, b in ranges)
            sub = Shard(numel(key), shard.optim_cfg, device=str(shard.device))
            sub.load_state_dict(saved)
            subs[key] = sub
        self._shards = subs
        self.open = [tuple((int(a), int(b)) for a, b in key) for key in _open_keys(state)]

    def _sub(self, shard: Shard, key: Key) -> Shard:
        sub = self._shards.get(key)
        if sub is None:
            if shard.rule.records_pulls or shard.optim_cfg.clip_grad_norm:
                raise ProtocolError(ErrorCode.NOT_ALLOWED, "this shard clips by the global norm or corrects by each "
                                    "worker's pulled weights (dc-asgd): it takes whole pushes, not fragments")
            # its weights are the shard's own, gathered before each step (`_gathered`): nothing reads whether it
            # was initialised, so it is left as made (mutation testing showed `initialised = True` did nothing)
            sub = self._shards[key] = Shard(numel(key), shard.optim_cfg, device=str(shard.device))
        return sub

    def _gathered(self, shard: Shard, key: Key) -> Shard:
        sub = self._sub(shard, key)
        at = 0
        for a, b in key:
            sub.weights[at:at + b - a].copy_(shard.weights[a:b])
            at += b - a
        return sub

    def _scatter(self, shard: Shard, key: Key, sub: Shard) -> None:
        at = 0
        for a, b in key:
            shard.weights[a:b].copy_(sub.weights[at:at + b - a])
            at += b - a
        shard.version += 1


def _open_keys(state: dict) -> list:
    """The open fragments' saved ranges: `opened`, or from a state saved before quorum merges took fragments,
    `open` (one fragment's ranges, or None)."""
    if "opened" in state:
        return state["opened"]
    return [] if state["open"] is None else [state["open"]]
