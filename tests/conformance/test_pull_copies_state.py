"""The shard's side of compressed pulls (psrv/server/pulls/copies.py) where the matrix's runs do not look closely:

- a backup given the copies' state (`state_dict`, through torch.save's bytes as a replica's join sends it) answers
  every later pull, whole and per fragment, as its primary does, across each resync period, a lost reply and a
  random-k stream, and holds the same copy after each;
- a fragment pull sends the fragment's dense ranges exactly and leaves the rest of the copy alone;
- the fragments' coordinates (`within`, `gathered`, `scatter`) against element masks written here.

The references are element lists and masks built in this file, not psrv's range arithmetic."""
from __future__ import annotations

import io
import math
import random

import pytest
import torch

from psrv.server.pulls.copies import PullCopies, gathered, scatter, within

SIZE = 600
DENSE = [[10, 30], [250, 260], [590, 600]]  # sent exactly: inside fragments, across their edges, at the end
KEYS = (((0, 100), (300, 350)), ((100, 300),), ((350, 600),))  # three fragments of the shard, in gathered order


def _fields(codec: str, *, ef: bool, resync: int) -> dict:
    return {"codec": codec, "resync": resync, "dense": DENSE, "error_feedback": ef, "sign_scale": "l1"}


def _same_answer(mine: tuple, theirs: tuple) -> None:
    assert mine[0] == theirs[0]
    for a, b in zip(mine[1:], theirs[1:]):
        if isinstance(a, dict):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        else:
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b))


def _same_copy(mine, theirs) -> None:
    assert (mine.ref is None) == (theirs.ref is None) and (mine.ref is None or torch.equal(mine.ref, theirs.ref))
    assert (mine.number, mine.since_dense, mine.whole, mine.known, mine.since) == \
        (theirs.number, theirs.since_dense, theirs.whole, theirs.known, theirs.since)


def _through_bytes(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf)


@pytest.mark.parametrize("codec,ef", [("randomk:0.1", True), ("topk:0.05", True), ("topk:0.05", False),
                                      ("int8", True)])
def test_a_backup_given_the_copies_state_answers_every_later_pull_as_its_primary(codec, ef):
    gen = torch.Generator().manual_seed(7)
    weights = torch.randn(SIZE, generator=gen)
    primary = PullCopies(shard=1)
    primary.greet(0, primary.check(0, _fields(codec, ef=ef, resync=4), SIZE))
    primary.greet(3, primary.check(3, _fields(codec, ef=ef, resync=3), SIZE))
    primary.greet(5, primary.check(5, _fields(codec, ef=ef, resync=0), SIZE))  # fragment pulls only: never whole
    have = {0: None, 3: None, 5: None}

    def pull(shards: list[PullCopies], worker: int, kind: int, lost: bool = False) -> None:
        weights.add_(torch.randn(SIZE, generator=gen) * 0.1)
        asked = have[worker] if not lost else -1  # a lost reply: the worker holds another copy than the one sent
        if kind < 0:
            answers = [s.answer(worker, weights, have=asked, final=False) for s in shards]
        else:
            answers = [s.answer_fragment(worker, weights, KEYS[kind], have=asked, final=False) for s in shards]
        for other in answers[1:]:
            _same_answer(answers[0], other)
        for s in shards[1:]:
            _same_copy(shards[0].copies[worker], s.copies[worker])
        have[worker] = answers[0][0]["view"]

    for worker, kind in [(0, -1), (3, -1), (0, 0), (0, 1), (3, 2), (0, -1), (0, 0), (3, -1), (5, 1), (5, 1)]:
        pull([primary], worker, kind)  # the primary alone, before the backup joins
    assert not primary.copies[5].whole and primary.copies[5].known == {KEYS[1]}  # its copy known in part
    backup = PullCopies(shard=1)
    backup.load_state_dict(_through_bytes(primary.state_dict()), SIZE)
    assert backup.numbers == primary.numbers and backup.copies.keys() == primary.copies.keys()
    for worker in (0, 3, 5):
        _same_copy(primary.copies[worker], backup.copies[worker])
    script = [(0, 0), (5, 1), (0, 0), (0, 1), (5, 0), (3, 2), (0, -1), (3, 2), (0, 2), (0, 0), (3, -1), (0, 1),
              (3, 0), (0, 0), (0, 2), (3, 2), (3, 2), (5, 0), (0, -1), (0, 1), (0, 1), (5, -1)]
    for i, (worker, kind) in enumerate(script):
        pull([primary, backup], worker, kind, lost=(i == 11))
    # the script crossed each resync period and the lost reply: dense and compressed answers both came
    assert primary.copies[0].since and any(n > 0 for n in primary.copies[0].since.values())


@pytest.mark.parametrize("codec", ["topk:0.05", "randomk:0.1"])
def test_a_state_written_before_the_copies_knew_fragments_loads_as_whole_copies(codec):
    """A checkpoint of the same format (psrv/checkpoint.py FORMAT 1) written before fragment pulls came holds no
    `whole`, `known` or `since` for a copy: a copy with a mirror was whole then, one without none yet. Loaded,
    it is the copy its primary holds after whole pulls only, and answers the later pulls as its primary."""
    gen = torch.Generator().manual_seed(3)
    weights = torch.randn(SIZE, generator=gen)
    primary = PullCopies(shard=0)
    for worker in (0, 2, 4):
        primary.greet(worker, primary.check(worker, _fields(codec, ef=True, resync=3), SIZE))
    have = {0: None, 2: None, 4: None}

    def pull(shards: list[PullCopies], worker: int) -> None:
        weights.add_(torch.randn(SIZE, generator=gen) * 0.1)
        answers = [sh.answer(worker, weights, have=have[worker], final=False) for sh in shards]
        for other in answers[1:]:
            _same_answer(answers[0], other)
        have[worker] = answers[0][0]["view"]

    for worker in (0, 2, 0, 2, 0):  # rank 4 never pulls: no mirror yet
        pull([primary], worker)
    old = _through_bytes(primary.state_dict())
    for saved in old["copies"].values():
        for key in ("whole", "known", "since"):
            del saved[key]
    backup = PullCopies(shard=0)
    backup.load_state_dict(old, SIZE)
    assert [backup.copies[w].whole for w in (0, 2, 4)] == [True, True, False]
    for worker in (0, 2, 4):
        _same_copy(primary.copies[worker], backup.copies[worker])
    for worker in (0, 2, 4, 0, 4, 2, 0, 0, 4):
        pull([primary, backup], worker)
    for worker in (0, 2, 4):
        _same_copy(primary.copies[worker], backup.copies[worker])


def test_a_fragment_pull_sends_its_dense_ranges_exactly_and_leaves_the_rest_of_the_copy():
    gen = torch.Generator().manual_seed(3)
    copies = PullCopies(shard=0)
    copies.greet(0, copies.check(0, _fields("topk:0.01", ef=True, resync=0), SIZE))
    weights = torch.randn(SIZE, generator=gen)
    fields, *_ = copies.answer(0, weights, have=None, final=False)  # dense: the copy is the weights
    have = fields["view"]
    exact = torch.zeros(SIZE, dtype=torch.bool)
    for a, b in DENSE:
        exact[a:b] = True
    for key in KEYS * 2:
        before = copies.copies[0].ref.clone()
        # the dense ranges move the most: a codec that also covered them would spend its k there
        weights = weights + torch.randn(SIZE, generator=gen) + 50.0 * exact
        fields, tensor, parts = copies.answer_fragment(0, weights, key, have=have, final=False)
        have = fields["view"]
        assert tensor is None and "pull_codec" in fields  # compressed: top-k 1% of the fragment
        ref = copies.copies[0].ref
        inside = torch.zeros(SIZE, dtype=torch.bool)
        for a, b in key:
            inside[a:b] = True
        assert torch.equal(ref[~inside], before[~inside])  # another fragment's part of the copy: untouched
        assert torch.equal(ref[inside & exact], weights[inside & exact])  # the dense ranges: exact
        lossy = (inside & ~exact).nonzero().view(-1)  # the rest of the fragment: its top 1% by the change
        k = math.ceil(0.01 * lossy.numel())
        top = lossy[torch.topk((weights - before)[lossy].abs(), k).indices]
        expect = before.clone()
        expect[inside & exact] = weights[inside & exact]
        expect[top] = weights[top]
        assert torch.equal(ref, expect)


def _element_ranges(mask: list[bool]) -> list[list[int]]:
    out: list[list[int]] = []
    for i, on in enumerate(mask):
        if on and out and out[-1][1] == i:
            out[-1][1] = i + 1
        elif on:
            out.append([i, i + 1])
    return out


@pytest.mark.parametrize("seed", range(20))
def test_the_fragments_coordinates_against_element_lists(seed):
    rng = random.Random(seed)
    size = rng.randrange(5, 60)
    cuts = sorted(rng.sample(range(size + 1), rng.randrange(2, min(size, 8) + 1)))
    pieces = [(a, b) for a, b in zip(cuts, cuts[1:]) if a < b]
    key = tuple(sorted(rng.sample(pieces, rng.randrange(1, len(pieces) + 1)))) if pieces else ()
    marks = sorted(rng.sample(range(size + 1), 2 * rng.randrange(0, min(size, 8) // 2 + 1)))
    dense = [[a, b] for a, b in zip(marks[::2], marks[1::2]) if a < b]
    elements = [i for a, b in key for i in range(a, b)]  # the fragment's elements, in gathered order
    in_dense = [any(a <= i < b for a, b in dense) for i in elements]
    assert within(dense, key) == _element_ranges(in_dense)

    t = torch.arange(size, dtype=torch.float32) * 1.5
    assert gathered(t, key).tolist() == [t[i].item() for i in elements]
    values = torch.arange(len(elements), dtype=torch.float32) - 100
    out = t.clone()
    scatter(values, out, key)
    expect = t.clone()
    for j, i in enumerate(elements):
        expect[i] = values[j]
    assert torch.equal(out, expect)


def test_a_copy_number_given_twice_never_passes_for_the_copy_the_worker_holds():
    """Two replies lost in a row, a fragment's then a whole one: the worker still holds the copy of the reply before
    them, so its next pulls, of a fragment and whole, come dense. The numbers the shard gives only grow, so none
    of a lost reply's comes back to match the one the worker holds."""
    copies = PullCopies(shard=0)
    copies.greet(0, copies.check(0, _fields("topk:0.05", ef=True, resync=0), SIZE))
    weights = torch.randn(SIZE, generator=torch.Generator().manual_seed(5))
    held = copies.answer(0, weights, have=None, final=False)[0]["view"]
    given = [held]
    for lost in (lambda: copies.answer_fragment(0, weights + 1, KEYS[0], have=held, final=False),
                 lambda: copies.answer(0, weights + 2, have=held, final=False)):
        given.append(lost()[0]["view"])  # never reaches the worker
    assert len(set(given)) == 3 and given == sorted(given)
    fields, tensor, parts = copies.answer_fragment(0, weights + 3, KEYS[1], have=held, final=False)
    assert "pull_codec" not in fields and torch.equal(tensor, gathered(weights + 3, KEYS[1]))  # dense
    fields, tensor, _, _ = copies.answer(0, weights + 4, have=held, final=False)
    assert "pull_codec" not in fields and torch.equal(tensor, weights + 4)


def test_a_whole_pulls_lost_reply_makes_the_next_pull_dense():
    """One whole pull's reply lost, nothing else in between (no fragment pull, no resync due): the worker asks with
    the copy before it, which is not the one the shard diffed against last, so it is answered dense."""
    copies = PullCopies(shard=0)
    copies.greet(0, copies.check(0, _fields("topk:0.05", ef=True, resync=0), SIZE))
    weights = torch.randn(SIZE, generator=torch.Generator().manual_seed(7))
    held = copies.answer(0, weights, have=None, final=False)[0]["view"]
    assert "pull_codec" in copies.answer(0, weights + 1, have=held, final=False)[0]  # compressed, and lost
    fields, tensor, _, _ = copies.answer(0, weights + 2, have=held, final=False)
    assert "pull_codec" not in fields and torch.equal(tensor, weights + 2)


def test_rank_0s_final_fragment_pull_is_dense_where_the_copy_is_known():
    copies = PullCopies(shard=0)
    copies.greet(0, copies.check(0, _fields("topk:0.05", ef=True, resync=0), SIZE))
    weights = torch.randn(SIZE, generator=torch.Generator().manual_seed(6))
    have = copies.answer(0, weights, have=None, final=False)[0]["view"]  # the whole copy known
    fields, tensor, _ = copies.answer_fragment(0, weights + 1, KEYS[2], have=have, final=False)
    assert "pull_codec" in fields and tensor is None  # compressed: the worker's copy of it is known
    fields, tensor, _ = copies.answer_fragment(0, weights + 2, KEYS[2], have=fields["view"], final=True)
    assert "pull_codec" not in fields and torch.equal(tensor, gathered(weights + 2, KEYS[2]))


def test_a_fragment_comes_dense_every_resync_th_pull_of_its_own():
    """resync 3: of each fragment's pulls, the 3rd, 6th, ... are dense (counted per fragment, from the last dense
    one), whatever the other fragments' pulls in between."""
    copies = PullCopies(shard=0)
    copies.greet(0, copies.check(0, _fields("topk:0.05", ef=True, resync=3), SIZE))
    weights = torch.randn(SIZE, generator=torch.Generator().manual_seed(8))
    have = copies.answer(0, weights, have=None, final=False)[0]["view"]
    seen: dict[int, list[str]] = {0: [], 1: []}
    for i, f in enumerate([0, 1, 0, 0, 1, 0, 0, 1, 1, 0, 1, 1]):
        fields, tensor, _ = copies.answer_fragment(0, weights + i + 1, KEYS[f], have=have, final=False)
        have = fields["view"]
        seen[f].append("compressed" if "pull_codec" in fields else "dense")
    c, d = "compressed", "dense"
    assert seen == {0: [c, c, d, c, c, d], 1: [c, c, d, c, c, d]}
