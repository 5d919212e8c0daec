"""The RPC world of one job: who is who, the rendezvous (with timeouts and clear errors), join, leave.

Server shards are ranks 0..S-1 ("server-<i>"), workers S..S+N-1 ("worker-<r>"), and with R replicas
per shard their backups S+N.. ("backup-<i>-<j>", j = 1..R; psrv/server/follower.py); shard 0 hosts the
rendezvous (a TCPStore) at the --rpc-master address and sets the world's shape there. A torch RPC world
is fixed when it forms, so every member must know its size first: the servers are given R (`psrv serve --rpc-backups`),
and a worker or a backup reads it from the rendezvous before it joins (`place`); a backup claims its j
there too, so `psrv serve --backup-of` needs no number of its own. Used by psrv.transport.torch_rpc only.
"""
from __future__ import annotations

import dataclasses
import logging
import re
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Sequence
from urllib.parse import parse_qsl, urlparse

import torch.distributed as dist
import torch.distributed.rpc as rpc

log = logging.getLogger("psrv.transport.rpc")
SCHEME = "psrv-rpc"  # our rendezvous handler: explicit timeouts and clear errors (see _rendezvous)


@dataclass(frozen=True)
class RpcWorld:
    """Who is who: S servers then N workers around one rendezvous at `master` (host:port)."""

    master: str
    servers: int
    workers: int
    replicas: int | None = 0  # backups per shard; None: not known yet, read at the rendezvous (place)

    def __post_init__(self) -> None:
        host, _, port = self.master.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"RPC master must look like HOST:PORT (e.g. 127.0.0.1:29500); got {self.master!r}")
        if self.servers < 1 or self.workers < 1:
            raise ValueError(f"an RPC world needs >= 1 server and >= 1 worker; got {self.servers}, {self.workers}")
        if self.replicas is not None and self.replicas < 0:
            raise ValueError(f"an RPC world's replicas per shard must be >= 0; got {self.replicas}")

    @property
    def size(self) -> int:
        return self.servers + self.workers + self.servers * (self.replicas or 0)

    @property
    def shape(self) -> str:
        """The shape shard 0 sets at the rendezvous and every member checks: 'S,N,R'."""
        return f"{self.servers},{self.workers},{self.replicas or 0}"

    def name(self, rank: int) -> str:
        if rank < self.servers:
            return f"server-{rank}"
        if rank < self.servers + self.workers:
            return f"worker-{rank - self.servers}"
        shard, j = divmod(rank - self.servers - self.workers, self.replicas or 1)
        return f"backup-{shard}-{j + 1}"

    def backup_rank(self, shard: int, j: int) -> int:
        """The rank of shard `shard`'s j-th backup (j = 1..replicas)."""
        return self.servers + self.workers + shard * (self.replicas or 0) + j - 1

    def address(self, shard: int) -> str:
        return f"rpc://{self.master}/server-{shard}"

    def address_of(self, name: str) -> str:
        """A member's address, as a shard's replicas are told to workers (WELCOME's `replicas`)."""
        return f"rpc://{self.master}/{name}"


_MEMBER = re.compile(r"(server-[0-9]+|backup-[0-9]+-[0-9]+)")


def member_of(address: str) -> str:
    """The member a replica's address names: 'rpc://host:port/backup-0-1' -> 'backup-0-1'."""
    name = urlparse(address).path.strip("/")
    if not address.startswith("rpc://") or not _MEMBER.fullmatch(name):
        raise ValueError(f"an RPC replica's address is rpc://HOST:PORT/server-I or rpc://HOST:PORT/backup-I-J; "
                         f"got {address!r}")
    return name


def parse_master(bind: str) -> str:
    """'rpc://host:port' (or 'host:port') -> 'host:port'."""
    u = urlparse(bind if "://" in bind else f"rpc://{bind}")
    if u.scheme != "rpc" or u.path.strip("/"):
        raise ValueError(f"an RPC server binds to rpc://HOST:PORT (the rendezvous, --rpc-master); got {bind!r}")
    return u.netloc


def parse_addresses(addresses: Sequence[str]) -> str:
    """Check 'rpc://host:port/server-<i>' for i = 0..S-1 around one master; return the master."""
    masters = set()
    for i, a in enumerate(addresses):
        u = urlparse(a)
        if u.scheme != "rpc" or u.path.strip("/") != f"server-{i}":
            raise ValueError(f"RPC server address {i} must be rpc://HOST:PORT/server-{i} "
                             f"(HOST:PORT = the rendezvous, --rpc-master of shard 0); got {a!r}")
        masters.add(u.netloc)
    if len(masters) != 1:
        raise ValueError(f"all RPC server addresses must name one rendezvous; got {sorted(masters)}")
    return masters.pop()


# --- the world: rendezvous, join, leave ---------------------------------------------------
def _fail(store: dist.Store, message: str) -> None:
    """Record a misconfiguration for every member waiting at the rendezvous, and raise it here."""
    store.set("psrv/error", message)
    raise ValueError(message)


def _rendezvous(url: str, **_: Any):
    """A tcp:// rendezvous on shard 0's TCPStore, with a timeout and errors that say what to fix."""
    u = urlparse(url)
    q = dict(parse_qsl(u.query))
    rank, size = int(q["rank"]), int(q["world_size"])
    world = RpcWorld(u.netloc, int(q["servers"]), int(q["workers"]), int(q["replicas"]))
    timeout = float(q["timeout"])
    me = world.name(rank)
    try:
        store = dist.TCPStore(u.hostname, u.port, size, is_master=rank == 0,
                              timeout=timedelta(seconds=timeout), wait_for_workers=False)
    except RuntimeError as exc:  # c10d's DistNetworkError / DistStoreError
        if rank == 0:
            raise RuntimeError(f"{me}: cannot host the RPC rendezvous on {world.master} ({exc}); "
                               "choose a free --rpc-master port") from None
        raise TimeoutError(f"{me}: no RPC rendezvous at {world.master} within {timeout:.0f}s; it is hosted "
                           f"by server shard 0 (psrv serve --shard 0 --transport rpc --rpc-master "
                           f"{world.master}): is it running, and is the address right?") from None
    shape = world.shape
    if rank == 0:
        store.set("psrv/world", shape)
    master_shape = store.get("psrv/world").decode()
    if master_shape != shape:
        s, n, r = master_shape.split(",")
        flags = "--num-shards, --workers, --replicas" if rank < world.servers or rank >= world.servers + \
            world.workers else "the number of --servers, --world-size"
        _fail(store, f"RPC world mismatch: server shard 0 was started for {s} shard(s), {n} worker(s) and {r} "
              f"backup(s) per shard (--num-shards, --workers, --replicas), but {me} for {world.servers}, "
              f"{world.workers} and {world.replicas} ({flags}); start every process of the job with the same numbers")
    if store.add(f"psrv/rank/{rank}", 1) > 1:
        _fail(store, f"two processes joined the RPC world as {me}: every worker needs its own --rank")
    store.add("psrv/joined", 1)
    deadline = time.monotonic() + timeout
    while (joined := store.add("psrv/joined", 0)) < size:
        if store.check(["psrv/error"]):
            raise ValueError(store.get("psrv/error").decode())
        if time.monotonic() > deadline:
            missing = [world.name(r) for r in range(size) if not store.check([f"psrv/rank/{r}"])]
            backups = f" + {world.servers * world.replicas} backups" if world.replicas else ""
            raise TimeoutError(f"{me}: only {joined} of {size} RPC members ({world.servers} servers + "
                               f"{world.workers} workers{backups}) joined at {world.master} within {timeout:.0f}s; "
                               f"missing: {', '.join(missing)}; start them, or check --num-shards, "
                               "--workers and --world-size")
        time.sleep(0.05)
    yield store, rank, size
    raise RuntimeError("psrv's RPC world cannot re-rendezvous; restart the job")


def _shard0_store(world: RpcWorld, me: str, timeout: float) -> tuple[dist.Store, RpcWorld]:
    """A client of shard 0's rendezvous store, once shard 0 has set the world's shape there; and the world
    with that shape's replicas (a worker or a backup reads them before it joins: `place`)."""
    host, _, port = world.master.rpartition(":")
    try:
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout),
                              wait_for_workers=False)
        s, n, r = store.get("psrv/world").decode().split(",")
    except RuntimeError:  # c10d's DistNetworkError / DistStoreError: no store, or no shape within the timeout
        raise TimeoutError(f"{me}: no RPC rendezvous at {world.master} within {timeout:.0f}s; it is hosted by "
                           f"server shard 0 (psrv serve --shard 0 --transport rpc --rpc-master {world.master}): "
                           "is it running, and is the address right?") from None
    if (int(s), int(n)) != (world.servers, world.workers):  # said to every member waiting, as _rendezvous does
        flags = "the number of --servers, --world-size" if me.startswith("worker") else "--num-shards, --workers"
        _fail(store, f"RPC world mismatch: server shard 0 was started for {s} shard(s) and {n} worker(s) "
              f"(--num-shards, --workers), but {me} for {world.servers} and {world.workers} ({flags}); start "
              "every process of the job with the same numbers")
    return store, dataclasses.replace(world, replicas=int(r))


def place_worker(world: RpcWorld, worker: int, *, timeout: float) -> tuple[RpcWorld, int]:
    """(the world with its replicas read from the rendezvous, worker `worker`'s rank)."""
    _, world = _shard0_store(world, f"worker-{worker}", timeout)
    return world, world.servers + worker


def place_backup(world: RpcWorld, shard: int, *, timeout: float) -> tuple[RpcWorld, int]:
    """(the world, the rank of the next free backup of `shard`), claimed at the rendezvous: ValueError once
    the shard has the replicas shard 0 was started for."""
    store, world = _shard0_store(world, f"a backup of shard {shard}", timeout)
    j = store.add(f"psrv/backups/{shard}", 1)
    if j > world.replicas:
        _fail(store, f"shard {shard} has {world.replicas} backup(s) in this RPC world (--replicas of server shard "
              f"0), and one more was started (psrv serve --backup-of); start as many as --replicas says")
    return world, world.backup_rank(shard, j)


# TensorPipe's transports, in the order it prefers them: TCP (libuv) only. Its default prefers "shm" between
# processes of one host, whose reactor thread polls busily: on 2 cores the threads a shard's reply needs (torch's
# own for a clone, RPC's) then wait for a time slice, and a 100 KB PUSH_PULL took 8.2 ms against 1.7 ms over TCP
# (python -m psrv.experiments.bench.rpc_vs_zmq --sizes-mb 0.1; docs/transports.md).
TRANSPORTS = ["uv"]


def join(world: RpcWorld, rank: int, *, init_timeout: float, shutdown_timeout: float) -> None:
    """Join the world as rank `rank`; blocks until every member has joined (or raises after init_timeout)."""
    try:
        dist.register_rendezvous_handler(SCHEME, _rendezvous)
    except RuntimeError:  # registered by an earlier join in this process
        pass
    url = (f"{SCHEME}://{world.master}?servers={world.servers}&workers={world.workers}"
           f"&replicas={world.replicas or 0}&timeout={init_timeout}")
    options = rpc.TensorPipeRpcBackendOptions(init_method=url, rpc_timeout=shutdown_timeout, _transports=TRANSPORTS)
    log.info("%s joining the RPC world of %d at %s", world.name(rank), world.size, world.master)
    with warnings.catch_warnings():  # torch's own use of a gloo group inside init_rpc warns about itself
        warnings.filterwarnings("ignore", message="You are using a Backend")
        rpc.init_rpc(world.name(rank), rank=rank, world_size=world.size, rpc_backend_options=options)


def _ping() -> None:
    """Answered by any live member: shows it is still there."""


def _gone(world: RpcWorld, me: str, *, timeout: float) -> list[str]:
    """Members that no longer answer (crashed, or already left without the barrier)."""
    others = [world.name(r) for r in range(world.size) if world.name(r) != me]
    futs = {name: rpc.rpc_async(name, _ping, timeout=timeout) for name in others}
    gone = []
    for name, fut in futs.items():
        try:
            fut.wait()
        except RuntimeError:
            gone.append(name)
    return gone


def leave(world: RpcWorld, name: str, *, graceful: bool, timeout: float) -> None:
    """Shut RPC down: graceful (a barrier of every member, ~timeout at most per stage) when every
    member still answers, else at once and locally, so a crashed peer costs seconds, not minutes."""
    started = time.monotonic()
    gone = _gone(world, name, timeout=min(5.0, timeout)) if graceful else []
    if gone:
        log.warning("%s: %s no longer answer(s); leaving the RPC world without the barrier", name, ", ".join(gone))
        graceful = False
    try:
        rpc.shutdown(graceful=graceful, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 -- whatever failed, rpc.shutdown has shut this agent down locally
        log.warning("%s: graceful RPC shutdown did not complete (%s); shut down locally",
                    name, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    else:
        log.info("%s left the RPC world (%s shutdown, %.2fs)", name, "graceful" if graceful else "local",
                 time.monotonic() - started)
