"""Shards and workers in one thread, for tests that must decide the order pushes arrive in: each
shard is a real ShardService, each worker a real PSClient, and a client's message is handled by its
shard the moment it is sent (replies are queued for the client). No sockets, no threads: a test
sends each worker's shard messages (PushPull.ready) in the order it wants, then collects the replies
(PushPull.finish), which must be answerable by then (nothing else runs while a client waits)."""
from __future__ import annotations

import collections
import time

from psrv.client.psclient import PSClient
from psrv.config import ServerConfig
from psrv.partition import PartitionPlan
from psrv.server.service import ShardService
from psrv.transport.base import ClientTransport, ServerTransport


def _copy(frames) -> list[bytes]:
    return [bytes(memoryview(f)) for f in frames]


class _ShardNet(ServerTransport):
    def __init__(self, cluster: "InProcess", shard: int):
        self.cluster, self.shard, self.address = cluster, shard, f"inproc://{shard}"

    def recv(self, timeout):
        return None

    def send(self, peer, frames):  # peer: the worker's rank
        self.cluster.inbox[peer].append((self.shard, _copy(frames)))

    def close(self):
        pass


class _ClientNet(ClientTransport):
    def __init__(self, cluster: "InProcess", worker: int):
        self.cluster, self.worker = cluster, worker

    def send(self, shard, frames):
        self.cluster.services[shard].handle(self.worker, _copy(frames))

    def recv(self, timeout):
        box = self.cluster.inbox[self.worker]
        if not box:
            time.sleep(min(timeout, 0.01))
            return None
        return box.popleft()

    def reconnect(self, shard):
        pass

    def close(self):
        pass


class InProcess:
    """One ShardService per config in `cfgs` (shard order) and PSClients made by `client()`."""

    def __init__(self, cfgs: list[ServerConfig]):
        self.inbox: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self.services = [ShardService(cfg, _ShardNet(self, s)) for s, cfg in enumerate(cfgs)]

    def client(self, worker: int, plan: PartitionPlan, **kw) -> PSClient:
        return PSClient([f"inproc://{s}" for s in range(len(self.services))], plan, worker=worker,
                        world_size=self.services[0].cfg.workers, heartbeat=False, timeout=10.0,
                        net=_ClientNet(self, worker), **kw)

    def summaries(self) -> list[dict]:
        return [s.summary() for s in self.services]
