"""PSClient: what a worker uses to talk to every shard at once (push, pull, push_pull).

Requests to all shards are sent first and the replies collected after, so shards work
concurrently. Every call returns the versions it saw (ps-lite's timestamps), so staleness
is measured, never guessed. A request left unanswered is probed and, if the shard no longer
holds it, re-sent with the SAME seq (the shard applies a push at most once); a shard that
forgot this worker (restarted, or dropped it for silence) is greeted again first. Every request
carries this process's random session id, so a second live process with the same rank is refused.
A push's messages, cast or compressed shard by shard, are made by PushMessages (psrv/client/push_messages.py).
"""
from __future__ import annotations

import logging
import os
import secrets
import time
from typing import Callable, Sequence

import torch

from psrv.config.base import defaults_of
from psrv.history import History
from psrv.timeouts import Timeouts
from psrv.config.sections import Placement, WorkerSettings
from psrv.codecs import CASTS, make as make_codec
from psrv.codecs.push import PushEncoder
from psrv.client.heartbeat import Heartbeat
from psrv.client.in_place import InPlacePulls
from psrv.client.momentum_correction import MomentumCorrection, from_welcomes as velocity_from
from psrv.client.onebit import LocalMomentum, from_welcomes, momentum_encoder
from psrv.client.pull_view import PULL_SIGN_SCALE, PullView
from psrv.client.push_messages import PushMessages
from psrv.client.settings import CLIENT_KEYWORDS, overlaid
from psrv.client.shard_addresses import ShardAddresses
from psrv.protocol import ErrorCode, Message, MsgType
from psrv.partition import PartitionPlan
from psrv.protocol.codec import DTYPES
from psrv.client.roundtrip import PSError, PushPull, Reply, RoundTrip, WireBytes
from psrv.client.waiting import LIBRARY_OPTION
from psrv.transport import ClientTransport, create_client

PREDECESSOR_DEAD = "PSRV_PREDECESSOR_DEAD"  # set by psrv run for a worker it restarted

log = logging.getLogger("psrv.client.psclient")
_PLACE = defaults_of(Placement)  # the planes' and transport's defaults: one source


class PSClient(PushMessages):
    """Every shard at once, for one worker: HELLO, pushes, pulls and push-pulls, the codecs both ways and the
    round trips that survive a lost message or a restarted shard. `settings` (a WorkerSettings; keywords named
    after its fields, `timeout` for request_timeout, lay values over it) says how pushes and pulls travel:
    each setting is described and checked once, in psrv/config/worker_settings.py. The rest is the client's
    own: `retry_interval`, the first wait before probing an unanswered request (doubling up to 8x);
    `shared_memory` and `bulk`, whether to offer those payload planes (zmq; psrv/transport/plane.py); `net`, a
    transport to use instead (tests wrap it to drop or duplicate messages); `pull_min_numel`, the pulls' own
    dense threshold (None: the pushes' compress_min_numel); `timeout_option`, what the errors and the waiting
    lines of an unanswered HELLO call the timeout (`timeout=`; `psrv worker` passes `--request-timeout`).
    `wire` counts the bytes of every frame sent and received (WireBytes)."""

    def __init__(self, servers: Sequence[str], plan: PartitionPlan, settings: WorkerSettings | None = None, *,
                 worker: int, world_size: int, transport: str = _PLACE.transport, retry_interval: float = 1.0,
                 curve_keys: str = "", heartbeat: bool = True, shared_memory: bool = _PLACE.shared_memory == "auto",
                 bulk: bool = _PLACE.bulk == "auto", net: ClientTransport | None = None,
                 pull_min_numel: int | None = None, timeout_option: str = LIBRARY_OPTION, **overrides):
        settings = overlaid(settings, overrides, who="PSClient", allowed=CLIENT_KEYWORDS)
        self.settings = settings
        timeout, compress = settings.request_timeout, settings.compress
        if len(servers) != plan.num_shards:
            raise ValueError(f"{len(servers)} server addresses for a plan of {plan.num_shards} shards")
        self.plan = plan
        self._layout = plan.layout()  # said at every HELLO
        self.worker = worker
        self.world_size = world_size
        self.timeout = timeout
        self.timeout_option = timeout_option  # what the messages about `timeout` call it (RoundTrip)
        # every push sent and acknowledged, for psrv check (docs/history.md), where PSRV_HISTORY says
        self.history = History.from_env(f"worker-{worker}")
        self.history.start("worker", w=worker)
        # psrv run restarted this rank and saw its last process die (experiments/launcher/worker_restarts.py): the
        # shards hand it the rank at once instead of after --worker-timeout of the dead one's silence
        self.predecessor_dead = os.environ.get(PREDECESSOR_DEAD) == "1"
        self.retry_interval = retry_interval
        self.recent_seconds = 0.0  # how long this client's round trips with a payload take lately (RoundTrip)
        self.ranges = plan.ranges
        self.versions = [0] * plan.num_shards
        self.wire_dtype = DTYPES[CASTS.get(compress, settings.wire_dtype)]  # float16/bfloat16: that wire dtype
        self.sign_scale = settings.sign_scale
        scale = "l2" if settings.sign_scale == "auto" else settings.sign_scale  # auto: l2 (onebit_adam's: onebit.py)
        codec = make_codec(compress, seed=worker, sign_scale=scale)
        self._encoder_options = {"error_feedback": settings.error_feedback, "min_numel": settings.compress_min_numel,
                                 "warmup": settings.compress_warmup, "decay": settings.error_feedback_decay}
        self.encoder = None if codec is None else PushEncoder(codec, plan, **self._encoder_options)
        self.compress = compress  # the codec pushes run with (onebit_adam's sign where none was given)
        self.pull_view = None if not settings.compress_pull else PullView(
            plan, settings.compress_pull, error_feedback=settings.pull_error_feedback, resync=settings.pull_resync,
            min_numel=settings.compress_min_numel if pull_min_numel is None else pull_min_numel,
            sign_scale=PULL_SIGN_SCALE)
        self.onebit: LocalMomentum | None = None  # set by hello() when the shards run onebit_adam
        self.momentum_correction, self.momentum_masking = settings.momentum_correction, settings.momentum_masking
        self.velocity: MomentumCorrection | None = None  # set by hello(): a lossy codec meets SGD momentum
        self._at: torch.Tensor | None = None  # the weights this push's gradient was computed at (weight decay)
        self.wire = WireBytes()
        # zmq only: torch RPC answers every message (a future per call), and a chunk but the last gets none
        self.push_chunk_bytes = int(settings.push_chunk_mb * 2**20) if transport == "zmq" else 0
        self.chunked = False  # set by hello(): every shard takes chunks (WELCOME's `chunks`)
        self._wire: torch.Tensor | None = None  # the gradient cast to wire_dtype, reused every push
        self._seq = 0
        self.session = secrets.randbits(63) or 1  # this process, as the shards tell it from another of this rank
        self._sent_init = False
        self._warned_late = False
        self.servers = list(servers)  # the shards' addresses, in shard order
        self._options = {"curve_keys": curve_keys, "curve_name": f"worker-{worker}"} if curve_keys else {}
        # the transport to the shards, on which RoundTrip sends (psrv/client/roundtrip.py)
        self.net = net or create_client(transport, self.servers, worker=worker, world_size=world_size,
                                        shared_memory=shared_memory, bulk=bulk, watch=True, **self._options)
        # each shard's replicas (`failover`): told by WELCOME, and those the transport knows from the start (the
        # backups of a fixed RPC world, which may join their primary only after this worker's HELLO)
        self.in_place = InPlacePulls(self.net, wanted=settings.pull_in_place, worker=worker)
        self.addresses = ShardAddresses(self.servers, self.net, worker=worker)
        self.servers = self.addresses.servers  # one list, updated in place as shards move
        # zmq sockets are not thread-safe: the heartbeat thread opens its own (rpc has one world per process)
        self._heartbeat_on = heartbeat and transport == "zmq"
        self._heartbeat: Heartbeat | None = None

    # --- the public face ----------------------------------------------------
    def hello(self) -> list[dict]:
        """Introduce this worker to every shard; raises PSError on a plan mismatch, or RANK_IN_USE
        when another live process works as this rank. A refused HELLO is tried again for one
        worker_timeout (+1 s): a crashed process of this rank goes silent within it, a live one does not."""
        welcomes = [m.fields for m in self._hellos()]
        try:
            self._follow_onebit(welcomes)
            if self.momentum_correction and self.velocity is None and self.encoder is not None \
                    and self.encoder.error is not None:  # it corrects what error feedback's residual does
                self.velocity = velocity_from(welcomes, self.ranges, mode=welcomes[0].get("mode", ""),
                                              masking=self.momentum_masking)
        except ValueError:  # settings that do not fit the shards': leave, so no barrier waits for us
            self.leave(timeout=2.0)
            raise
        self.chunked = self.push_chunk_bytes > 0 and all(w.get("chunks") for w in welcomes)
        self.in_place.welcomed(welcomes, shards=len(self.ranges), compressed_pulls=self.pull_view is not None)
        for s, w in enumerate(welcomes):  # a replicated shard's backups: where to go if its primary falls silent
            if isinstance(w.get("replicas"), list):
                self.addresses.welcomed(s, w["replicas"])
        bounds = [float(w["failure_bound"]) for s, w in enumerate(welcomes)
                  if self.addresses.replicated(s) and isinstance(w.get("failure_bound"), (int, float))]
        if bounds:  # a replicated shard's silence is probed within its failure bound (psrv/timeouts.py)
            self.retry_interval = min(self.retry_interval, Timeouts(min(bounds), 0.0).probe_after)
        # A restarted worker continues after its previous life's seqs, so no push of it looks re-sent.
        self._seq = max([self._seq] + [int(w.get("last_seq", 0)) for w in welcomes])
        timeouts = [w["worker_timeout"] for w in welcomes if isinstance(w.get("worker_timeout"), (int, float))]
        if self._heartbeat_on and self._heartbeat is None and timeouts:
            self._heartbeat = Heartbeat(self.servers, worker=self.worker, interval=min(timeouts) / 3,
                                        session=self.session, options=self._options)
            self._heartbeat.start()
        return welcomes

    def init(self, flat: torch.Tensor) -> None:
        """Offer initial weights (rank 0); shards already initialised keep theirs."""
        self._sent_init = True
        self._round_trip([self.message(MsgType.INIT, tensor=flat[lo:hi]) for lo, hi in self.ranges])

    def pull(self, *, clock: int, out: torch.Tensor, final: bool = False) -> Reply:
        """Weights for `clock` copied into `out`; blocks while the shard's controller holds them back."""
        fields = {"final": True} if final else {}
        msgs = [self.message(MsgType.PULL, clock=clock, fields={**fields, **self.pull_fields(s)})
                for s in range(len(self.ranges))]
        return self.receive_weights(out, lambda: self._round_trip(msgs))

    def first_pull(self, welcomes: list[dict], *, out: torch.Tensor) -> Reply:
        """The first weights after hello(), for the latest clock a shard's WELCOME said. Where a shard has none
        yet (WELCOME's `initialised`) and this client sent no INIT, that is rank 0's to send: say so, and wait
        at most `timeout` seconds."""
        waiting = [] if self._sent_init else [s for s, w in enumerate(welcomes) if not w.get("initialised")]
        # the latest clock a shard welcomed us at: a sync shard that welcomed a joiner earlier counts it from there
        clock = max((w.get("clock", 0) for w in welcomes), default=0)
        if not waiting:
            return self.pull(clock=clock, out=out)
        log.info("worker %d: waiting for rank 0's initial weights (INIT) from shard(s) %s, at most %gs",
                 self.worker, waiting, self.timeout)
        why = (f"worker {self.worker}: rank 0 never sent the initial weights within {self.timeout:g}s "
               f"(is rank 0 running? {self.timeout_option} sets the bound)")
        self._seq += 1
        msgs = [self.message(MsgType.PULL, clock=clock, fields=self.pull_fields(s)) for s in range(len(self.ranges))]
        rt = RoundTrip(self, msgs, self._seq, self.timeout, limit=self.timeout, why=why)
        return self.receive_weights(out, rt.run)

    def push(self, grad: torch.Tensor, *, clock: int, at: torch.Tensor | None = None) -> Reply:
        """Push the flat gradient of `clock`, computed on the versions last pulled (`at`: those weights,
        which momentum correction's weight decay needs)."""
        self._at = at
        replies = self._round_trip(self._pushes(MsgType.PUSH, grad, clock))
        return self._summarise(replies, [r.fields for r in replies])

    def push_pull(self, grad: torch.Tensor, *, clock: int, out: torch.Tensor,
                  at: torch.Tensor | None = None) -> Reply:
        """Push `clock`'s gradient and pull the weights for clock+1 in one round trip."""
        return self.begin_push_pull(grad, clock=clock, out=out, at=at).finish()

    def begin_push_pull(self, grad: torch.Tensor, *, clock: int, out: torch.Tensor,
                        at: torch.Tensor | None = None) -> PushPull:
        """push_pull in two halves, to overlap communication with backward: `ready(s)` sends shard s's
        slice as soon as it is final (while backward computes the rest), `finish()` sends whatever is
        left and waits. Nothing else may use this client in between. `at`: the weights the gradient was
        computed at (default `out`, which holds them until the pull)."""
        self._at = out if at is None else at
        self._seq += 1
        rt = RoundTrip(self, self._pushes(MsgType.PUSH_PULL, grad, clock, cast=False), self._seq, self.timeout)
        return PushPull(self, rt, grad, out)

    def send_round(self, msgs: list[Message]) -> RoundTrip:
        """Send msgs[s] to shard s now and return without waiting (streaming DiLoCo's fragment push,
        psrv/client/streaming.py); `finish_round` waits for the answers. Nothing else may use this client
        in between."""
        self._seq += 1
        rt = RoundTrip(self, msgs, self._seq, self.timeout)
        for s in range(len(msgs)):
            rt.send(s)
        return rt

    def finish_round(self, rt: RoundTrip) -> tuple[Reply, list[Message]]:
        """Wait for `rt`'s answers (send_round's): the Reply, and each shard's reply as it came."""
        replies = rt.run()
        return self._summarise(replies, [r.fields.get("push", {}) for r in replies]), replies

    def share(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor`'s values where the transport sends them without a copy (shared memory: a shard on
        this host reads a push from it in place); `tensor` itself where it cannot. Push from it."""
        return self.net.share(tensor)

    def stats(self) -> list[dict]:
        return [m.fields for m in self._round_trip([self.message(MsgType.STATS) for _ in self.ranges])]

    def leave(self, *, timeout: float = 5.0) -> None:
        """Say goodbye, waiting at most `timeout` seconds; a shard that already finished may not answer,
        which is fine."""
        beating, self._heartbeat = self._heartbeat, None
        if beating is not None:
            beating.signal()  # it ends while LEAVE travels
        try:
            self._round_trip([self.message(MsgType.LEAVE) for _ in self.ranges], timeout=min(self.timeout, timeout))
        except TimeoutError as exc:
            log.warning("worker %d: LEAVE not acknowledged (%s)", self.worker, exc)
        finally:
            if beating is not None:
                beating.stop()

    def close(self) -> None:
        self._stop_heartbeat()
        self.net.close()
        self.history.close()

    def __enter__(self) -> "PSClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- mechanics ----------------------------------------------------------
    def _follow_onebit(self, welcomes: list[dict]) -> None:
        """Under onebit_adam (WELCOME's `onebit`) keep a local momentum, and push it after the freeze with
        the codec given, or scaled sign (psrv/client/onebit.py)."""
        if self.onebit is not None:
            return
        self.onebit = from_welcomes(welcomes, self.plan.total)
        if self.onebit is not None:
            self.encoder, self.compress = momentum_encoder(self.plan, wire_dtype=self.wire_dtype, encoder=self.encoder,
                                                           compress=self.compress, sign_scale=self.sign_scale,
                                                           options=self._encoder_options)

    def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None

    def message(self, mtype: MsgType, **kw) -> Message:
        """A request from this worker (RoundTrip's too): its id and session filled in."""
        return Message(mtype, worker=self.worker, session=self.session, **kw)

    def _hellos(self) -> list[Message]:
        """HELLO to every shard, again every second while one answers RANK_IN_USE, for at most
        the shards' worker_timeout + 1 s after the first refusal."""
        give_up = None
        while True:
            try:
                return self._round_trip([self.hello_message(s) for s in range(self.plan.num_shards)])
            except PSError as exc:
                if exc.code is not ErrorCode.RANK_IN_USE:
                    raise
                wait = float(exc.fields.get("worker_timeout", 0.0)) + 1.0
                if give_up is None:
                    give_up = time.monotonic() + wait
                    log.warning("worker %d: shard %d says rank %d is in use by another live worker; saying "
                                "HELLO again for up to %.0fs, in case that one has crashed", self.worker,
                                exc.shard, self.worker, wait)
                if time.monotonic() >= give_up:
                    raise
                time.sleep(min(1.0, wait / 4))

    def hello_message(self, shard: int) -> Message:
        """The HELLO that introduces this worker and its plan to `shard` (RoundTrip's too, to say it again); its
        parameters' names and shapes, where few enough, let a shard say which one differs from rank 0's."""
        fields = {"plan_hash": self.plan.hash, "total": self.plan.total, "num_shards": self.plan.num_shards,
                  "shard": shard, "world_size": self.world_size}
        if self._layout is not None:
            fields["layout"] = self._layout
        if self.pull_view is not None:
            fields["pull"] = self.pull_view.hello_fields(shard)
        if self.predecessor_dead:
            fields["predecessor_dead"] = True
        return self.message(MsgType.HELLO, fields=fields)

    def pull_fields(self, shard: int) -> dict:
        """The fields a pull from `shard` carries under compressed pulls: the copy this worker holds (streaming
        DiLoCo's fragment pulls carry them too)."""
        return {} if self.pull_view is None else self.pull_view.request(shard)

    def receive_weights(self, out: torch.Tensor, run: Callable[[], list[Message]]) -> Reply:
        """run() (a round trip answered with weights; PushPull's too) with each shard's weights put in its slice
        of `out`: the transport is told it may write them straight there (receive_into: a shared-memory or bulk
        payload then costs one copy, not two; the hints are withdrawn after, so no later message writes there),
        and what it did not write there is copied. The Reply of what the shards said."""
        direct = out.device.type == "cpu" and out.dtype == torch.float32 and out.is_contiguous()
        view = self.pull_view
        flat = out.detach()
        for s, (lo, hi) in enumerate(self.ranges if direct else ()):
            self.net.receive_into(s, memoryview(flat[lo:hi].numpy()).cast("B"))
        self.in_place.hint(direct)
        try:
            replies = run()
        finally:
            self.in_place.hint(False)
            for s in range(len(self.ranges) if direct else 0):
                self.net.receive_into(s, None)
        weights = out
        for s, ((lo, hi), r) in enumerate(zip(self.ranges, replies)):
            held = self.in_place.weights(s, r) if direct else None
            if view is not None:  # compressed pulls: the reply updates this worker's copy, which goes to `out`
                view.take(s, r, out[lo:hi])
            elif held is not None and held.numel() == out.numel():  # pull_in_place: the shard's own, no copy
                weights = held
            elif r.tensor.data_ptr() != out[lo:hi].data_ptr() or r.tensor.numel() != hi - lo:  # else written in place
                out[lo:hi].copy_(r.tensor, non_blocking=out.is_cuda)
        reply = self._summarise(replies, [r.fields.get("push", {}) for r in replies])
        reply.weights = weights
        return reply

    def _summarise(self, replies: list[Message], pushes: list[dict]) -> Reply:
        fields = [r.fields for r in replies]
        for s, f in enumerate(fields):
            if "version" in f:
                self.versions[s] = f["version"]
        self._warn_late(pushes)
        self._settle(pushes)
        return Reply(versions=list(self.versions),
                     clock=max((f.get("clock", 0) for f in fields), default=0),
                     staleness=max((p.get("staleness", 0) for p in pushes), default=0),
                     waited=max((f.get("waited", 0.0) for f in fields), default=0.0),
                     gap=max((f.get("gap", 0) for f in fields), default=0), fields=fields)

    def _warn_late(self, pushes: list[dict]) -> None:
        """Say once why a shard keeps dropping our pushes as late (see psrv/server/pushes/late.py)."""
        for s, p in enumerate(pushes):
            late = p.get("late")
            if isinstance(late, dict) and late.get("streak", 0) >= 3 and not self._warned_late:
                self._warned_late = True
                where = "behind" if late.get("clock", 0) < late.get("open", 0) else "not"
                log.warning("worker %d: shard %d dropped %d pushes of worker %d as late: its clock %s is %s the "
                            "shard's clock %s; push with the clock from the last reply", self.worker, s,
                            late["streak"], self.worker, late.get("clock"), where, late.get("open"))

    def _round_trip(self, msgs: list[Message], *, timeout: float | None = None) -> list[Message]:
        """Send msgs[s] to shard s (all at once), then wait for every shard's reply."""
        self._seq += 1
        return RoundTrip(self, msgs, self._seq, self.timeout if timeout is None else timeout).run()

