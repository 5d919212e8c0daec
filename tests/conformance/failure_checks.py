"""What the failure cases (test_failures.py, test_replica_faults.py) check a run against: the same case without
the fault (`plain`, each checked once against the reference: reference.py, ref_streaming.py), bit for bit
(same_run), and psrv check on its recorded histories (check_history, held_history); a failover's record
(failover_record), the shard's log lines (said); a failover case's shape (Failover)."""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from psrv.config import RunConfig, to_dict
from psrv.experiments.launcher.history.check import check_run
from tests.conformance.cluster import TIMEOUT, Outcome, run
from tests.conformance.failures import Watch, free, quiet, state_of
from tests.conformance.ref_streaming import reference_of
from tests.states import assert_same_state

ATOL, RTOL = 1e-5, 1e-4  # the reference's tolerance (the matrix's): its sums run in another order
COUNTS = ("version", "pushes", "pushes_applied", "updates_applied", "dropped", "staleness_histogram")



@dataclass
class Run:
    out: Outcome
    hooks: Watch
    states: list[dict] = field(default_factory=list)  # each shard's, as its last server held it


def run_with(cfg: RunConfig, hooks: Watch, *, checked: dict | None = None) -> Run:
    """`cfg` run under `hooks`; with `checked` ({"folder": a test's tmp_path}), its replicas and workers record their
    histories in that folder (a run folder for psrv check: check_history), the replicas' events then in
    `checked["events"]`."""
    if checked is None:
        out = run(cfg, nan=False, hooks=hooks)
        return Run(out, hooks, [state_of(s) for s in hooks.servers])
    folder = checked["folder"]
    hooks.history = str(Path(folder) / "history")
    Path(hooks.history).mkdir()
    try:
        out = run(cfg, nan=False, hooks=hooks)
    finally:
        hooks.close_histories()
    checked["events"] = [[json.loads(line) for line in path.read_text().splitlines() if line.strip()]
                         for path in sorted(Path(hooks.history).glob("shard-*.jsonl"))]
    return Run(out, hooks, [state_of(s) for s in hooks.servers])


def check_history(cfg: RunConfig, folder: str, finals: dict[int, dict]):
    """psrv check (experiments/launcher/history: nothing lost or applied twice, no split brain, the sync barrier,
    the ssp bound, the counts) on a run's recorded histories, its config and each shard's final record
    (`finals`, by shard: server-K.json); it must find no violation."""
    Path(folder, "config.json").write_text(json.dumps(to_dict(cfg)))
    for shard, summary in finals.items():
        Path(folder, f"server-{shard}.json").write_text(json.dumps(summary))
    result = check_run(folder)
    assert not result.violations, "\n".join(map(str, result.violations))
    return result


@pytest.fixture(scope="session")
def plain():
    """The runs without a fault, by config, each checked once against the reference (once per test process:
    the failure files share them)."""
    runs: dict[RunConfig, Run] = {}

    def get(cfg: RunConfig) -> Run:
        cfg = quiet(cfg)  # no failover is meant here; a fault's own run keeps its bound
        if cfg not in runs:
            runs[cfg] = run_with(cfg, Watch())
            check_reference(cfg, runs[cfg].out)
        return runs[cfg]
    return get


def check_reference(cfg: RunConfig, got: Outcome) -> None:
    """The run's weights, counts and staleness against the whole run's math (reference.py; ref_streaming.py
    with fragments), as the matrix checks them."""
    want = reference_of(cfg, nan=False).run()
    for shard, s in enumerate(got.shards):
        mine = {k: s[k] for k in ("pushes", "pushes_applied", "updates_applied")} | {"dropped": s["dropped"]}
        assert mine == want.counts, f"shard {shard} counted {mine}; the reference {want.counts}"
        hist = {int(k): v for k, v in s["staleness_histogram"].items()}
        assert hist == dict(want.staleness), f"shard {shard}: staleness {hist}, the reference {dict(want.staleness)}"
    seen = {r: [row["staleness"] for row in rows] for r, rows in got.steps.items()}
    assert seen == want.step_staleness, f"step staleness {seen} != {want.step_staleness}"
    gap = (got.params - want.params).abs().max().item()
    assert torch.allclose(got.params, want.params, atol=ATOL, rtol=RTOL), f"{gap:.3g} from the reference"


def comparable(state: dict, cfg: RunConfig) -> dict:
    """A shard's state as two runs of one case must agree on it: the compressed-pull numbering is random per
    shard life; where sync's workers run free, the exactly-once table's answers say which push of a clock came
    first (the version each saw), so its seqs alone are compared there."""
    state = {**state, "pulls": {**state["pulls"], "numbers": None}}
    if free(cfg):
        dedup = state["dedup"]
        state["dedup"] = {**dedup, "last": {w: v["seq"] for w, v in dedup["last"].items()}}
    return state


def same_run(cfg: RunConfig, got: Run, want: Run, *, summaries: list[dict], states: list[dict]) -> None:
    """Rank 0's weights bit for bit, and each shard's counts and state (from `summaries` and `states`, by shard)
    those of the run without the fault."""
    gap = (got.out.params - want.out.params).abs().max().item()
    assert torch.equal(got.out.params, want.out.params), f"{gap:.3g} from the weights of the run without the fault"
    for shard, (summary, state) in enumerate(zip(summaries, states)):
        plain = want.out.shards[shard]
        for key in COUNTS:
            assert summary[key] == plain[key], f"shard {shard}: {key} {summary[key]} != {plain[key]} without the fault"
        assert_same_state(comparable(want.states[shard], cfg), comparable(state, cfg), f"shard {shard}")


def held_history(cfg: RunConfig, got: Run, checked: dict, finals: list[dict]) -> list[dict]:
    """psrv check on the run's histories (run_with's `checked`), each shard's record `finals`; every replica's
    events, in time (the replicas' files in the order they started)."""
    result = check_history(cfg, checked["folder"], dict(enumerate(finals)))
    assert result.counts.applied > 0 and result.counts.acknowledged > 0, result.counts
    return sorted((e for events in checked["events"] for e in events), key=lambda e: e["t"])


def failover_record(summary: dict, *, old: str, died: int, started: float) -> None:
    """The new primary's one `failovers` entry (summary.json's replication section reads it): whom it took over
    from, how long that one was silent (at least the takeover bound, 1 s at FAILURE_BOUND), the version it took
    over at (what the old primary held, or more once a held push is answered), and when."""
    [f] = summary["failovers"]
    assert set(f) == {"epoch", "from", "at", "silent_s", "version"}, f
    assert f["from"] == old and isinstance(f["silent_s"], float) and 1.0 <= f["silent_s"] < TIMEOUT, f
    assert f["silent_s"] == round(f["silent_s"], 3), f  # milliseconds
    assert died <= f["version"] <= summary["version"] and started <= f["at"] <= time.time(), f


def said(caplog, *patterns: str) -> None:
    """Each pattern (a regex) is some psrv.server log line, whole: what the shard tells its operator."""
    lines = [r.getMessage() for r in caplog.records if r.name == "psrv.server"]
    for pattern in patterns:
        assert any(re.fullmatch(pattern, line) for line in lines), f"no line {pattern!r} in:\n" + "\n".join(lines)


def case_id(*parts, options: tuple = ()) -> str:
    return "-".join([*map(str, parts), *(f"{k}={v}" for k, v in options)])


@dataclass(frozen=True)
class Failover:
    mode: str
    push: int                 # the primary dies at its push-th push (6 steps x 2 workers: 12)
    chunk: int = 0            # at that push's chunk (0: its first message)
    unanswered: bool = False  # after handling it (its backup holds it), before its answer leaves
    shard: int = 0
    options: tuple = ()       # config()'s
    arrived: int = 0          # sync: pushes of the open clock the primary held then
    half: int = 0             # chunks of an open chunked push it had applied then

    @property
    def id(self) -> str:
        where = f"chunk{self.chunk}" if self.chunk else "between" if not self.arrived else "mid-barrier"
        return "-".join([self.mode, f"push{self.push}", where, *(["unanswered"] if self.unanswered else []),
                         *(f"{k}={v}" for k, v in self.options), *([f"shard{self.shard}"] if self.shard else [])])


CHUNKS = 0.1  # MB: 5 chunks of a push to one shard, 3 to each of two
