"""The primary's half of replication: its backups, the stream of what it applies, and replies held until
every live backup holds what they acknowledge (docs/reliability.md, "Replicated shards").

Primary-backup, op-based. Every request that can change the shard's state (HELLO, INIT, PUSH, PULL,
PUSH_PULL, LEAVE) is forwarded to each live backup as its own frames, in the order the primary applies
them (sent as it starts on one, so the acks travel while it works), and so is each decision the primary
takes on its own (workers dropped for silence). The backups run
the same ShardService code on the same ops in the same order, so their weights, optimizer state, clocks and
exactly-once table equal the primary's. While a request is handled its replies are kept in `outbox`; they
go out only once every live backup has acknowledged the op (`ack`), so no worker hears of an update that a
backup does not hold. A backup joins by asking ("join"); it gets the shard's state_dict first, then the
stream (psrv/server/stream.py). It is sent the state at a turn when nothing is half done: no chunked push
half applied, no push held behind one, and no pull waiting for its answer (answering one changes state
the backup could not replay: a compressed pull's copy, DC-ASGD's record of the weights the worker pulled).

Fencing: a backup that took over (psrv/server/follower.py) has a higher epoch and answers this primary's
stream with "fenced"; the primary then stops at once, its held replies unsent. A backup that does not
acknowledge within ACK_TIMEOUT is dropped from the live set (it may join again, from the state).
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Hashable

from psrv.protocol import MsgType
from psrv.server import stream
from psrv.transport import ClientTransport

log = logging.getLogger("psrv.server")

REPLICATED = (MsgType.HELLO, MsgType.INIT, MsgType.PUSH, MsgType.PULL, MsgType.PUSH_PULL, MsgType.LEAVE)
ACK_TIMEOUT = 5.0   # seconds a primary waits for a backup's ack before it goes on without that backup
PING_EVERY = 0.2    # an idle stream carries a ping this often: the backups' sign that the primary lives
AWAIT_BACKUPS = 60.0  # seconds a primary told of its backups (rpc_backups) holds the workers' requests for them


@dataclass
class Backup:
    address: str
    link: ClientTransport


class Replicas:
    """`service` is the ShardService (psrv/server/service.py) whose backups these are; used through its
    public members: cfg, shard, chunks, held, pending, pulls, fragments, state_dict, transport, stopped, now."""

    def __init__(self, service):
        self.s = service
        self.epoch = 0
        self.backups: list[Backup] = []
        self.joining: list[str] = []      # backups that asked to join, sent the state once nothing is half done
        self.n = 0                        # ops sent so far
        self.outbox: list[tuple[Hashable, list]] | None = None
        self.fenced = False
        self.admitted = 0                 # backups sent the state so far (a backup asking again counts again)
        self._pinged = service.now()
        # Over torch RPC a primary knows how many backups its world holds (`rpc_backups`): the workers' requests
        # wait until they have joined (at most AWAIT_BACKUPS s), so none joins after the first pushes and every
        # replica counts what its primary counts. Over zmq `psrv run` starts the workers once the backups follow.
        self.expected = 0 if service.cfg.backup_of else int(getattr(service.cfg, "rpc_backups", 0) or 0)
        self.early: list[tuple[Hashable, list]] = []
        self._started = service.now()

    @property
    def addresses(self) -> list[str]:
        """This shard's replicas as workers are told them (WELCOME's `replicas`): this one, then its backups."""
        return [self.s.transport.address, *(b.address for b in self.backups)]

    @contextlib.contextmanager
    def deferring(self):
        """Hold the replies made inside the block until the block's ops are acknowledged, then send them
        (none once fenced). Without backups replies go out at once, as they always did."""
        if not self.backups:
            yield
            return
        self.outbox = []
        try:
            yield
        finally:
            held, self.outbox = self.outbox, None
            for peer, frames in held if not self.fenced else ():
                self.s.transport.send(peer, frames)

    def hold(self, peer: Hashable, frames: list) -> bool:
        """Keep a reply for the end of `deferring` (True), or leave it to be sent now (False)."""
        if self.outbox is None:
            return False
        self.outbox.append((peer, frames))
        return True

    def protect(self) -> None:
        """The weights are about to be written: the held replies that view them get a copy (rare: a reply
        with weights is mostly made after the write its request brought)."""
        for i, (peer, frames) in enumerate(self.outbox or ()):
            if len(frames) > 1 and not isinstance(frames[1], bytes):
                self.outbox[i] = (peer, [frames[0], *(bytes(memoryview(f)) for f in frames[1:])])

    def send(self, op: str, payload: list | tuple = (), **fields) -> int | None:
        """Send op to every live backup without waiting: its number, for wait(); None without backups. The
        primary applies the op meanwhile, so the backups' acks travel while it works."""
        if not self.backups:
            return None
        self.n += 1
        frames = stream.frames_of(op, self.epoch, payload, n=self.n, **fields)
        for b in self.backups:
            b.link.send(0, frames)
        self._pinged = self.s.now()
        return self.n

    def wait(self, n: int | None) -> None:
        """Until every live backup acknowledged op n (or was dropped, or fenced us); at once for None."""
        if n is None:
            return
        deadline = time.monotonic() + ACK_TIMEOUT
        for b in list(self.backups):
            self._await(b, n, deadline)

    def _await(self, b: Backup, n: int, deadline: float) -> None:
        while not self.fenced:
            got = b.link.recv(max(0.0, deadline - time.monotonic()))
            if got is None:
                log.warning("shard %d: backup %s did not acknowledge op %d within %gs; going on without it",
                            self.s.cfg.shard, b.address, n, ACK_TIMEOUT)
                self._drop(b)
                return
            if self._answer(b, got[1], n):
                return

    def _answer(self, b: Backup, frames: list, n: int) -> bool:
        """Take one answer of backup b; True once it acknowledged op n (or was set aside)."""
        try:
            head, _ = stream.read(frames)
        except ValueError:
            return False
        if head["op"] == "fenced":
            self.fence(int(head.get("epoch", 0)), b.address)
            return True
        if head["op"] == "gap":  # it missed an op: it starts again from the state
            self._drop(b)
            self.joining.append(b.address)
            return True
        return head["op"] == "ack" and int(head.get("n", -1)) >= n

    def fence(self, epoch: int, by: str) -> None:
        log.error("shard %d: %s took over this shard at epoch %d (this primary's is %d); this primary stops "
                  "without answering", self.s.cfg.shard, by, epoch, self.epoch)
        self.fenced = True
        self.s.stopped = True

    def _drop(self, b: Backup) -> None:
        if b in self.backups:
            self.backups.remove(b)
        b.link.close()

    def awaiting(self, peer: Hashable, frames: list) -> bool:
        """True, keeping the request to answer later, while this primary waits for its expected backups."""
        if not self.expected or len(self.backups) >= self.expected or self._late():
            return False
        self.early.append((peer, frames))
        return True

    def _late(self) -> bool:
        late = self.s.now() - self._started > AWAIT_BACKUPS
        if late and self.expected:
            log.warning("shard %d: %d of %d backups joined within %gs; serving without the others",
                        self.s.cfg.shard, len(self.backups), self.expected, AWAIT_BACKUPS)
            self.expected = 0
        return late

    def join(self, address: str) -> None:
        """A backup asked to follow this shard: it gets the state at the next turn when nothing is half done."""
        for b in [b for b in self.backups if b.address == address]:  # joining again: from the state
            self._drop(b)
        if address not in self.joining:
            self.joining.append(address)

    def tick(self) -> None:
        """Every turn of the loop: send the state to those joining, ping an idle stream, read any fencing."""
        if self.joining and not self.s.chunks.applying and not len(self.s.held) and not len(self.s.pending):
            for address in self.joining:
                self._admit(address)
            self.joining = []
        if self.early and (len(self.backups) >= self.expected or self._late()):
            early, self.early = self.early, []
            for peer, frames in early:  # the requests that waited for the backups, in the order they came
                self.s.handle(peer, frames)
        for b in list(self.backups):
            got = b.link.recv(0)
            while got is not None and not self.fenced:
                self._answer(b, got[1], self.n + 1)
                got = b.link.recv(0) if b in self.backups else None
        if self.backups and self.s.now() - self._pinged >= PING_EVERY:
            self._pinged = self.s.now()
            for b in self.backups:
                b.link.send(0, stream.frames_of("ping", self.epoch, n=self.n))

    def _admit(self, address: str) -> None:
        """Send a joining backup the shard's state, with what a checkpoint leaves out but a backup must hold
        to go on as this shard would: the workers' compressed-pull copies (psrv/server/pulls.py) and streaming
        DiLoCo's per-fragment outer optimizers (psrv/server/fragments.py); then follow with the stream."""
        state = self.s.state_dict() if self.s.shard is not None else None
        link = self.s.transport.link(address)
        extra = {"pulls": self.s.pulls.state_dict(), "fragments": self.s.fragments.state_dict()}
        payload = [stream.state_bytes({**state, **extra})] if state is not None else []
        link.send(0, stream.frames_of("state", self.epoch, payload, n=self.n, replicas=[*self.addresses, address],
                                      pull_numbers=self.s.pulls.numbers))
        self.backups.append(Backup(address, link))
        self.admitted += 1
        log.info("shard %d: backup %s joined at op %d (version %d)", self.s.cfg.shard, address, self.n,
                 self.s.shard.version if self.s.shard is not None else 0)

    def close(self) -> None:
        for b in self.backups:
            b.link.close()
        self.backups = []
