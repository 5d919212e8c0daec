"""The conformance matrix's failure axes: the tiny job run for real (tests/conformance/cluster.py) under a fault
(tests/conformance/failures.py), each case held against the same case without it, bit for bit:

- failover: a replicated shard's primary dies at a chosen push (before it, with it applied and held by the
  backup but unanswered, between the chunks of a push applied as they come, in the middle of a sync barrier);
  the backup takes over through the witness, the workers go on, and the final weights, the counts and the
  shard's state (weights, optimizer state, clocks, the exactly-once table) are the run's without the death:
  no push lost, none applied twice;
- a backup that joins after a chosen step holds its primary's state and counts at the end, the weights the
  run's without it;
- a shard stopped after a chosen step (its final checkpoint) and resumed from its checkpoint on its address
  loads that step's version and ends with the state (optimizer state, streaming DiLoCo's fragment optimizers)
  and weights of the uninterrupted run;
- streaming DiLoCo with H/F > 1 (inner steps between fragment pushes) against ref_streaming.py's reference;
- a worker closed before a chosen step and started again from its psrv.Worker.state_dict() (the residuals of
  its codec, momentum correction's velocity, its step count) ends with the weights and shard state of the run
  without the restart (async and ssp; the restart's LEAVE takes one seq more).

Each case asserts that its fault fired as meant (a failover at that epoch and push, a backup that joined
mid-run, a resume from that step's version, fragment pushes only every H/F-th step, a restart from a state
that carried residuals): one that did not fails.
What is left out of "bit for bit": across two runs, the compressed-pull numbering (random per shard life) and,
where sync's workers run free, which push of a clock came first (the exactly-once table's answers say the
version each one saw); the seqs of the table are compared there."""
from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from psrv.config import RunConfig, to_dict
from psrv.experiments.launcher.history.check import check_run
from tests.conformance.cluster import TIMEOUT, Outcome, one_thread, run  # noqa: F401 (one_thread: an autouse fixture)
from tests.conformance.failures import JoinBackup, KillPrimary, RestartWorker, Resume, Watch, config, free, quiet, state_of
from tests.conformance.replica_faults import KillWithTwoBackups, LateAck, PausePrimary
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


@pytest.fixture(scope="module")
def plain():
    """The runs without a fault, by config, each checked once against the reference."""
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


# --- failover -----------------------------------------------------------------------------------------
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
FAILOVERS = [
    Failover("sync", 5),                                   # between clocks: none of clock 2 in
    Failover("sync", 6, arrived=1),                        # mid-barrier: one worker's push of clock 2 in
    Failover("sync", 6, unanswered=True, arrived=1),       # the clock applied on both, neither answer out
    Failover("sync", 6, arrived=1, shard=1, options=(("shards", 2),)),
    Failover("async", 5),
    Failover("async", 5, unanswered=True, options=(("optimizer", "adam"),)),
    Failover("ssp", 5),
    Failover("ssp", 8, unanswered=True),
    Failover("async", 5, options=(("chunk_mb", CHUNKS),)),               # before its first chunk
    Failover("async", 5, chunk=2, half=2, options=(("chunk_mb", CHUNKS),)),
    Failover("async", 7, chunk=4, unanswered=True, half=4, options=(("chunk_mb", CHUNKS), ("optimizer", "adam"))),
    Failover("ssp", 5, chunk=1, half=1, options=(("chunk_mb", CHUNKS),)),
    Failover("async", 6, chunk=1, half=1, shard=1, options=(("chunk_mb", CHUNKS), ("shards", 2))),
    Failover("async", 5, chunk=3, half=3, options=(("chunk_mb", CHUNKS), ("plane", "shm"))),
    Failover("sync", 6, arrived=1, options=(("plane", "shm"),)),
]


@pytest.mark.parametrize("case", FAILOVERS, ids=lambda c: c.id)
def test_failover(case: Failover, plain, tmp_path):
    cfg = config(case.mode, replicas=1, **dict(case.options))
    kill = KillPrimary(push=case.push, shard=case.shard, chunk=case.chunk, unanswered=case.unanswered)
    started = time.time()
    checked: dict = {"folder": str(tmp_path)}
    got = run_with(cfg, kill, checked=checked)
    death = kill.death
    assert death is not None, f"shard {case.shard}'s primary never saw push {case.push} chunk {case.chunk}"
    assert (len(death.arrived), death.half_applied) == (case.arrived, case.half), death
    chunked = dict(case.options).get("chunk_mb", 0) > 0 and case.mode != "sync"  # sync takes pushes whole
    assert (death.chunks > 1) == chunked and death.chunk < death.chunks, death
    took = kill.took_over()
    summary = next(b.summary for b in got.out.backups if b.address == took.address)
    assert summary["role"] == "primary" and [f["epoch"] for f in summary["failovers"]] == [2], summary["failovers"]
    failover_record(summary, old=kill.primary.address, died=death.version, started=started)
    want = plain(cfg)
    dead = got.out.shards[case.shard]
    assert dead["role"] == "primary" and dead["version"] < want.out.shards[case.shard]["version"], dead["version"]
    summaries = [summary if s == case.shard else got.out.shards[s] for s in range(cfg.cluster.servers)]
    states = [state_of(took) if s == case.shard else got.states[s] for s in range(cfg.cluster.servers)]
    same_run(cfg, got, want, summaries=summaries, states=states)
    held_history(cfg, got, checked, summaries)


# --- a paused primary, a late ack, two backups ----------------------------------------------------------------
PAUSE_S = 5.0  # a primary's pause: past the takeover bound (1 s at FAILURE_BOUND 2 s), with 4 s to spare under load
PAUSES = [  # (Failover's fields: the primary stops at that push, before it or handled and unanswered, and comes
    # back; the step whose start waits until it is back and fenced, or None: it comes back when the run may be over)
    (Failover("async", 5), None),
    (Failover("sync", 6, arrived=1), 4),                       # mid-barrier: one worker's push of clock 2 in
    (Failover("ssp", 5, unanswered=True), 4),                  # the backup holds the push; its answer waits
    (Failover("async", 5, chunk=2, half=2, options=(("chunk_mb", CHUNKS),)), 4),
]


@pytest.mark.parametrize("case,back_at", PAUSES, ids=[c.id + ("-back-mid-run" if b else "") for c, b in PAUSES])
def test_a_paused_primary_is_taken_over_and_fenced_when_it_comes_back(case: Failover, back_at, plain, tmp_path,
                                                                      caplog):
    """A primary stopped past the takeover bound, then going on (SIGSTOP, a starved host): its backup takes the
    shard at a new epoch, the primary, back, is fenced (it answers nothing more), and the run ends with the
    weights, counts and state of the run without the pause: no push lost, none applied twice."""
    caplog.set_level(logging.INFO, logger="psrv.server")
    cfg = config(case.mode, replicas=1, **dict(case.options))
    pause = PausePrimary(cfg, push=case.push, seconds=PAUSE_S, shard=case.shard, chunk=case.chunk,
                         unanswered=case.unanswered, back_at=back_at)
    checked: dict = {"folder": str(tmp_path)}
    got = run_with(cfg, pause, checked=checked)
    death = pause.death
    assert death is not None and pause.resumed, f"shard {case.shard}'s primary never paused at push {case.push}"
    assert (len(death.arrived), death.half_applied, death.chunk) == (case.arrived, case.half, case.chunk), death
    took = pause.took_over()
    summary = next(b.summary for b in got.out.backups if b.address == took.address)
    assert summary["role"] == "primary" and [f["epoch"] for f in summary["failovers"]] == [2], summary["failovers"]
    old = got.out.shards[case.shard]
    assert old["fenced"] and pause.fenced_at == 1, (old["fenced"], pause.fenced_at)  # fenced, never moved on alone
    summaries = [summary if s == case.shard else got.out.shards[s] for s in range(cfg.cluster.servers)]
    states = [state_of(took) if s == case.shard else got.states[s] for s in range(cfg.cluster.servers)]
    same_run(cfg, got, plain(cfg), summaries=summaries, states=states)
    fenced = [e for e in held_history(cfg, got, checked, summaries) if e["ev"] == "fenced"]
    k, old_primary, new_primary = case.shard, re.escape(pause.primary.address), re.escape(took.address)
    fencing = (rf"{new_primary}( \(witness: .+\))? took this shard over at epoch 2 \(this primary's is 1\)"
               if back_at is not None else  # back mid-run: the new primary's answer, or the witness, fenced it
               rf"({new_primary}( \(witness: .+\))? took this shard over|the witness says the shard finished) at "
               rf"epoch [23] \(this primary's is 1\)(, served by another replica meanwhile)?")
    assert len(fenced) == 1 and fenced[0]["epoch"] in ((2,) if back_at is not None else (2, 3)), fenced
    said(caplog, rf"shard {k}: primary {old_primary} silent for \d+\.\d\ds; this backup \({new_primary}\) takes over "
                 rf"at epoch 2, version {summary['failovers'][0]['version']}",
         rf"shard {k}: {fencing}; this primary stops without answering")


LATE_S = 6.0  # a backup's late ack: past its primary's ack timeout (2 s), with 4 s to spare before it looks again
LATES = [  # (mode, push, chunk, the step whose start waits for the backup's return, config options)
    ("sync", 6, 0, 4, ()),
    # between the chunks of a push applied as they come: the backup, taken back, must forget its half of it
    ("async", 5, 2, 4, (("chunk_mb", CHUNKS), ("optimizer", "adam"))),
    ("ssp", 7, 0, 5, ()),
]


@pytest.mark.parametrize("mode,push,chunk,at,options", LATES,
                         ids=[case_id(m, f"push{p}", f"chunk{c}", options=o) for m, p, c, _, o in LATES])
def test_a_backup_with_a_late_ack_is_dropped_joins_again_and_never_takes_over(mode, push, chunk, at, options, plain,
                                                                             tmp_path, caplog):
    """A backup that holds back an ack past the ack timeout is dropped at a new epoch while its primary goes on;
    back, it finds the epoch moved, joins again from the state and ends with its primary's counts and state;
    the run ends with the weights of the run without the fault, and no failover happens."""
    caplog.set_level(logging.INFO, logger="psrv.server")
    cfg = config(mode, replicas=1, **dict(options))
    late = LateAck(cfg, push=push, seconds=LATE_S, at=at, chunk=chunk)
    checked: dict = {"folder": str(tmp_path)}
    got = run_with(cfg, late, checked=checked)
    assert late.fault.fired and late.death is not None and late.until.fired, f"the late ack never fired (push {push})"
    primary = got.out.shards[0]
    assert primary["role"] == "primary" and not primary["fenced"], primary
    assert late.primary.service.replication.replicas.admitted == 2, "the backup was not taken back from the state"
    assert primary["epoch"] == 3, f"epochs: join, drop, join again; the primary ended at {primary['epoch']}"
    [record] = got.out.backups
    assert record.address in primary["backups"] and record.summary["role"] == "backup", record.summary["role"]
    assert not record.summary["failovers"], record.summary["failovers"]
    for key in COUNTS:
        assert record.summary[key] == primary[key], f"the backup: {key} {record.summary[key]} != {primary[key]}"
    assert_same_state(record.primary_state, record.state, "the backup taken back")
    same_run(cfg, got, plain(cfg), summaries=got.out.shards, states=got.states)
    events = held_history(cfg, got, checked, got.out.shards)
    epochs = [(e["epoch"], e["role"]) for e in events if e["ev"] == "epoch"]
    assert epochs == [(0, "primary"), (1, "primary"), (1, "backup"), (2, "primary"), (3, "primary"), (3, "backup")], \
        epochs  # start, join, drop, join again: the primary claims each, then the backup takes the state
    sent = [e["n"] for e in events if e["ev"] == "sent_state"]
    assert sent == [e["n"] for e in events if e["ev"] == "state"] and sent[0] == 0 < sent[1], sent
    dropped = late.epochs[2]  # the epoch the drop claimed: the backup out of it, and why
    assert (dropped.primary, dropped.backups) == (late.primary.address, ()), dropped
    assert dropped.why == f"drop {record.address}: no ack of op {sent[1]} within 2s", dropped.why
    p, b = re.escape(late.primary.address), re.escape(record.address)
    said(caplog, rf"shard 0: stalled {LATE_S:.2f}s on purpose \(an injected fault\)",
         rf"shard 0: backup {b}: no ack of op {sent[1]} within 2s; dropping it at the next epoch",
         rf"shard 0: the witness says {p} serves this shard now; this backup joins it again",
         rf"shard 0: backup {b} joined at op 0 \(epoch 1, version 0\)",
         rf"shard 0: backup {b} joined at op {sent[1]} \(epoch 3, version \d+\)",
         rf"shard 0: following {p} from op {sent[1]} \(epoch 3\)")


TWO = [  # (Failover: the primary of a shard with two backups dies at that push; the step whose start waits for
    # the second backup to follow the new primary)
    (Failover("ssp", 5), 4),
    (Failover("sync", 6, arrived=1), 4),
]


@pytest.mark.parametrize("case,at", TWO, ids=[c.id for c, _ in TWO])
def test_two_backups_of_a_dead_primary_elect_one_and_the_other_follows_it(case: Failover, at: int, plain, tmp_path,
                                                                           caplog):
    """The first backup takes over at a new epoch; the second, whose claim comes later, finds the epoch taken, joins
    the new primary from its state and ends with its counts and state; the weights are the run's without the
    death."""
    caplog.set_level(logging.INFO, logger="psrv.server")
    cfg = config(case.mode, replicas=2)
    kill = KillWithTwoBackups(cfg, push=case.push, at=at)
    checked: dict = {"folder": str(tmp_path)}
    got = run_with(cfg, kill, checked=checked)
    assert kill.death is not None and len(kill.death.arrived) == case.arrived and kill.until.fired, kill.death
    took = kill.took_over()
    summary = next(b.summary for b in got.out.backups if b.address == took.address)
    assert [f["epoch"] for f in summary["failovers"]] == [3], summary["failovers"]  # 0 start, 1 and 2 the joins
    [other] = [b for b in got.out.backups if b.address != took.address]
    assert other.summary["role"] == "backup" and other.address in summary["backups"], (other.summary, summary)
    assert other.summary["epoch"] == 4, f"the second backup joined the new primary at epoch {other.summary['epoch']}"
    for key in COUNTS:
        assert other.summary[key] == summary[key], f"the second backup: {key} {other.summary[key]} != {summary[key]}"
    assert_same_state(state_of(took), other.state, "the second backup")
    same_run(cfg, got, plain(cfg), summaries=[summary], states=[state_of(took)])
    events = held_history(cfg, got, checked, [summary])
    served = sorted({e["epoch"] for e in events if e["ev"] == "epoch" and e["role"] == "primary"})
    assert served == [0, 1, 2, 3, 4], served  # start, two joins, the takeover, the second backup's join
    [state] = [e for e in events if e["ev"] == "state" and e["epoch"] == 4]
    t, o = re.escape(took.address), re.escape(other.address)
    p = re.escape(kill.primary.address)
    said(caplog, rf"shard 0: primary {p} silent for \d+\.\d\ds; this backup \({t}\) takes "
                 rf"over at epoch 3, version {summary['failovers'][0]['version']}",
         rf"shard 0: the witness says {t} serves this shard now; this backup joins it again",
         rf"shard 0: backup {o} joined at op {state['n']} \(epoch 4, version \d+\)",
         rf"shard 0: following {t} from op {state['n']} \(epoch 4\)")


# --- a backup joins mid-run ---------------------------------------------------------------------------------
JOINS = [  # (mode, after step, shard, config options)
    ("sync", 3, 0, ()),
    ("sync", 2, 1, (("shards", 2),)),
    ("async", 3, 0, (("chunk_mb", CHUNKS),)),
    ("ssp", 3, 0, (("replicas", 1), ("optimizer", "adam"))),  # a second backup beside the first
    ("async", 3, 0, (("local", 4), ("fragments", 2), ("steps", 8))),  # streaming DiLoCo's fragment optimizers
]


@pytest.mark.parametrize("mode,at,shard,options", JOINS,
                         ids=[case_id(m, f"after{a}", f"shard{s}", options=o) for m, a, s, o in JOINS])
def test_a_backup_joins_mid_run(mode, at, shard, options, plain):
    cfg = quiet(config(mode, **dict(options)))  # a join, not a failover
    join = JoinBackup(cfg, at, shard=shard)
    got = run_with(cfg, join)
    want = plain(cfg)
    final = want.out.shards[shard]["version"]
    assert join.joined is not None, f"no backup joined at step {at}"
    assert 0 < join.joined.version == join.joined.primary_version < final, join.joined
    [record] = [b for b in got.out.backups if b.address == join.joined.address]
    primary = got.out.shards[shard]
    assert record.address in primary["backups"], f"shard {shard}'s primary ended with backups {primary['backups']}"
    assert record.summary["role"] == "backup" and not record.summary["failovers"], record.summary["role"]
    for key in COUNTS:
        assert record.summary[key] == primary[key], f"the joined backup: {key} {record.summary[key]} != {primary[key]}"
    assert_same_state(record.primary_state, record.state, f"shard {shard}")
    same_run(cfg, got, want, summaries=got.out.shards, states=got.states)


# --- resume from a checkpoint --------------------------------------------------------------------------------
RESUMES = [  # (mode, after step, shards restarted, config options)
    ("sync", 3, (0, 1), (("shards", 2),)),
    ("async", 3, (1,), (("shards", 2), ("chunk_mb", CHUNKS))),
    ("ssp", 2, (0,), (("optimizer", "adam"),)),
    ("async", 3, (0,), (("plane", "shm"),)),  # the shm plane offered again to the restarted shard
    ("sync", 4, (0,), (("local", 4), ("fragments", 2), ("steps", 8))),  # streaming: the fragment optimizers
    # the update rules' own state (psrv/server/rules): dc-asgd-a's pulled weights and mean square (dc-asgd's,
    # and more), dn's buffered gradients, momentum and push count (N = 2 workers)
    ("async", 3, (0,), (("rule", "dc-asgd-a"),)),
    ("ssp", 3, (0,), (("rule", "dn"),)),
]


@pytest.mark.parametrize("mode,at,shards,options", RESUMES,
                         ids=[case_id(m, f"after{a}", f"shards{''.join(map(str, s))}", options=o)
                              for m, a, s, o in RESUMES])
def test_resume_from_a_checkpoint(mode, at, shards, options, plain, tmp_path):
    cfg = config(mode, **dict(options))
    resume = Resume(cfg, at, tmp_path, shards=shards)
    got = run_with(cfg, resume)
    want = plain(cfg)
    assert resume.fired and sorted(resume.stopped) == sorted(shards), f"stopped {sorted(resume.stopped)}"
    for shard in shards:
        stopped, resumed = resume.stopped[shard]["version"], got.out.shards[shard]
        assert 0 < stopped < want.out.shards[shard]["version"], f"shard {shard} stopped at version {stopped}"
        assert resumed["resumed_from"] == stopped and resumed["lost_clocks"] == 0, resumed
        assert resume.stopped[shard]["checkpoint_version"] == stopped, resume.stopped[shard]
        for key in ("pushes", "pushes_applied", "updates_applied"):  # each life counts its own: none twice
            both = resume.stopped[shard][key] + resumed[key]
            assert both == want.out.shards[shard][key], f"shard {shard}: {key} {both} over its two lives"
    gap = (got.out.params - want.out.params).abs().max().item()
    assert torch.equal(got.out.params, want.out.params), f"{gap:.3g} from the weights of the uninterrupted run"
    for shard, state in enumerate(got.states):  # a resumed shard's counts start at its resume: its state decides
        assert got.out.shards[shard]["version"] == want.out.shards[shard]["version"]
        assert_same_state(comparable(want.states[shard], cfg), comparable(state, cfg), f"shard {shard}")


# --- streaming DiLoCo with H/F > 1 --------------------------------------------------------------------------
STREAMING = [  # (mode, H, F, config options)
    ("sync", 4, 2, ()),
    ("async", 4, 2, ()),
    ("ssp", 4, 2, ()),
    ("sync", 4, 2, (("replicas", 1),)),
    ("async", 4, 2, (("replicas", 1),)),
    ("async", 6, 3, (("shards", 2), ("outer", "bfloat16"), ("steps", 12))),
    ("ssp", 6, 2, (("optimizer", "adam"), ("steps", 12))),
    ("sync", 4, 2, (("quorum", 1),)),  # Decoupled DiLoCo's setting: each fragment push merges alone
    ("sync", 4, 2, (("quorum", 2),)),  # both workers' pushes of a fragment in one merge
    ("sync", 4, 2, (("quorum", 1), ("grace", 30.0), ("replicas", 1))),  # the window holds it open for the second
    # the quorum is per fragment: the third worker's push of a fragment waits in that fragment's next merge for
    # another worker's push of it (a merge of any fragments would step it alone, beside the other fragment)
    ("sync", 4, 2, (("quorum", 2), ("workers", 3))),
]


@pytest.mark.parametrize("mode,h,f,options", STREAMING,
                         ids=[case_id(m, f"H{h}", f"F{f}", options=o) for m, h, f, o in STREAMING])
def test_streaming_with_inner_steps_between_fragment_pushes(mode, h, f, options, plain):
    opts = {"steps": 8, **dict(options)}
    cfg = config(mode, local=h, fragments=f, **opts)
    got = plain(cfg)  # checked against ref_streaming.py's reference
    every, steps = h // f, opts["steps"]
    assert every > 1
    for rank, rows in got.out.steps.items():
        pushed = [row["pushed"] for row in rows]
        assert pushed == [(s + 1) % every == 0 for s in range(steps)], f"rank {rank} pushed at {pushed}"
    alone = mode != "sync" or cfg.quorum == 1 and not cfg.quorum_grace  # each push an outer step of its own
    per = steps // h * (cfg.cluster.workers if alone else 1)  # each fragment's outer steps
    exact = alone or cfg.quorum in (0, cfg.cluster.workers)  # else the reference's count of merges (plain)
    for shard, state in enumerate(got.states):  # one outer optimizer per fragment piece (the empty ones share one)
        versions = [sub["version"] for _, sub in state["fragments"]["fragments"]]
        assert got.out.shards[shard]["version"] == sum(versions), f"shard {shard}: {versions}"
        assert not exact or sum(versions) == f * per, f"shard {shard}: {versions}, expected {per} each"
        if cfg.cluster.servers == 1 and exact:
            assert versions == [per] * f, f"each fragment's outer steps {versions}, expected {per}"
    if cfg.cluster.replicas:
        solo = plain(config(mode, local=h, fragments=f, **{**opts, "replicas": 0}))
        assert torch.equal(got.out.params, solo.out.params), "the weights of the same case without backups"
        for b in got.out.backups:
            assert_same_state(b.primary_state, b.state, f"shard {b.shard}")


# --- a worker restarted from its state_dict ------------------------------------------------------------------
RESTARTS = [  # (mode, before step, rank, config options): odd steps, where rank 1's turn follows its own
    ("async", 3, 1, (("compress", "topk:0.1"),)),  # top-k's residuals, momentum correction's velocity, the step count
    ("ssp", 3, 1, (("compress", "sign"), ("optimizer", "adam"))),  # sign's residuals
]  # not sync: a worker that rejoins there counts from the clock after the open one (psrv/server/consistency/sync.py
# join), so its restart changes the math; onebit_adam, sync only, keeps its momentum's restore to tests/unit


@pytest.mark.parametrize("mode,at,rank,options", RESTARTS,
                         ids=[case_id(m, f"before{a}", f"rank{r}", options=o) for m, a, r, o in RESTARTS])
def test_a_worker_restarted_from_its_state_dict(mode, at, rank, options, plain):
    """psrv.Worker.state_dict() carries what the shards do not hold: a worker closed and started again from it
    ends the run of the worker never restarted, bit for bit."""
    cfg = config(mode, **dict(options))
    restart = RestartWorker(cfg, at, rank)
    got = run_with(cfg, restart)
    want = plain(cfg)
    state = restart.state
    assert state is not None and state["steps"] == at, "the worker was not restarted before its step"
    carried = {k: v for k, v in state.items() if v is not None and k != "steps"}
    assert carried, "the state carried nothing the shards do not hold"
    for part, tensors in carried.items():  # each part live: not all zeros
        assert any(t.abs().sum() > 0 for t in tensors.values() if isinstance(t, torch.Tensor)), (part, tensors)
    steps = [[row["step"] for row in run.out.steps[rank]] for run in (got, want)]  # its step count carried on
    assert steps[0] == steps[1], f"the restarted worker's steps {steps[0]}, without the restart {steps[1]}"
    for shard, (mine, theirs) in enumerate(zip(got.states, want.states)):  # the restart's LEAVE took a seq more
        seqs = [(s["dedup"]["last"][rank]["seq"], s["dedup"]["seen"][rank]) for s in (mine, theirs)]
        assert seqs[0] == (seqs[1][0] + 1, seqs[1][1] + 1), f"shard {shard}: seqs {seqs}"
    same_run(cfg, got, want, summaries=got.out.shards, states=[_seqs_of(s, rank, -1) for s in got.states])


def _seqs_of(state: dict, rank: int, by: int) -> dict:
    """`state` with worker `rank`'s last and highest seq moved `by`."""
    dedup = state["dedup"]
    last = {**dedup["last"], rank: {**dedup["last"][rank], "seq": dedup["last"][rank]["seq"] + by}}
    return {**state, "dedup": {**dedup, "last": last, "seen": {**dedup["seen"], rank: dedup["seen"][rank] + by}}}
