"""Compressed pulls on the shard's side (psrv/codecs/pull.py): per worker that asked for them at HELLO,
the mirror of its copy of this shard's weights (error feedback) or the weights last sent to it, and which
copy it holds.

Memory: one float32 copy of the shard per such worker, kept until it leaves. One residual per worker, not
one shared in sync: a worker that rejoins, or whose reply was lost, holds another copy than the others, and
async and ssp answer each worker at its own version anyway. The price in sync is one encoding per worker
per clock.

A pull is answered dense, and the copy restarts from the weights, when the worker holds no copy this
shard knows: its first pull after a HELLO (a new worker, a reconnect, a restarted shard), a copy whose
number is not the one this shard last sent (a reply lost on the way, which the retry cannot repeat), the
`resync`-th pull since the last dense one (0: never), and rank 0's final pull, so the run ends on the
shard's exact weights. Every reply says the number of the copy it brings the worker to (`view`).

Streaming DiLoCo's fragment pulls (`answer_fragment`, psrv/server/fragments.py) bring only the fragment's
part of the copy up to date: the compressed change of the fragment's weights since the worker's copy of
them, encoded over the fragment's elements gathered in order (the same codec, mirror and settings; no more
memory). The dense rules hold per fragment: a fragment is pulled dense where this shard does not know the
worker's copy of it (after a HELLO, until a whole dense pull or that fragment's own dense pull; after a lost
reply, every fragment but the one the retry brings), and at every `resync`-th pull of that fragment, counted
per fragment (a count over all pulls would, with fragments taken in turn, resync the same one each time).

A shard's backups hold the same copies (psrv/server/replication/primary.py): a backup that joins gets them with the
shard's state (`state_dict`), numbers included, and then answers the same pulls alike. They are not in a
checkpoint: a restarted shard is another life, whose copies restart dense."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from psrv.codecs import Codec
from psrv.codecs.pull import decode_pull, encode_pull, make_pull_codec
from psrv.codecs.push import MAX_DENSE_RANGES, checked_ranges
from psrv.protocol import ErrorCode, Message, ProtocolError
from psrv.server.fragments import Key, numel
from psrv.server.validate import HelloAgain

MAX_RESYNC = 1 << 30
PULL_SEED = 1_000_000  # random-k's pulls draw from a stream of their own, seed PULL_SEED + worker (not the push's)


@dataclass
class WorkerCopy:
    """One worker's compressed pulls: its settings, and the copy this shard knows it holds."""

    codec: Codec
    ef: bool
    resync: int
    dense: list[list[int]]
    among: torch.Tensor | None
    fields: dict  # HELLO's `pull` map, as the worker sent it (a backup rebuilds the copy from it)
    ref: torch.Tensor | None = None  # the mirror of its copy (ef), or the weights last sent; None: none yet
    number: int = 0                  # the copy's number, as the last reply said it
    since_dense: int = 0             # compressed pulls since the last dense one
    whole: bool = False              # ref mirrors the copy everywhere (a whole dense pull made it so)
    known: set = field(default_factory=set)    # fragments (their keys) whose part of ref mirrors the copy
    since: dict = field(default_factory=dict)  # per fragment: its compressed pulls since its last dense one
    pieces: dict = field(default_factory=dict)  # per fragment: its ranges sent exactly (gathered order)

    def lost_track(self) -> None:
        """Nothing of ref mirrors the worker's copy any more (a HELLO, a lost reply)."""
        self.whole, self.known, self.since = False, set(), {}


def _config(fields, size: int, worker: int, shard: int) -> WorkerCopy:
    """HELLO's `pull` map, checked: MALFORMED with a one-line reason otherwise."""
    if not isinstance(fields, dict):
        raise ProtocolError(ErrorCode.MALFORMED, "HELLO's pull must be a map")
    spec, resync, dense = fields.get("codec"), fields.get("resync", 0), fields.get("dense", [])
    scale = fields.get("sign_scale", "l2")
    if not isinstance(resync, int) or isinstance(resync, bool) or not 0 <= resync <= MAX_RESYNC:
        raise ProtocolError(ErrorCode.MALFORMED, f"pull resync must be an integer in [0, {MAX_RESYNC}]; got {resync!r}")
    if scale not in ("l1", "l2"):
        raise ProtocolError(ErrorCode.MALFORMED, f"pull sign_scale must be l1 or l2; got {scale!r}")
    try:
        codec = make_pull_codec(spec if isinstance(spec, str) else "?", seed=PULL_SEED + worker,
                                sign_scale=scale).for_shard(shard)
    except ValueError as exc:
        raise ProtocolError(ErrorCode.MALFORMED, f"pull codec: {exc}") from None
    if not isinstance(dense, list) or len(dense) > MAX_DENSE_RANGES:
        raise ProtocolError(ErrorCode.MALFORMED, f"pull dense must be at most {MAX_DENSE_RANGES} ranges")
    checked_ranges(dense, size, sum(r[1] - r[0] for r in dense if isinstance(r, list) and len(r) == 2
                             and all(isinstance(v, int) for v in r)))
    among = None
    if dense:
        keep = torch.ones(size, dtype=torch.bool)
        for a, b in dense:
            keep[a:b] = False
        among = keep.nonzero().view(-1)
    return WorkerCopy(codec, bool(fields.get("error_feedback", True)), resync, dense, among, dict(fields))


class PullCopies:
    """The workers' copies of one shard (`shard`: its index, which a random-k codec's stream depends on)."""

    def __init__(self, shard: int = 0):
        self.shard = shard
        self.copies: dict[int, WorkerCopy] = {}
        self._numbers = random.Random().randrange(1, 1 << 40)  # another shard life's numbers match none of these

    def check(self, worker: int, fields, size: int) -> WorkerCopy | None:
        """HELLO's `pull` settings (None: dense pulls), checked before the HELLO changes anything."""
        return None if fields is None else _config(fields, size, worker, self.shard)

    def greet(self, worker: int, copy: WorkerCopy | None) -> None:
        """A HELLO: whatever copy the worker had is forgotten; its next pull is dense."""
        self.copies.pop(worker, None)
        if copy is not None:
            self.copies[worker] = copy

    def expect(self, msg: Message) -> None:
        """A pull that holds a copy (`view`) from a worker this shard has no settings for (it restarted, or
        resumed from a checkpoint, and the worker did not say HELLO since): HelloAgain, so the HELLO brings
        them and the re-sent pull is answered dense, instead of dense ever after."""
        if "view" in msg.fields and msg.worker not in self.copies:
            raise HelloAgain(f"worker {msg.worker} pulls compressed, but this shard holds no pull settings "
                             "for it (restarted?); send HELLO")

    def forget(self, worker: int) -> None:
        self.copies.pop(worker, None)

    def state_dict(self) -> dict:
        """The copies as plain data (settings, mirror, number, pulls since dense, a random codec's stream, which
        fragments' parts the mirror knows and their pulls since dense) and the last number given: what a
        backup needs to answer the next pull as this shard would."""
        copies = {}
        for worker, c in self.copies.items():
            generator = getattr(c.codec, "generator", None)
            copies[worker] = {"fields": c.fields, "ref": None if c.ref is None else c.ref.detach().cpu().clone(),
                              "number": c.number, "since_dense": c.since_dense,
                              "generator": None if generator is None else generator.get_state(), "whole": c.whole,
                              "known": sorted([list(r) for r in key] for key in c.known),
                              "since": sorted([[list(r) for r in key], n] for key, n in c.since.items())}
        return {"numbers": self._numbers, "copies": copies}

    def load_state_dict(self, state: dict, size: int, device: torch.device | str = "cpu") -> None:
        """Take the copies of `state` (from state_dict) in place of these, for a shard range of `size`."""
        copies = {}
        for worker, saved in state["copies"].items():
            c = _config(saved["fields"], size, int(worker), self.shard)
            c.ref = None if saved["ref"] is None else saved["ref"].to(device)
            c.number, c.since_dense = int(saved["number"]), int(saved["since_dense"])
            c.whole = bool(saved.get("whole", c.ref is not None))
            c.known = {_key(ranges) for ranges in saved.get("known", [])}
            c.since = {_key(ranges): int(n) for ranges, n in saved.get("since", [])}
            if saved["generator"] is not None:
                c.codec.generator.set_state(saved["generator"])
            copies[int(worker)] = c
        self.copies, self._numbers = copies, int(state["numbers"])

    @property
    def numbers(self) -> int:
        """The last copy number given (a backup that joins before any pull starts from its primary's)."""
        return self._numbers

    @numbers.setter
    def numbers(self, value: int) -> None:
        self._numbers = int(value)

    def answer(self, worker: int, weights: torch.Tensor, *, have, final: bool
               ) -> tuple[dict, torch.Tensor | None, dict | None, torch.Tensor]:
        """(reply fields, the dense tensor or None, the parts or None, the weights the worker now holds)."""
        c = self.copies.get(worker)
        if c is None:
            return {}, weights, None, weights
        self._numbers += 1
        dense = (final or c.ref is None or have != c.number or not c.whole
                 or (c.resync and c.since_dense + 1 >= c.resync))
        c.number = self._numbers
        if dense:
            if c.ref is None or c.ref.device != weights.device:
                c.ref = weights.detach().clone()
            else:
                c.ref.copy_(weights)
            c.since_dense = 0
            c.lost_track()
            c.whole = True  # every fragment's part too
            return {"view": c.number}, weights, None, weights
        if c.among is not None and c.among.device != weights.device:
            c.among = c.among.to(weights.device)
        fields, parts = encode_pull(c.codec, c.ref, weights, ef=c.ef, dense=c.dense, among=c.among)
        if c.ef:
            decode_pull(fields, parts, weights.numel()).apply_to(c.ref)
        else:
            c.ref.copy_(weights)
        c.since_dense += 1
        return {"view": c.number, "pull_codec": fields}, None, parts, c.ref if c.ef else weights

    def answer_fragment(self, worker: int, weights: torch.Tensor, key: Key, *, have, final: bool
                        ) -> tuple[dict, torch.Tensor | None, dict | None]:
        """A fragment pull's (reply fields, the fragment's weights dense or None, the parts or None): `key`, the
        fragment's sorted shard-relative [start, stop) ranges (module docstring)."""
        fresh = gathered(weights, key)
        c = self.copies.get(worker)
        if c is None:
            return {}, fresh, None
        self._numbers += 1
        if c.ref is None or have != c.number:
            c.lost_track()
        if c.ref is None:
            c.ref = weights.detach().clone()  # its values count only where a dense pull set them (known)
        c.number = self._numbers
        count = c.since.get(key, 0)
        if final or not key or not (c.whole or key in c.known) or (c.resync and count + 1 >= c.resync):
            scatter(fresh, c.ref, key)
            c.known.add(key)
            c.since[key] = 0
            return {"view": c.number}, fresh, None
        dense, among = self._pieces(c, key, weights.device)
        ref = gathered(c.ref, key)
        fields, parts = encode_pull(c.codec, ref, fresh, ef=c.ef, dense=dense, among=among)
        if c.ef:
            decode_pull(fields, parts, fresh.numel()).apply_to(ref)
        scatter(ref if c.ef else fresh, c.ref, key)
        c.since[key] = count + 1
        return {"view": c.number, "pull_codec": fields}, None, parts

    @staticmethod
    def _pieces(c: WorkerCopy, key: Key, device) -> tuple[list[list[int]], torch.Tensor | None]:
        """The fragment's ranges sent exactly (c.dense within it, in gathered order; kept per fragment) and the
        positions its codec covers (made per pull: an index the fragment's size, not kept)."""
        dense = c.pieces.get(key)
        if dense is None:
            dense = c.pieces[key] = within(c.dense, key)
        if not dense:
            return dense, None
        keep = torch.ones(numel(key), dtype=torch.bool, device=device)
        for a, b in dense:
            keep[a:b] = False
        return dense, keep.nonzero().view(-1)


def _key(ranges) -> Key:
    return tuple((int(a), int(b)) for a, b in ranges)


def gathered(t: torch.Tensor, key: Key) -> torch.Tensor:
    """The elements of `t` in the fragment's ranges, in order, as one new tensor."""
    return torch.cat([t[a:b] for a, b in key]) if key else t[:0].clone()


def scatter(values: torch.Tensor, t: torch.Tensor, key: Key) -> None:
    """t's elements in the fragment's ranges <- `values` (gathered's layout)."""
    at = 0
    for a, b in key:
        t[a:b].copy_(values[at:at + b - a])
        at += b - a


def within(dense: list[list[int]], key: Key) -> list[list[int]]:
    """The parts of the shard-relative ranges `dense` inside the fragment `key`, in its gathered coordinates,
    adjacent ones joined."""
    out: list[list[int]] = []
    at = 0
    for a, b in key:
        for lo, hi in dense:
            lo, hi = max(a, lo), min(b, hi)
            if lo >= hi:
                continue
            start, stop = at + lo - a, at + hi - a
            if out and out[-1][1] == start:
                out[-1][1] = stop
            else:
                out.append([start, stop])
        at += b - a
    return out
