"""The conformance matrix's replication faults beside test_failures.py's kill (tests/conformance/replica_faults.py):
a primary paused at a chosen push that then goes on, a backup whose acknowledgement comes late, a killed primary
with two backups, a backup joining in the middle of a chunked push or of a sync barrier. Each run is held against the same case without the fault, bit for bit, and its recorded
histories against psrv check (failure_checks.py): no push lost, none applied twice, no split brain."""
from __future__ import annotations

import logging
import re

import pytest

from tests.conformance.cluster import one_thread  # noqa: F401 (an autouse fixture)
from tests.conformance.failure_checks import (CHUNKS, COUNTS, Failover, case_id, held_history, plain,  # noqa: F401
                                              run_with, said, same_run)
from tests.conformance.failures import config, quiet, state_of
from tests.conformance.replica_faults import JoinMidPush, KillWithTwoBackups, LateAck, PausePrimary
from tests.states import assert_same_state


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


JOINS_MID_PUSH = [  # (mode, push, chunk: the primary has applied chunks 0..chunk of it when the backup asks)
    ("async", 5, 1),
    ("ssp", 6, 2),
]


def joined_and_same(cfg, got, join: JoinMidPush, plain, checked: dict) -> None:
    """The joined backup ended in its primary's configuration with the primary's counts and state, the run is the
    run without the join, bit for bit, and its recorded histories hold (psrv check), the joiner sent the state
    once, at the epoch that added it."""
    sent = [e for e in held_history(cfg, got, checked, got.out.shards) if e["ev"] == "sent_state"]
    assert [e["to"] for e in sent] == [join.backup.address], sent
    [record] = [b for b in got.out.backups if b.address == join.backup.address]
    primary = got.out.shards[0]
    assert record.address in primary["backups"] and record.summary["role"] == "backup", record.summary
    for key in COUNTS:
        assert record.summary[key] == primary[key], f"the joined backup: {key} {record.summary[key]} != {primary[key]}"
    assert_same_state(record.primary_state, record.state, "shard 0")
    same_run(cfg, got, plain(cfg), summaries=got.out.shards, states=got.states)


@pytest.mark.parametrize("mode,push,chunk", JOINS_MID_PUSH, ids=[f"{m}-push{p}-chunk{c}" for m, p, c in JOINS_MID_PUSH])
def test_a_backup_that_asks_to_join_mid_push_is_added_once_the_push_is_whole(mode, push, chunk, plain, tmp_path):
    """The backup asks while a push is half applied; its primary adds it once the push's last chunk is in, and it
    ends with its primary's state and counts; the weights are the run's without it."""
    cfg = quiet(config(mode, chunk_mb=CHUNKS))
    join = JoinMidPush(cfg, push=push, chunk=chunk, at=4)
    checked: dict = {"folder": str(tmp_path)}
    got = run_with(cfg, join, checked=checked)
    assert join.death is not None and join.death.chunks > chunk + 1, join.death
    assert (join.joined_with, join.admitted_with) == (chunk + 1, 0), (join.joined_with, join.admitted_with)
    joined_and_same(cfg, got, join, plain, checked)


@pytest.mark.parametrize("shards", [1, 2])
def test_a_backup_that_joins_mid_barrier_is_sent_the_half_full_clock(shards, plain, tmp_path):
    """Under sync, the backup asks once one worker's push of clock 3 is in and the other's is not: the barrier is
    half full when the primary adds it (the other push waits, as over a slow link). Its state must hold the pushes
    of the open clock, or its version, optimizer state and weights part from its primary's at that clock's commit."""
    cfg = quiet(config("sync", shards=shards))
    join = JoinMidPush(cfg, push=5, chunk=0, at=5)  # pushes 1-4 fill clocks 1 and 2; push 5 half fills clock 3
    checked: dict = {"folder": str(tmp_path)}
    got = run_with(cfg, join, checked=checked)
    assert join.death is not None and len(join.death.arrived) == 1, join.death
    assert join.admitted_arrived == join.death.arrived, (join.admitted_arrived, join.death.arrived)
    joined_and_same(cfg, got, join, plain, checked)
