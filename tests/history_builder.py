"""Run folders written by hand for the history checker's tests: config.json, the history's jsonl files
(docs/history.md's format, one event per call, in the order of the calls) and the run's records.

    run = RunFolder(tmp_path, mode="async")
    w0, p = run.worker(0), run.replica(0, "primary")
    run.step(w0, p, seq=1, clock=0)           # push, apply, ack, answer and pull, each where it is recorded
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path


class Proc:
    """One process life's file, DIR/history/NAME.PID.jsonl; `proc(ev, **fields)` records an event, returns its line."""

    def __init__(self, run: RunFolder, name: str, start: dict):
        self.run, self.path, self.lines = run, run.history / f"{name}.{next(run.pids)}.jsonl", 0
        self.version = 0  # a replica's shard version
        self.address = start.get("address")
        self.w = start.get("w")
        self("start", **start)

    @property
    def file(self) -> str:
        return self.path.name

    def __call__(self, ev: str, **fields) -> int:
        self.append(json.dumps({"ev": ev, "t": next(self.run.clock), **fields}) + "\n")
        return self.lines

    def append(self, text: str) -> None:
        with open(self.path, "a") as f:
            f.write(text)
        self.lines += text.count("\n")

    def apply(self, w: int, seq: int, clock: int, epoch: int = 0, age: int | None = None, part: int | None = None) -> int:
        """A push applied (sync: accumulated, the version stays; `age`: the merges since its weights; `part`: the
        fragment whose quorum merge it joins)."""
        if self.run.mode != "sync":
            self.version += 1
        return self("apply", w=w, seq=seq, clock=clock, version=self.version, epoch=epoch,
                    **({} if age is None else {"age": age}), **({} if part is None else {"part": part}))

    def commit(self, clock: int, pushed: list[int], need: int, active: list[int] | None = None, **more) -> int:
        self.version += more.get("updates", 1)  # a quorum's merge of fragments: one step each
        return self("commit", clock=clock, version=self.version, pushed=pushed, need=need,
                    active=list(range(self.run.workers)) if active is None else active, **more)


class RunFolder:
    def __init__(self, tmp: Path, *, mode: str, workers: int = 2, servers: int = 1, staleness: int = 2,
                 backup_workers: int = 0, quorum: int = 0, quorum_max_age: int = 0, quorum_grace: float = 0.0):
        self.dir, self.mode, self.workers = tmp, mode, workers
        self.history = tmp / "history"
        self.history.mkdir(parents=True)
        self.clock = (round(0.001 * i, 3) for i in itertools.count(1))  # CLOCK_MONOTONIC, in call order
        self.pids = itertools.count(100)
        config = {"mode": mode, "cluster": {"workers": workers, "servers": servers}}
        if mode == "ssp":
            config["staleness"] = staleness
        if backup_workers:
            config["backup_workers"] = backup_workers
        if quorum:
            config.update(quorum=quorum, quorum_max_age=quorum_max_age, quorum_grace=quorum_grace)
        (tmp / "config.json").write_text(json.dumps(config))

    def worker(self, w: int) -> Proc:
        return Proc(self, f"worker-{w}", {"role": "worker", "w": w, "pid": 0, "wall": 0.0})

    def replica(self, shard: int, role: str, address: str = "tcp://127.0.0.1:5000", *, epoch: int = 0,
                primary: str = "tcp://127.0.0.1:5000") -> Proc:
        """A replica life, serving `epoch` as primary or following `primary` in it as a backup."""
        proc = Proc(self, f"shard-{shard}", {"role": role, "shard": shard, "address": address, "pid": 0, "wall": 0.0})
        proc("epoch", epoch=epoch, role=role, primary=address if role == "primary" else primary)
        return proc

    def push(self, worker: Proc, seq: int, clock: int, shard: int = 0, to: str = "tcp://127.0.0.1:5000") -> int:
        return worker("push", w=worker.w, seq=seq, shard=shard, clock=clock, to=to)

    def ack(self, worker: Proc, primary: Proc, seq: int, shard: int = 0, epoch: int = 0,
            dropped: str | None = None) -> int:
        """The primary's answer leaves, and the worker takes it."""
        primary("ack", w=worker.w, seq=seq, epoch=epoch, version=primary.version)
        return worker("ack", w=worker.w, seq=seq, shard=shard, epoch=epoch, version=primary.version,
                      dropped=dropped, **{"from": primary.address})

    def answer(self, worker: Proc, primary: Proc, seq: int, clock: int, shard: int = 0, epoch: int = 0) -> int:
        """A pull for `clock` answered by the primary, and taken by the worker; returns the worker's line."""
        primary("answer", w=worker.w, seq=seq, clock=clock, version=primary.version, epoch=epoch)
        return worker("pull", w=worker.w, seq=seq, shard=shard, clock=clock, version=primary.version, epoch=epoch)

    def step(self, worker: Proc, primary: Proc, *, seq: int, clock: int, backups: tuple = (), epoch: int = 0,
             shard: int = 0) -> None:
        """Async or ssp: one PUSH_PULL, applied by the primary and every backup, acknowledged, answered."""
        self.push(worker, seq, clock, shard, primary.address)
        for replica in (primary, *backups):
            replica.apply(worker.w, seq, clock, epoch)
        self.ack(worker, primary, seq, shard, epoch)
        self.answer(worker, primary, seq, clock + 1, shard, epoch)

    def join(self, primary: Proc, backup: Proc, n: int, epoch: int = 0) -> None:
        """`backup` loads `primary`'s state at op `n`."""
        primary("sent_state", to=backup.address, n=n, epoch=epoch)
        backup("state", n=n, epoch=epoch, **{"from": primary.address})
        backup.version = primary.version

    def record(self, name: str, **fields) -> None:
        """DIR/NAME.json: a run's record (summary, server-K)."""
        (self.dir / f"{name}.json").write_text(json.dumps(fields))


def ssp_case(tmp: Path, *, slowest_leaves: bool) -> RunFolder:
    """ssp with s = 1: worker 0 runs two clocks ahead of worker 1, which either left first or did not."""
    run = RunFolder(tmp, mode="ssp", staleness=1)
    w0, w1 = run.worker(0), run.worker(1)
    p = run.replica(0, "primary")
    run.step(w0, p, seq=1, clock=0)  # answered for clock 1, worker 1 at 0: 1 ahead
    if slowest_leaves:
        p("member", w=1, what="leave")
    run.step(w0, p, seq=2, clock=1)  # answered for clock 2: 2 ahead of worker 1, if it is still active
    return run
