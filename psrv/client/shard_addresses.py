"""Where a worker finds each shard: the address it talks to now, and the shard's replicas (its primary, then its
backups) as the transport knows them from the start, psrv run's environment hands a restarted worker, WELCOME
names them and a NOT_PRIMARY reply points to them. A failover moves a shard to its next replica; the transport
is redirected there (a request re-sent keeps its seq, so nothing is applied twice)."""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence

REPLICAS = "PSRV_REPLICAS"  # set by psrv run for a worker it restarted: each shard's replicas, {shard: [address]}

log = logging.getLogger("psrv.client.psclient")


class ShardAddresses:
    """`servers`: the shards' addresses in shard order (the list is updated in place as shards move); `net`: the
    transport to them, which knows a fixed RPC world's backups and is redirected on a move."""

    def __init__(self, servers: Sequence[str], net, *, worker: int, environ: Mapping[str, str] = os.environ):
        self.servers = list(servers)
        self.net, self.worker = net, worker
        self.replicas = [[a, *net.replicas(s)] for s, a in enumerate(self.servers)]
        for s, addresses in json.loads(environ.get(REPLICAS, "{}")).items():  # psrv run's restarted worker
            if 0 <= int(s) < len(self.replicas):
                self.replicas[int(s)] = list(dict.fromkeys([*self.replicas[int(s)], *map(str, addresses)]))

    def welcomed(self, shard: int, replicas: list) -> None:
        """WELCOME named `shard`'s backups: where to go if its primary falls silent."""
        self.replicas[shard] = list(dict.fromkeys([self.servers[shard], *map(str, replicas), *self.replicas[shard]]))

    def replicated(self, shard: int) -> bool:
        return len(self.replicas[shard]) > 1

    def failover(self, shard: int, *, why: str = "silent") -> bool:
        """Move `shard` to its next replica (once a probe went unanswered or the connection broke): False where
        it has none. Its backup takes over once the primary falls silent (psrv/server/replication), and holds
        what reaches it before then."""
        replicas = self.replicas[shard]
        if len(replicas) < 2:
            return False
        here = replicas.index(self.servers[shard]) if self.servers[shard] in replicas else -1
        self.servers[shard] = replicas[(here + 1) % len(replicas)]
        log.warning("worker %d: shard %d %s at %s; trying its replica %s", self.worker, shard, why,
                    replicas[here], self.servers[shard])
        self.net.redirect(shard, self.servers[shard])
        return True

    def moved(self, shard: int, addresses: list) -> bool:
        """A replica that does not serve `shard` (a backup, a fenced primary) said `addresses` do (NOT_PRIMARY):
        move to their primary; False if that is where this worker already is."""
        self.heard(shard, addresses)
        if str(addresses[0]) == self.servers[shard]:
            return False
        log.info("worker %d: shard %d's replica %s does not serve it; going to its primary %s", self.worker, shard,
                 self.servers[shard], addresses[0])
        self.servers[shard] = str(addresses[0])
        self.net.redirect(shard, self.servers[shard])
        return True

    def heard(self, shard: int, addresses: list) -> None:
        """A reply named `shard`'s replicas now: its primary, then its backups; two older ones stay, last (a
        failover it has not heard of yet may have gone to one of them)."""
        if addresses and addresses != self.replicas[shard][:len(addresses)]:
            known = list(dict.fromkeys([*map(str, addresses), *self.replicas[shard]]))
            self.replicas[shard] = known[:len(addresses) + 2]
