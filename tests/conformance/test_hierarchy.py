"""A hierarchy of servers (psrv/server/hierarchy/upstream.py) against its single-process reference
(tests/conformance/ref_hierarchy.py): real shards (psrv.Server) in threads, a global one and a regional one per
region, and one worker per region (PSClient) taking turns, so the order of every update and sync is fixed.
Then the same shards left to run freely, a sync always in flight: nothing a region did is lost or counted
twice."""
from __future__ import annotations

import logging
import threading
import time

import pytest
import torch

from psrv.client.psclient import PSClient
from psrv.config import OptimConfig, ServerConfig
from psrv.server.hierarchy import upstream
from psrv.server.run import Server
from tests.conformance import ref_hierarchy
from tests.conformance.axes import ATOL, RTOL
from tests.conformance.hierarchy_shards import PLAN, SIZE, cluster, merged, region0, wait_for_link


def _problem(regions: int):
    """Region r's worker: the gradient of 0.5 sum a_r (w - c_r)^2, another minimum per region."""
    gen = torch.Generator().manual_seed(7)
    a = [torch.rand(SIZE, generator=gen) + 0.5 for _ in range(regions)]
    c = [torch.randn(SIZE, generator=gen) for _ in range(regions)]
    return lambda r, w: a[r] * (w - c[r]), torch.randn(SIZE, generator=gen)



CASES = [  # regions, turns, every, local optimizer, global lr, global momentum
    (2, [0, 1, 1, 0, 1, 0, 0], 3, OptimConfig(name="sgd", lr=0.1, momentum=0.9), 0.7, 0.5),
    (3, [2, 0, 1, 1, 2, 0], 2, OptimConfig(name="adam", lr=0.05), 1.0, 0.0),
    (1, [0, 0, 0], 4, OptimConfig(name="sgd", lr=0.1, momentum=0.0, nesterov=False), 1.0, 0.0),
]


def _local(cfg: OptimConfig):
    if cfg.name == "adam":  # torch's documented defaults, the config's lr
        return lambda p: torch.optim.Adam([p], lr=cfg.lr)
    return lambda p: torch.optim.SGD([p], lr=cfg.lr, momentum=cfg.momentum)


@pytest.mark.parametrize("regions,turns,every,local,global_lr,global_momentum", CASES,
                         ids=["sgd-momentum-2-regions", "adam-3-regions", "one-region"])
def test_turns_match_the_reference(regions, turns, every, local, global_lr, global_momentum):
    gradient, initial = _problem(regions)
    began = time.perf_counter()
    top, below = cluster(regions, every, local, global_lr=global_lr, global_momentum=global_momentum)
    plan = PLAN
    clients = [PSClient([below[r].address], plan, worker=r, world_size=regions) for r in range(regions)]
    try:
        w = torch.zeros(SIZE)
        for r, c in enumerate(clients):
            c.hello()
            if r == 0:
                c.init(initial)
            c.pull(clock=0, out=w)
            merged(below[r], 0)  # joined: region 0 offered its weights, the others took the global ones
        done = [0] * regions
        for r in turns:
            clients[r].pull(clock=done[r], out=w)
            for _ in range(every):
                clients[r].push_pull(gradient(r, w.clone()), clock=done[r], out=w)
                done[r] += 1
            merged(below[r], done[r] // every)
        for c in clients:
            c.leave()
        finals = [s.join()["upstream"] for s in below]
        top_summary = top.join()
        took = time.perf_counter() - began
    finally:
        for c in clients:
            c.close()
        for s in (*below, top):
            s.close()
    want_global, want_regions = ref_hierarchy.run(initial, gradient, turns, every=every, local=_local(local),
                                                  global_lr=global_lr, global_momentum=global_momentum)
    assert [f["syncs"] for f in finals] == [turns.count(r) for r in range(regions)]  # no last sync: nothing new
    # each sync's staleness at the global shard: the other regions' syncs since this one last heard from it
    version, seen, stale = 0, [0] * regions, []
    for r in turns:
        stale.append(version - seen[r])
        version += 1
        seen[r] = version
    assert top_summary["staleness_histogram"] == {str(k): stale.count(k) for k in sorted(set(stale))}
    # what the regions' links counted is what the global shard received and sent, to the byte
    assert sum(f["bytes_sent"] for f in finals) == top_summary["bytes_in"]
    assert sum(f["bytes_received"] for f in finals) == top_summary["bytes_out"]
    assert all(0 < f["seconds"] < took for f in finals) and top_summary["version"] == len(turns)
    assert not any(s._service.upstream.link.is_alive() for s in below)  # each link's thread ended with its shard
    got = top._service.shard.weights
    assert torch.allclose(got, want_global, atol=ATOL, rtol=RTOL), (got - want_global).abs().max()
    for r in range(regions):
        assert torch.allclose(below[r]._service.shard.weights, want_regions[r], atol=ATOL, rtol=RTOL)
    moved = (want_global - initial).abs().max()
    assert moved > 100 * ATOL  # the turns moved the weights by far more than the tolerance


def test_one_region_at_lr_one_is_the_flat_run():
    """The degenerate hierarchy (one region, the global step adding each change as it is) ends where one shard
    with the same optimizer and pushes ends."""
    gradient, initial = _problem(1)
    local = OptimConfig(name="sgd", lr=0.1, momentum=0.9)
    flat = torch.nn.Parameter(initial.clone())
    opt = _local(local)(flat)
    for _ in range(12):
        flat.grad = gradient(0, flat.detach().clone())
        opt.step()
    want, _ = ref_hierarchy.run(initial, gradient, [0, 0, 0, 0], every=3, local=_local(local), global_lr=1.0,
                                global_momentum=0.0)
    assert torch.allclose(want, flat.detach(), atol=1e-6)  # the reference's own degenerate case
    # and psrv's: test_turns_match_the_reference's one-region case holds psrv to the same reference


class _TickingClock:
    """upstream.time for the links: each thread's perf_counter moves STEP a call, so every round trip (two
    calls) measures STEP seconds, and a link's `seconds` must be STEP times its round trips (`seq`)."""

    STEP = 0.0123457

    def __init__(self):
        self._mine = threading.local()

    def perf_counter(self) -> float:
        self._mine.now = getattr(self._mine, "now", 0.0) + self.STEP
        return self._mine.now


def test_free_running_regions_lose_nothing(monkeypatch):
    """Two regions pushing as fast as they can, syncing every 3 updates, a sync always in flight while pushes
    land: with plain SGD at both tiers and the global lr 1, every update reaches the global weights exactly
    once, so they end at initial - lr * (every gradient pushed)."""
    monkeypatch.setattr(upstream, "time", _TickingClock())
    regions, lr = 2, 0.125  # a power of two: the sums round alike in any order
    top, below = cluster(regions, 3, OptimConfig(name="sgd", lr=lr, momentum=0.0), global_lr=1.0,
                          global_momentum=0.0)
    plan = PLAN
    initial = torch.zeros(SIZE)
    pushes = [40, 57]
    grads = [torch.full((SIZE,), 1.0), torch.full((SIZE,), 2.0)]

    def work(r: int) -> None:
        c = PSClient([below[r].address], plan, worker=r, world_size=regions)
        try:
            c.hello()
            w = torch.zeros(SIZE)
            if r == 0:
                c.init(initial)
            c.pull(clock=0, out=w)
            for k in range(pushes[r]):
                c.push_pull(grads[r], clock=k, out=w)
            c.leave()
        finally:
            c.close()
    threads = [threading.Thread(target=work, args=(r,)) for r in range(regions)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        ups = [s.join()["upstream"] for s in below]
        top.join()
    finally:
        for s in (*below, top):
            s.close()
    want = initial - lr * sum(n * g for n, g in zip(pushes, grads))
    assert torch.equal(top._service.shard.weights, want), (top._service.shard.weights, want)
    # a region's last sync leaves it at the global weights of then: the region that ends last, at the final ones
    assert any(torch.equal(s._service.shard.weights, want) for s in below)
    # a sync leaves once 3 updates have come and none is in flight, so each but the last carries 3 or more
    assert all(1 <= u["syncs"] <= n // 3 + 1 for u, n in zip(ups, pushes))
    for r, (u, s) in enumerate(zip(ups, below)):  # each region's record: its link's own counts, the seconds to 0.1 ms
        link = s._service.upstream.link
        assert u == {"address": top.address, "region": r, "every": 3, "syncs": u["syncs"],
                     "bytes_sent": link.bytes_sent, "bytes_received": link.bytes_received,
                     "seconds": round(link.seconds, 4)}, u
        assert link.bytes_sent > 0 and link.bytes_received > 0
        assert link.seconds == pytest.approx(link.seq * _TickingClock.STEP)  # every round trip's time, summed


def test_a_region_that_joins_before_region_0_offers_the_global_shard_no_weights():
    """Region 1's shard joins its global shard as soon as its worker says HELLO, with no weights of its own: it
    must not offer any (INIT, first writer wins), or the run would start from whatever its empty buffer held.
    Region 0's initial weights, offered later, are the global shard's."""
    top, below = cluster(2, 3, OptimConfig(name="sgd", lr=0.125, momentum=0.0), global_lr=1.0, global_momentum=0.0)
    plan = PLAN
    clients = [PSClient([below[r].address], plan, worker=r, world_size=2) for r in range(2)]
    initial = torch.linspace(-1.0, 1.0, SIZE)
    try:
        clients[1].hello()
        link = wait_for_link(below[1])
        deadline = time.monotonic() + 20.0
        while link.seq < 2:  # its HELLO answered and its next request sent (a PULL, or an INIT it must not send)
            assert time.monotonic() < deadline, "region 1 never joined its global shard"
            time.sleep(0.005)
        time.sleep(0.2)  # an INIT it sent would be applied by now
        clients[0].hello()
        clients[0].init(initial)
        got = [torch.zeros(SIZE), torch.zeros(SIZE)]
        for r in range(2):
            clients[r].pull(clock=0, out=got[r])
        assert torch.equal(top._service.shard.weights, initial), top._service.shard.weights
        assert all(torch.equal(g, initial) for g in got)
        for c in clients:
            c.leave()
        for s in below:
            s.join()
        top.join()
    finally:
        for c in clients:
            c.close()
        for s in (*below, top):
            s.close()



def test_a_regional_shard_that_never_had_weights_records_no_sync():
    """Region 0's only worker leaves before it sends the initial weights: the shard never joins its global
    shard (it has nothing to offer), ends as its worker leaves, and its record says so, every count 0."""
    shard = region0("tcp://127.0.0.1:9")  # discard: nothing there, and nothing is sent
    shard.start()
    c = PSClient([shard.address], PLAN, worker=0, world_size=1)
    try:
        c.hello()
        c.leave()
        summary = shard.join(timeout=30)
    finally:
        c.close()
        shard.close()
    assert summary["upstream"] == {"address": "tcp://127.0.0.1:9", "region": 0, "every": 1, "syncs": 0,
                                   "bytes_sent": 0, "bytes_received": 0, "seconds": 0.0}, summary["upstream"]


@pytest.mark.parametrize("heartbeats", [False, True], ids=["dropped", "kept-by-heartbeats"])
def test_a_region_silent_past_the_global_timeout(caplog, monkeypatch, heartbeats):
    """Region 1 is silent for three of the global shard's worker timeouts between two syncs while region 0 keeps
    syncing. Without its link's heartbeats, the global shard drops region 1 and refuses its next sync; it says HELLO
    again and the sync goes through. With them, it is never dropped. Either way nothing either region did is lost."""
    lr = 0.125
    monkeypatch.setattr(upstream.Link, "heartbeats", heartbeats)
    caplog.set_level(logging.INFO, logger="psrv.server")
    top = Server(ServerConfig(mode="async", workers=2, worker_timeout=0.5, failure_bound=0.2,
                              optimizer=OptimConfig(name="sgd", lr=1.0, momentum=0.0)))
    top.start()
    below = [Server(ServerConfig(mode="async", workers=1, first_rank=r, world_size=2, upstream=top.address,
                                 upstream_every=1, region=r, upstream_world=2,
                                 optimizer=OptimConfig(name="sgd", lr=lr, momentum=0.0))) for r in range(2)]
    for s in below:
        s.start()
    plan = PLAN
    pushes, quiet, done = [0, 0], threading.Event(), threading.Event()

    def work(r: int) -> None:
        c = PSClient([below[r].address], plan, worker=r, world_size=2)
        try:
            c.hello()
            w = torch.zeros(SIZE)
            if r == 0:
                c.init(torch.zeros(SIZE))
            c.pull(clock=0, out=w)
            for k in range(4):
                c.push_pull(torch.ones(SIZE), clock=k, out=w)
                pushes[r] += 1
                if r == 1 and k == 1:
                    merged(below[1], 2)
                    time.sleep(1.5)  # silent: the global shard's worker timeout is 0.5 s
                    quiet.set()
            if r == 1:
                done.set()
            while r == 0 and not done.is_set():  # region 0 keeps the global shard busy until region 1 is done
                c.push_pull(torch.ones(SIZE), clock=pushes[0], out=w)
                pushes[0] += 1
                time.sleep(0.02)
            c.leave()
        finally:
            c.close()
    threads = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        for s in below:
            s.join()
        summary = top.join()
    finally:
        for s in (*below, top):
            s.close()
    assert quiet.is_set()
    dropped = "worker 1 silent for" in caplog.text
    assert dropped == (not heartbeats)
    joined = [f"shard 0: region {r} syncing with {top.address} every 1 updates" for r in range(2)]
    assert all(any(rec.getMessage() == line for rec in caplog.records) for line in joined)
    said = f"region 1: the global shard {top.address} forgot it; HELLO again"
    assert any(r.getMessage() == said for r in caplog.records) == dropped
    assert 0 < summary["version"] <= sum(pushes)  # one global update per sync, which may carry several updates
    assert torch.equal(top._service.shard.weights, torch.full((SIZE,), -lr * sum(pushes)))

