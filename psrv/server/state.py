"""What a shard's handlers share (psrv/server/service.py): its settings, clock, transport and history, the
parts its checkpoint holds (the shard, the consistency controller, dedup, liveness, streaming DiLoCo's
fragments, the plan hash), its counters and the workers' step speeds. Everything else belongs to one
handler. Slotted: a handler that reaches for a field not declared here fails at once, so this list is
the whole of what handlers share."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from psrv.config import ServerConfig
from psrv.history import History
from psrv.protocol import ErrorCode, Message, ProtocolError
from psrv.server.consistency import Controller, controller_for
from psrv.server.fragments import FragmentShards
from psrv.server.liveness import Liveness
from psrv.server.dedup import Dedup
from psrv.server.shard import Shard
from psrv.server.speeds import WorkerSpeeds
from psrv.server.counters import ShardStats
from psrv.server.validate import HelloAgain
from psrv.transport.base import ServerTransport


@dataclass(slots=True, eq=False)
class ShardState:
    cfg: ServerConfig
    transport: ServerTransport
    now: Callable[[], float]
    history: History
    stats: ShardStats
    controller: Controller
    liveness: Liveness
    dedup: Dedup
    fragments: FragmentShards
    speeds: WorkerSpeeds        # local_steps 'auto:H': the workers' seconds per inner step
    shard: Shard | None = None  # built at the first HELLO, which brings its size
    plan_hash: str | None = None
    plan_total: int | None = None  # the whole flat vector's elements, as the plan's HELLO says
    resumed_from: int | None = None
    stopped: bool = False
    judged: dict | None = None  # the primary's judgement of time for the request in hand (ShardService.handle)

    @classmethod
    def fresh(cls, cfg: ServerConfig, transport: ServerTransport, *, now: Callable[[], float], history: History,
              metrics, join_timeout: float) -> "ShardState":
        return cls(cfg, transport, now, history, ShardStats(metrics=metrics),
                   controller_for(cfg),
                   Liveness(timeout=cfg.worker_timeout, join_timeout=join_timeout, now=now), Dedup(),
                   FragmentShards(), WorkerSpeeds())

    def ready_shard(self, msg: Message, *, need_init: bool) -> Shard:
        """The shard `msg` may touch: HelloAgain before any HELLO, NOT_ALLOWED before INIT where it needs weights."""
        if self.shard is None:
            raise HelloAgain(f"{msg.type.name} before any HELLO")
        if need_init and not self.shard.initialised:
            raise ProtocolError(ErrorCode.NOT_ALLOWED, f"{msg.type.name} before INIT (rank 0 sends it)")
        return self.shard
