"""Which cases the matrix runs: every valid combination of the data-path axes (plane x chunks x wire
dtype x codec, so every triple of them), plus a pairwise covering array over all the axes: every
level of every axis meets every level of every other axis in at least one case, wherever psrv
accepts that pair at all (a pair no valid case can hold is listed, with the reason, as refused).

Over zmq (a tenth of a second a case) the pairs are covered twice, by two arrays grown apart, so
each pair meets two sets of company; over torch RPC (seconds a case, as processes) once.

The data-path cases run in async mode, where chunks are applied as they arrive (sync takes pushes
whole); the pairs bring every other mode. The covering array is built greedily (AETG's way: each new
case is grown from an uncovered pair, each further axis taking the level that covers most new pairs)
from a fixed seed, and stored in plan.json (`python -m tests.conformance.covering` writes it again
after the axes change; tests/conformance/test_plan.py says when it must). `--extend` keeps the stored
cases instead, a new axis at its first level in them, and adds only the cases that cover the pairs they
leave out: the cases that ran before run again, and a new axis costs only its own cases."""
from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

from tests.conformance.axes import AXES, DATA_PATH, DEFAULT, refusal

Pair = tuple[tuple[str, object], tuple[str, object]]


def pairs_of(case: dict) -> set[Pair]:
    items = sorted(case.items())
    return {(a, b) for a, b in itertools.combinations(items, 2)}


def all_pairs() -> set[Pair]:
    out = set()
    for (a, la), (b, lb) in itertools.combinations(sorted(AXES.items()), 2):
        out |= {((a, x), (b, y)) for x in la for y in lb}
    return out


def _valid(case: dict) -> bool:
    return refusal(case) is None


def _complete(fixed: dict, rng: random.Random, tries: int = 3000) -> dict | None:
    """A valid case holding `fixed`: the defaults first, then random levels for the other axes."""
    case = {**DEFAULT, **fixed}
    if _valid(case):
        return case
    free = [a for a in AXES if a not in fixed]
    for _ in range(tries):
        case = {**DEFAULT, **fixed, **{a: rng.choice(AXES[a]) for a in free if rng.random() < 0.5}}
        if _valid(case):
            return case
    return None


def data_path_cases() -> list[dict]:
    """Every valid combination of the data-path axes, the others at their defaults."""
    out = []
    for levels in itertools.product(*(AXES[a] for a in DATA_PATH)):
        for ef in (("on", "off") if levels[DATA_PATH.index("codec")] != "none" else ("on",)):
            case = {**DEFAULT, "mode": "async", **dict(zip(DATA_PATH, levels)), "ef": ef}
            if _valid(case):
                out.append(case)
    return out


def _grow(uncovered: set[Pair], rng: random.Random, fixed: dict) -> dict | None:
    (a, x), (b, y) = rng.choice(sorted(uncovered, key=repr))
    case = {**fixed, a: x, b: y}
    for axis in rng.sample([k for k in AXES if k not in case], k=len(AXES) - len(case)):
        best, gain = [DEFAULT[axis]], -1
        for level in AXES[axis]:
            trial = {**case, axis: level}
            if not _valid({**DEFAULT, **trial}):  # the axes not chosen yet at their defaults
                continue
            g = sum(1 for (p, q) in uncovered if dict([p, q]).items() <= trial.items())
            if g > gain:
                best, gain = [level], g
            elif g == gain:
                best.append(level)
        case[axis] = rng.choice(best)
    return case if _valid(case) else _complete({**fixed, a: x, b: y}, rng)


def _cover(uncovered: set[Pair], rng: random.Random, candidates: int, fixed: dict) -> list[dict]:
    """Greedy cases (each the best of `candidates` grown ones) until `uncovered` is empty."""
    cases = []
    while uncovered:
        grown = [c for c in (_grow(uncovered, rng, fixed) for _ in range(candidates)) if c is not None]
        best = max(grown, key=lambda c: len(pairs_of(c) & uncovered), default=None)
        if best is None or not pairs_of(best) & uncovered:
            raise AssertionError(f"cannot cover {len(uncovered)} pairs, e.g. {sorted(uncovered, key=repr)[:3]}")
        cases.append(best)
        uncovered -= pairs_of(best)
    return cases


def build(seed: int = 27, candidates: int = 24) -> tuple[list[dict], list[dict], dict[Pair, str]]:
    """(the data-path cases, the pairwise cases, the pairs no valid case holds -> why)."""
    rng = random.Random(seed)
    triples = data_path_cases()
    uncovered = all_pairs()
    for case in triples:
        uncovered -= pairs_of(case)
    refused: dict[Pair, str] = {}
    for pair in sorted(uncovered, key=repr):
        if _complete(dict(pair), rng) is None:
            refused[pair] = refusal({**DEFAULT, **dict(pair)}) or "no valid completion found"
    uncovered -= set(refused)
    # torch RPC's cases run as processes (seconds each): first the fewest that cover its pairs
    rpc = {pair for pair in uncovered if ("transport", "rpc") in pair}
    cases = _cover(rpc, rng, candidates * 4, {"transport": "rpc"})
    uncovered -= {pair for case in cases for pair in pairs_of(case)}
    uncovered -= {pair for pair in uncovered if ("transport", "rpc") in pair}
    cases += _cover(uncovered, rng, candidates, {"transport": "zmq"})
    # zmq's cases cost a tenth of a second: a second array, so each pair also meets other company
    again = {pair for pair in all_pairs() - set(refused) if ("transport", "rpc") not in pair}
    cases += _cover(again, rng, candidates, {"transport": "zmq"})
    held = set().union(*(pairs_of(c) for c in triples + cases))  # a pair no random completion found may be
    refused = {pair: why for pair, why in refused.items() if pair not in held}  # in a grown case after all
    return triples, cases, refused


def _refused(uncovered: set[Pair], rng: random.Random) -> dict[Pair, str]:
    """The pairs of `uncovered` no valid case holds -> why."""
    return {pair: refusal({**DEFAULT, **dict(pair)}) or "no valid completion found"
            for pair in sorted(uncovered, key=repr) if _complete(dict(pair), rng) is None}


def extend(seed: int = 27, candidates: int = 24) -> tuple[list[dict], list[dict], dict[Pair, str]]:
    """The stored plan, each new axis at its first level in the stored cases, and new cases (grown as
    build() grows them) for the pairs those leave out; the pairs no valid case holds, refused anew."""
    rng = random.Random(seed)
    triples, pairs, _ = load()
    triples, pairs = ([{**DEFAULT, **{a: v for a, v in c.items() if a in AXES}} for c in cases]
                      for cases in (triples, pairs))
    covered = set().union(*(pairs_of(c) for c in triples + pairs))
    uncovered = all_pairs() - covered
    refused = _refused(uncovered, rng)
    uncovered -= set(refused)
    rpc = {pair for pair in uncovered if ("transport", "rpc") in pair}
    added = _cover(rpc, rng, candidates * 4, {"transport": "rpc"})
    uncovered -= {pair for case in added for pair in pairs_of(case)}
    uncovered -= {pair for pair in uncovered if ("transport", "rpc") in pair}
    again = set(uncovered)  # over zmq, twice, as build() covers them
    added += _cover(uncovered, rng, candidates, {"transport": "zmq"})
    added += _cover(again, rng, candidates, {"transport": "zmq"})
    return triples, pairs + added, refused


PLAN = Path(__file__).with_name("plan.json")


def load() -> tuple[list[dict], list[dict], dict[Pair, str]]:
    """The stored plan: (data-path cases, pairwise cases, refused pairs -> why)."""
    data = json.loads(PLAN.read_text())
    refused = {tuple(tuple(x) for x in pair): why for pair, why in data["refused"]}
    return data["triples"], data["pairs"], refused


def main() -> None:
    import sys
    triples, pairs, refused = extend() if "--extend" in sys.argv[1:] else build()
    triples, pairs = ([{axis: case[axis] for axis in AXES} for case in cases] for cases in (triples, pairs))
    PLAN.write_text(json.dumps({"triples": triples, "pairs": pairs,
                                "refused": [[list(map(list, pair)), why] for pair, why in sorted(refused.items(), key=repr)]},
                               indent=0) + "\n")
    print(f"{len(triples)} data-path cases, {len(pairs)} pairwise cases, {len(refused)} pairs refused -> {PLAN}")


if __name__ == "__main__":
    main()
