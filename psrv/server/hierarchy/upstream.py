"""A regional shard's syncs with its global shard (--upstream; HALoS's local server, docs/algorithms.md "A
hierarchy of servers").

The regional shard serves its region's workers as any asynchronous shard does. Every --upstream-every of its
updates it pushes its change since the last sync, delta = anchor - w_sent (`anchor`: the global weights it
last took, `w_sent`: its weights now), to its global shard as that shard's worker `region`; the global shard
steps its own optimizer on delta and answers with its weights g. Meanwhile the regional shard goes on
serving. When g arrives it becomes the shard's weights plus what the shard did since it sent:
w <- w + (g - w_sent), and anchor <- g. One sync is in flight at a time. The round trips run in a thread
of their own (Link), so a slow link between regions never stops the region; the merge runs in the shard's
loop, which owns the weights.

Start: region 0's shard joins once its rank 0 has sent the initial weights (it offers them to the global
shard: INIT, first writer wins); another region's shard takes its first weights from the global shard.
End: once its workers have left, a last sync with whatever changed since the last, then LEAVE: the
shard's final weights are the global shard's.
"""
from __future__ import annotations

import logging
import queue
import secrets
import threading
import time

import torch

from psrv.protocol import Message, MsgType, decode, encode
from psrv.transport import create_client

log = logging.getLogger("psrv.server")
TIMEOUT = 120.0  # seconds a round trip to the global shard may take before the regional shard gives up
LEAVE_WAIT = 10.0  # seconds a regional shard whose weights are final waits for its LEAVE to be answered


class UpstreamError(RuntimeError):
    """The global shard refused a sync or did not answer: the regional shard stops (it cannot merge)."""


class Link(threading.Thread):
    """The round trips to the global shard, one at a time, in order: `ask` queues one, `answer` (or `wait`)
    gives the global weights it brought back, or raises what went wrong. Between them it sends a HEARTBEAT every
    third of the global shard's --worker-timeout (its WELCOME says it), so a region whose syncs are far apart (a
    long evaluation, slow workers) is not dropped, and says HELLO again where it was."""

    heartbeats = True  # tests turn them off to see a region dropped and coming back

    def __init__(self, address: str, *, region: int, regions: int, hello: dict):
        super().__init__(name="psrv-upstream", daemon=True)
        self.address, self.region, self.regions, self.hello = address, region, regions, hello
        self.jobs: queue.Queue = queue.Queue()
        self.results: queue.Queue = queue.Queue()
        self.session = secrets.randbits(63) or 1
        self.seq = 0
        self.version = 0  # the global shard's, at its last answer: the next push's base version
        self.bytes_sent = self.bytes_received = 0
        self.seconds = 0.0  # spent in round trips
        self.beat: float | None = None  # seconds between heartbeats, once welcomed

    def ask(self, kind: str, tensor: torch.Tensor | None = None, clock: int = 0) -> None:
        self.jobs.put((kind, tensor, clock))

    def answer(self) -> torch.Tensor | None:
        """The weights of the round trip that ended, if one has; None while it runs."""
        try:
            result = self.results.get_nowait()
        except queue.Empty:
            return None
        return self._unwrap(result)

    def wait(self, timeout: float | None = None) -> torch.Tensor | None:
        """The weights of the job in flight, once it ends (at most `timeout` seconds). None: a backstop behind the
        link's own timeouts, each TIMEOUT, of which a join has up to four (its ready file, HELLO, INIT, PULL), so
        that the link says which round trip went unanswered."""
        timeout = 5 * TIMEOUT if timeout is None else timeout
        try:
            result = self.results.get(timeout=timeout)
        except queue.Empty:
            raise UpstreamError(f"no answer from the global shard {self.address} in {timeout:.0f}s") from None
        return self._unwrap(result)

    @staticmethod
    def _unwrap(result):
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self) -> None:
        self.jobs.put(None)
        self.join(timeout=10.0)

    def run(self) -> None:
        from psrv.transport.addresses import split_addresses
        try:
            (address,) = split_addresses(self.address, wait=TIMEOUT, option="--upstream", schemes=("tcp",))
            net = create_client("zmq", [address])
        except Exception as exc:  # noqa: BLE001 (said to the shard's loop, which stops on it)
            self.results.put(UpstreamError(str(exc)))  # it names --upstream and the address
            return
        try:
            while True:
                try:
                    job = self.jobs.get(timeout=self.beat)
                except queue.Empty:  # nothing to do for a third of the worker timeout: a heartbeat
                    job = ("beat", None, 0)
                if job is None:
                    break
                try:
                    result = self._do(net, *job)
                    if job[0] != "beat":
                        self.results.put(result)
                except Exception as exc:  # noqa: BLE001
                    self.results.put(exc if isinstance(exc, UpstreamError) else UpstreamError(
                        f"sync with the global shard {address}: {type(exc).__name__}: {exc}"))
        finally:
            net.close()

    def _do(self, net, kind: str, tensor: torch.Tensor | None, clock: int) -> torch.Tensor | None:
        if kind == "beat":
            if not self._ask(net, Message(MsgType.HEARTBEAT)).fields.get("active", True):
                self._ask(net, self._hello())  # dropped meanwhile: back in before the next sync
            return None
        if kind == "join":  # HELLO; INIT where this shard has weights to offer; then the global weights
            timeout = self._ask(net, self._hello()).fields.get("worker_timeout")
            if self.heartbeats and isinstance(timeout, (int, float)) and timeout > 0:
                self.beat = timeout / 3
            if tensor is not None:
                self._ask(net, Message(MsgType.INIT, tensor=tensor))
            return self._ask(net, Message(MsgType.PULL, clock=0)).tensor.clone()
        if kind == "sync":
            reply = self._ask(net, Message(MsgType.PUSH_PULL, clock=clock, base_version=self.version, tensor=tensor))
            return reply.tensor.clone()
        if kind == "leave":
            self._ask(net, Message(MsgType.LEAVE))
            return None
        raise ValueError(f"no round trip named {kind!r}")

    def _ask(self, net, msg: Message) -> Message:
        """One round trip; a global shard that forgot this region (silent past its --worker-timeout between two
        syncs) refuses with `hello`: HELLO again, then the request once more (a refused push was not applied)."""
        reply = self._once(net, msg)
        if reply.type is MsgType.ERROR and reply.fields.get("hello") and msg.type is not MsgType.HELLO:
            log.info("region %d: the global shard %s forgot it; HELLO again", self.region, self.address)
            self._check(self._once(net, self._hello()), MsgType.HELLO)
            reply = self._once(net, msg)
        return self._check(reply, msg.type)

    def _hello(self) -> Message:
        return Message(MsgType.HELLO, fields={**self.hello, "world_size": self.regions})

    def _check(self, reply: Message, asked: MsgType) -> Message:
        if reply.type is MsgType.ERROR:
            raise UpstreamError(f"the global shard {self.address} refused {asked.name}: "
                                f"{reply.fields.get('message', reply.fields)}")
        if isinstance(reply.fields.get("version"), int):
            self.version = reply.fields["version"]
        return reply

    def _once(self, net, msg: Message) -> Message:
        self.seq += 1
        msg.worker, msg.seq, msg.session = self.region, self.seq, self.session
        frames = encode(msg)
        started = time.perf_counter()
        net.send(0, frames)
        self.bytes_sent += sum(memoryview(f).nbytes for f in frames)
        got = net.recv(TIMEOUT)
        self.seconds += time.perf_counter() - started
        if got is None:
            raise UpstreamError(f"{msg.type.name} to the global shard {self.address} unanswered in {TIMEOUT:.0f}s")
        _, reply_frames = got
        self.bytes_received += sum(memoryview(f).nbytes for f in reply_frames)
        return decode(reply_frames)


class Upstream:
    """The syncs of one regional shard (`state`: its ShardState; `service`: its ShardService), driven by the
    shard's loop: `tick` after each request, `finish` once its workers have left."""

    def __init__(self, state, service):
        self.state, self.service = state, service
        cfg = state.cfg
        self.on = bool(cfg.upstream)
        self.every = cfg.upstream_every
        self.link: Link | None = None
        self.anchor: torch.Tensor | None = None  # the global weights at the last merge
        self.sent: torch.Tensor | None = None    # this shard's weights when the sync in flight was sent
        self.sent_version = 0                    # this shard's version then
        self.syncs = 0
        self.joined = False

    def tick(self) -> None:
        s = self.state
        if not self.on or s.shard is None or s.plan_hash is None:
            return
        if self.link is None:
            if s.cfg.region == 0 and not s.shard.initialised:  # its rank 0 brings the run's initial weights
                return
            self._join()
        got = self.link.answer()
        if got is not None:
            self._merge(got)
        if self.sent is None and self.joined and s.shard.version - self.sent_version >= self.every:
            self._send()

    def finish(self) -> None:
        """A last sync of what changed since the last, then LEAVE."""
        if self.link is None:
            return
        try:
            if self.sent is not None or not self.joined:
                self._merge(self.link.wait())
            if self.state.shard.version != self.sent_version:
                self._send()
                self._merge(self.link.wait())
            self.link.ask("leave")
            self.link.wait(timeout=LEAVE_WAIT)
        finally:
            self.link.close()

    def summary(self) -> dict:
        if not self.on:
            return {}
        link = self.link
        return {"upstream": {"address": self.state.cfg.upstream, "region": self.state.cfg.region,
                             "every": self.every, "syncs": self.syncs,
                             "bytes_sent": link.bytes_sent if link else 0,
                             "bytes_received": link.bytes_received if link else 0,
                             "seconds": round(link.seconds, 4) if link else 0.0}}

    # ---------------------------------------------------------------------------------------------------------
    def _join(self) -> None:
        s = self.state
        hello = {"plan_hash": s.plan_hash, "total": s.plan_total, "num_shards": s.cfg.num_shards,
                 "shard": s.cfg.shard}
        self.link = Link(s.cfg.upstream, region=s.cfg.region, regions=s.cfg.upstream_world, hello=hello)
        self.link.start()
        initial = s.shard.weights.detach().clone() if s.shard.initialised else None
        self.sent, self.sent_version = initial, s.shard.version
        self.link.ask("join", None if initial is None else initial.cpu())
        log.info("shard %d: region %d syncing with %s every %d updates", s.cfg.shard, s.cfg.region,
                 s.cfg.upstream, self.every)

    def _send(self) -> None:
        shard = self.state.shard
        self.sent = shard.weights.detach().clone()
        self.sent_version = shard.version
        self.syncs += 1
        self.link.ask("sync", (self.anchor - self.sent).cpu(), clock=self.syncs)  # the wire takes host memory

    def _merge(self, global_weights: torch.Tensor) -> None:
        """w <- w + (g - w_sent): the global weights plus this shard's updates since it sent."""
        shard, pulls = self.state.shard, self.service.pulls
        global_weights = global_weights.to(shard.device)  # a shard on a GPU: the link's tensors are in host memory
        self.service.pushes.before_write()  # replies still reading the weights leave first
        if not shard.initialised:  # a region but the first: its first weights are the global shard's
            shard.init(global_weights)
            pulls.release()
        elif self.sent is not None:
            shard.weights.add_(global_weights - self.sent)
        self.anchor, self.sent, self.joined = global_weights, None, True
