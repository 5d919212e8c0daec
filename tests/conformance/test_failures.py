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

import logging
import time

import pytest
import torch

from tests.conformance.cluster import one_thread  # noqa: F401 (an autouse fixture)
from tests.conformance.failure_checks import (CHUNKS, COUNTS, Failover, case_id, comparable,  # noqa: F401 (plain:
                                              failover_record, held_history, plain, run_with, same_run)  # a fixture)
from tests.conformance.failures import JoinBackup, KillPrimary, RestartWorker, Resume, config, quiet, state_of
from tests.states import assert_same_state


# --- failover -----------------------------------------------------------------------------------------
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
    # over shm a push of the shared gradient goes whole (read in place); one in bfloat16 is copied into push slots,
    # chunk by chunk
    Failover("async", 5, chunk=1, half=1, options=(("chunk_mb", CHUNKS), ("plane", "shm"), ("wire", "bfloat16"))),
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
def test_a_backup_joins_mid_run(mode, at, shard, options, plain, caplog):
    caplog.set_level(logging.INFO, logger="psrv.server")
    cfg = quiet(config(mode, **dict(options)))  # a join, not a failover
    join = JoinBackup(cfg, at, shard=shard)
    got = run_with(cfg, join)
    want = plain(cfg)
    final = want.out.shards[shard]["version"]
    assert join.joined is not None, f"no backup joined at step {at}"
    assert 0 < join.joined.version == join.joined.primary_version < final, join.joined
    said = [r.getMessage() for r in caplog.records if r.name == "psrv.server" and " joined at op " in r.getMessage()]
    assert [m for m in said if m.startswith(f"shard {shard}: backup {join.joined.address} joined at op ")
            and m.endswith(f", version {join.joined.version})")], said  # the version its state was sent at
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
