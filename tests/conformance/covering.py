"""Which cases the matrix runs: every valid combination of the data-path axes (plane x chunks x wire
dtype x codec, so every triple of them), plus a pairwise covering array over all the axes: every
level of every axis meets every level of every other axis, both live (tests/conformance/live.py), in
at least one case, wherever psrv accepts that pair at all. A pair no valid case holds is listed, with
psrv's own refusal (or one of the matrix's limits, axes.MATRIX_LIMITS), as refused; a pair valid cases
hold but none with both levels live is listed, with why, as dead.

Over zmq (a tenth of a second a case) the pairs are covered twice, by two arrays grown apart, so
each pair meets two sets of company; over torch RPC (seconds a case, as processes) once.

The data-path cases run in async mode, where chunks are applied as they arrive (sync takes pushes
whole); the pairs bring every other mode. The covering array is built greedily (AETG's way: each new
case is grown from an uncovered pair, each further axis taking the level that covers most new pairs)
from a fixed seed, and stored in plan.json (`python -m tests.conformance.covering` writes it again
after the axes change; tests/conformance/test_plan.py says when it must). `--extend` keeps the stored
cases instead, a new axis at its first level in them, and adds only the cases that cover the pairs they
leave out: the cases that ran before run again, and a new axis costs only its own cases. Either way the torch
RPC cases that hold no pair the others do not hold as often are dropped (`prune_rpc`)."""
from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

from tests.conformance.axes import AXES, DATA_PATH, DEFAULT, case_id, refusal
from tests.conformance.live import axis_inert, inert, live_pairs

Pair = tuple[tuple[str, object], tuple[str, object]]


def all_pairs() -> set[Pair]:
    out = set()
    for (a, la), (b, lb) in itertools.combinations(sorted(AXES.items()), 2):
        out |= {((a, x), (b, y)) for x in la for y in lb}
    return out


def _valid(case: dict) -> bool:
    return refusal(case) is None


def _holds_live(case: dict, pair: Pair) -> bool:
    return _valid(case) and not any(axis_inert(axis, case) for axis, _ in pair)


def _complete(pair: Pair, rng: random.Random, tries: int = 400) -> dict | None:
    """A valid case holding `pair` with both its levels live: the defaults first, then random levels for
    the other axes."""
    fixed = dict(pair)
    case = {**DEFAULT, **fixed}
    if _holds_live(case, pair):
        return case
    free = [a for a in AXES if a not in fixed]
    for _ in range(tries):
        case = {**DEFAULT, **fixed, **{a: rng.choice(AXES[a]) for a in free if rng.random() < 0.5}}
        if _holds_live(case, pair):
            return case
    return None


def _witness(pair: Pair, rng: random.Random, tries: int = 400) -> dict | None:
    """A valid case holding `pair` (live or not), nearest the defaults first."""
    fixed = dict(pair)
    free = [a for a in AXES if a not in fixed]
    for i in range(tries + 1):
        case = {**DEFAULT, **fixed, **({} if not i else {a: rng.choice(AXES[a]) for a in free if rng.random() < 0.5})}
        if _valid(case):
            return case
    return None


def dead_why(pair: Pair, witness: dict, measured: dict | None = None) -> str:
    """Why `pair` is not live in the valid case `witness` (`measured`: what measure.py found there)."""
    dead = inert(witness, measured)
    return "; ".join(f"{a}: {dead[a]}" for a, _ in pair if a in dead)


def why_not(pair: Pair, rng: random.Random) -> tuple[str, str, dict | None]:
    """("refused", psrv's line for the pair at the defaults, None) where no valid case holds the pair, else
    ("dead", why, a valid case that holds it)."""
    witness = _witness(pair, rng)
    if witness is None:
        return "refused", refusal({**DEFAULT, **dict(pair)}) or "no valid case found", None
    return "dead", dead_why(pair, witness), witness


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
    return case if _holds_live(case, ((a, x), (b, y))) else _complete(((a, x), (b, y)), rng)


def _cover(uncovered: set[Pair], rng: random.Random, candidates: int, fixed: dict) -> list[dict]:
    """Greedy cases (each the best of `candidates` grown ones) until `uncovered` is empty."""
    cases = []
    while uncovered:
        grown = [c for c in (_grow(uncovered, rng, fixed) for _ in range(candidates)) if c is not None]
        best = max(grown, key=lambda c: len(live_pairs(c) & uncovered), default=None)
        if best is None or not live_pairs(best) & uncovered:
            raise AssertionError(f"cannot cover {len(uncovered)} pairs, e.g. {sorted(uncovered, key=repr)[:3]}")
        cases.append(best)
        uncovered -= live_pairs(best)
    return cases


def _unheld(uncovered: set[Pair], rng: random.Random) -> tuple[dict[Pair, tuple], list[dict]]:
    """(the pairs of `uncovered` no valid case found holds live -> ("refused" or "dead", why, witness), the
    witnesses that do hold a pair live after all: cases to run)."""
    unheld, found = {}, []
    for pair in sorted(uncovered, key=repr):
        if _complete(pair, rng) is None:
            kind, why, witness = why_not(pair, rng)
            if kind == "dead" and not why:
                found.append(witness)
            else:
                unheld[pair] = (kind, why, witness)
    return unheld, found


def _arrays(uncovered: set[Pair], rng: random.Random, candidates: int, again: set[Pair]) -> list[dict]:
    """torch RPC's cases first (processes, seconds each: the fewest that cover its pairs), then zmq's; then
    zmq's `again` (a tenth of a second a case), so each pair also meets other company."""
    rpc = {pair for pair in uncovered if ("transport", "rpc") in pair}
    cases = _cover(rpc, rng, candidates * 4, {"transport": "rpc"})
    rest = uncovered - {pair for case in cases for pair in live_pairs(case)}
    rest -= {pair for pair in rest if ("transport", "rpc") in pair}
    cases += _cover(rest, rng, candidates, {"transport": "zmq"})
    cases += _cover(set(again), rng, candidates, {"transport": "zmq"})
    return cases


def _measure(cases: list[dict], measured: dict[str, dict]) -> None:
    """Measure each case not measured yet (measure.unseen), into `measured` by case id."""
    from tests.conformance.measure import unseen  # the reference: torch, only when a plan is made
    for case in cases:
        if case_id(case) not in measured:
            measured[case_id(case)] = unseen(case)


def _live(cases: list[dict], measured: dict[str, dict]) -> set[Pair]:
    return set().union(*(live_pairs(c, measured.get(case_id(c))) for c in cases))


def _measured_rounds(triples: list[dict], cases: list[dict], unheld: dict, rng: random.Random,
                     candidates: int, measured: dict[str, dict], rounds: int = 3) -> None:
    """Measure the cases; cover the pairs a measurement left dead with new cases, measured in turn, for
    `rounds`; a pair still live in no case is dead, its witness the last case that held it."""
    _measure(triples + cases, measured)
    for _ in range(rounds):
        uncovered = all_pairs() - _live(triples + cases, measured) - set(unheld)
        if not uncovered:
            return
        rpc = {pair for pair in uncovered if ("transport", "rpc") in pair}
        more = _cover(rpc, rng, candidates * 4, {"transport": "rpc"})
        more += _cover(uncovered - rpc, rng, candidates, {"transport": "zmq"})
        _measure(more, measured)
        cases += more
    live = _live(triples + cases, measured)
    for pair in [pair for pair in unheld if pair in live]:  # a case grown since holds it live
        del unheld[pair]
    for pair in all_pairs() - live - set(unheld):
        witness = next(c for c in reversed(triples + cases) if dict(pair).items() <= c.items())
        unheld[pair] = ("dead", dead_why(pair, witness, measured[case_id(witness)]), witness)


def build(seed: int = 27, candidates: int = 24) -> tuple[list[dict], list[dict], dict[Pair, tuple], dict]:
    """(the data-path cases, the pairwise cases, the pairs no valid case holds live -> (kind, why, witness),
    what measure.py found inert per case id)."""
    rng = random.Random(seed)
    triples = data_path_cases()
    uncovered = all_pairs()
    for case in triples:
        uncovered -= live_pairs(case)
    unheld, found = _unheld(uncovered, rng)
    uncovered -= set(unheld) | set().union(*(live_pairs(c) for c in found))
    again = {pair for pair in all_pairs() - set(unheld) if ("transport", "rpc") not in pair}
    cases = found + _arrays(uncovered, rng, candidates, again)
    held = set().union(*(live_pairs(c) for c in triples + cases))  # a pair no random completion found may be
    unheld = {pair: why for pair, why in unheld.items() if pair not in held}  # live in a case
    measured: dict[str, dict] = {}
    _measured_rounds(triples, cases, unheld, rng, candidates, measured)
    return triples, cases, unheld, measured


def extend(seed: int = 27, candidates: int = 24) -> tuple[list[dict], list[dict], dict[Pair, tuple], dict]:
    """The stored plan, each new axis at its first level in the stored cases, and new cases (grown as
    build() grows them) for the pairs those leave out; the pairs no valid case holds live, found anew."""
    rng = random.Random(seed)
    triples, pairs, _, measured = load()
    triples, pairs = ([{**DEFAULT, **{a: v for a, v in c.items() if a in AXES}} for c in cases]
                      for cases in (triples, pairs))
    uncovered = all_pairs() - set().union(*(live_pairs(c) for c in triples + pairs))
    unheld, found = _unheld(uncovered, rng)
    uncovered -= set(unheld) | set().union(*(live_pairs(c) for c in found))
    zmq = {pair for pair in uncovered if ("transport", "rpc") not in pair}
    cases = pairs + found + _arrays(uncovered, rng, candidates, zmq)
    _measured_rounds(triples, cases, unheld, rng, candidates, measured)
    return triples, cases, unheld, measured


def prune_rpc(triples: list[dict], pairs: list[dict], measured: dict[str, dict]) -> list[dict]:
    """`pairs` without the torch RPC cases (seconds each, as processes) whose every live pair the other cases
    hold as often as the plan asks (a pair with torch RPC once, any other twice), the newest tried first: an
    extension grows cases for its new pairs, and those may hold what an older case alone held before."""
    def live(c: dict) -> set[Pair]:
        return live_pairs(c, measured.get(case_id(c)))
    held: dict[Pair, int] = {}
    for case in triples + pairs:
        for pair in live(case):
            held[pair] = held.get(pair, 0) + 1
    dropped = set()
    for i in reversed(range(len(pairs))):
        mine = live(pairs[i])
        if pairs[i]["transport"] == "rpc" and all(held[p] > (1 if ("transport", "rpc") in p else 2) for p in mine):
            dropped.add(i)
            for pair in mine:
                held[pair] -= 1
    return [case for i, case in enumerate(pairs) if i not in dropped]


PLAN = Path(__file__).with_name("plan.json")


def load() -> tuple[list[dict], list[dict], dict[Pair, tuple], dict[str, dict]]:
    """The stored plan: (data-path cases, pairwise cases, pairs no case holds live -> (kind, why, witness),
    case id -> the axes measure.py found inert there -> why)."""
    data = json.loads(PLAN.read_text())
    unheld = {tuple(tuple(x) for x in pair): (kind, why, witness) for pair, kind, why, witness in data["unheld"]}
    return data["triples"], data["pairs"], unheld, data["measured"]


def main() -> None:
    import argparse
    import time
    parser = argparse.ArgumentParser(prog="python -m tests.conformance.covering",
                                     description="Build the conformance matrix's plan again and write it to "
                                     f"{PLAN.relative_to(Path.cwd()) if PLAN.is_relative_to(Path.cwd()) else PLAN} "
                                     "(minutes: every case's reference runs once, to measure its levels).")
    parser.add_argument("--extend", action="store_true", help="keep the stored cases (a new axis at its first "
                        "level in them) and add only the cases that cover the pairs they leave out")
    args = parser.parse_args()
    began = time.monotonic()
    triples, pairs, unheld, measured = extend() if args.extend else build()
    pairs = prune_rpc(triples, pairs, measured)
    triples, pairs = ([{axis: case[axis] for axis in AXES} for case in cases] for cases in (triples, pairs))
    PLAN.write_text(json.dumps({"triples": triples, "pairs": pairs,
                                "unheld": [[list(map(list, pair)), *why] for pair, why in sorted(unheld.items(), key=repr)],
                                "measured": {k: v for k, v in sorted(measured.items()) if v}},
                               indent=0) + "\n")
    kinds = [kind for kind, *_ in unheld.values()]
    print(f"measured inert: {sum(len(v) for v in measured.values())} levels in {sum(1 for v in measured.values() if v)} cases")
    print(f"{len(triples)} data-path cases, {len(pairs)} pairwise cases ({sum(c['transport'] == 'rpc' for c in pairs)} "
          f"over torch RPC); pairs no case holds live: {kinds.count('refused')} refused, {kinds.count('dead')} dead "
          f"-> {PLAN} ({time.monotonic() - began:.0f} s)")


if __name__ == "__main__":
    main()
