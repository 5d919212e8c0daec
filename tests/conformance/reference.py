"""The reference run of a case: the whole cluster simulated in one process, in the order
tests/conformance/cluster.py fixes, with the math of ref_codecs.py and ref_optim.py: what rank 0's
final weights must be, what every shard must have counted, and the staleness of every step.

What it models of the protocol: a worker pushes its slice of the flat gradient (or of the pseudo-
gradient w_pulled - w_now every H-th step with local steps) to every shard; a non-finite slice is
never compressed (it goes whole and raw) and is refused (--nonfinite reject: the worker stops) or
dropped (skip); sync averages each clock's finite pushes and steps once, dropping a backup worker's late
push; under a quorum (sync's `quorum` Q) a shard steps once on the mean of the pushes since its last step, of
any clocks, once Q distinct workers still pushing have a gradient there (or every one of them has pushed: with
a grace window, which a case's turns never outlast, only then), and no worker waits; async and ssp step on every push; a push's staleness is the update count when applied minus the
one its worker last pulled.

Compressed pulls (DoubleSqueeze, Tang et al. 2019; DORE, Liu et al. 2020): each worker holds a copy x of
the weights w; a pull brings it to x + C(w - r), per shard range with the push's codecs (ref_codecs.py),
where r is x itself with error feedback (what earlier pulls left out rides along) and the weights the last
pull came from without; sign with EF-SignSGD's l1 scale. With error feedback the copy is w itself, to the
bit, where a value travels exactly (a sparse codec's chosen elements, the small tensors): the shard sends
the weights there, not their change (ref_codecs.pulled). A worker's first pull, every PULL_RESYNC-th and rank 0's final one are dense.

Pulls extrapolated (--pull-extrapolate K, with local steps; weight prediction as in SpecTrain, Chen et al. 2018):
a worker's round starts at w + K (w - w'), w the weights pulled and w' those its previous pull brought (the first:
the initial weights), and its pseudo-gradient is that start less where its inner steps end."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from tests.conformance import job as tiny
from tests.conformance.axes import CODEC_SPEC
from tests.conformance.cluster import order
from tests.conformance.ref_codecs import MIN_NUMEL, covered, pulled, received
from tests.conformance.ref_optim import ServerMath, clipped, settings

CAST = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Expected:
    params: torch.Tensor
    counts: dict            # each shard's: pushes, pushes_applied, updates_applied, dropped
    staleness: Counter      # applied pushes by staleness (each shard's histogram)
    step_staleness: dict[int, list[int]] = field(default_factory=dict)
    refused: set[int] = field(default_factory=set)  # workers that got ERROR NONFINITE
    lr_scales: dict = field(default_factory=dict)   # updates by the lr scale their rule gave


class _Worker:
    def __init__(self, rank: int, cfg, w0: torch.Tensor, nan: bool):
        self.rank = rank
        job = (tiny.tiny_nan if nan else tiny.tiny)(cfg.seed)
        self.job, self.model = job, job.model
        self.batches = job.batches_for(rank=rank, world_size=cfg.cluster.workers, batch_size=cfg.job.batch_size,
                                       seed=cfg.seed)
        self.load(w0)
        self.base = 0                      # the update count of the weights it holds
        self.error: dict[int, torch.Tensor] = {}
        self.momentum = torch.zeros_like(w0)  # onebit_adam's local momentum
        self.velocity = torch.zeros_like(w0)  # momentum correction's
        self.draws: dict[int, torch.Generator] = {}
        self.alive = True
        self.ref = w0.clone()  # compressed pulls: the shards' mirror of its copy (or the weights last sent)
        self.previous = w0.clone()  # --pull-extrapolate: the weights its last pull brought (the first: w0)
        self.since_dense = 0   # compressed pulls since the last dense one

    def settle(self, keep: dict, ranges) -> None:
        """A push was applied: the residual and velocity it left are kept."""
        for s, (error, velocity) in keep.items():
            if error is not None:
                self.error[s] = error
            if velocity is not None:
                lo, hi = ranges[s]
                self.velocity[lo:hi] = velocity

    def load(self, w: torch.Tensor) -> None:
        vector_to_parameters(w.clone(), self.model.parameters())
        self.pulled = w.clone()

    def flat(self) -> torch.Tensor:
        return parameters_to_vector(self.model.parameters()).detach().clone()

    def gradient(self) -> torch.Tensor:
        self.model.zero_grad()
        self.job.loss_of(self.model, next(self.batches)).backward()
        return parameters_to_vector(p.grad for p in self.model.parameters()).detach().clone()


class Reference:
    def __init__(self, cfg, *, nan: bool):
        self.cfg, self.o, w = cfg, settings(cfg.optimizer), cfg.worker
        self.mode, self.n, self.steps = cfg.mode, cfg.cluster.workers, cfg.job.steps
        torch.random.default_generator.manual_seed(cfg.seed)  # as torch.manual_seed on the CPU (job.py `model`)
        w0 = parameters_to_vector((tiny.tiny(cfg.seed)).model.parameters()).detach().clone()
        self.workers = [_Worker(r, cfg, w0, nan) for r in range(self.n)]
        self.server = ServerMath(self.o, w0, workers=self.n, mode=cfg.mode)
        for wk in self.workers:
            self.server.pulled(wk.rank)
        self.sizes = [p.numel() for p in self.workers[0].model.parameters()]
        total, s = w0.numel(), cfg.cluster.servers
        base, extra = divmod(total, s)
        starts = [i * base + min(i, extra) for i in range(s + 1)]
        self.ranges = list(zip(starts, starts[1:]))
        self.server.slices = self.ranges
        self.codec = w.compress if w.compress in CODEC_SPEC.values() and w.compress else ""
        self.ef, self.min_numel, self.wire = w.error_feedback, MIN_NUMEL, w.wire_dtype
        if w.fragments == 1 and w.outer_dtype in ("int8", "fp4"):  # the outer dtype is the codec, over every
            self.codec, self.ef, self.min_numel = w.outer_dtype, False, 0  # element, without error feedback
        elif w.fragments == 1 and w.outer_dtype == "bfloat16":
            self.wire = "bfloat16"
        self.h = w.local_steps
        self.counts = {"pushes": 0, "pushes_applied": 0, "updates_applied": 0, "dropped": Counter()}
        self.hist: Counter = Counter()
        self.step_staleness: dict[int, list[int]] = {r: [] for r in range(self.n)}
        self.refused: set[int] = set()
        self.inner_lr = w.inner_lr if self.h > 1 else None  # stated with local steps only
        self.onebit = self.o.name == "onebit_adam"
        self.velocity = bool(w.momentum_correction and self.ef and self.codec and self.o.name == "sgd"
                             and self.o.momentum)

    # --- a worker's half ------------------------------------------------------------------
    def _compute(self, wk: _Worker, step: int) -> torch.Tensor | None:
        """The worker's step: its gradient (and inner step); the vector it pushes, or None (a local step)."""
        g = wk.gradient()
        if self.h == 1:
            return g
        with torch.no_grad():
            for p in wk.model.parameters():
                p.add_(p.grad, alpha=-self.inner_lr)
        if (step + 1) % self.h:
            return None
        return wk.pulled - wk.flat()

    def _encode(self, wk: _Worker, v: torch.Tensor, clock: int) -> tuple[torch.Tensor, bool, dict]:
        """(what the shards receive, finite, the residuals to keep if applied)."""
        if self.cfg.mode != "sync" and self.o.clip_grad_norm:
            v = clipped(v, self.o.clip_grad_norm)
        if not bool(torch.isfinite(v).all()):  # sent raw; no residual or momentum takes it in
            return v, False, {}
        name = self.codec.partition(":")[0]
        if self.onebit:  # a dense gradient before the freeze, then the momentum, compressed (sign by default)
            wk.momentum.lerp_(v, 1 - self.o.betas[0])
            if clock < self.o.freeze_step:
                return v.clone(), True, {}
            v, name = wk.momentum.clone(), name or "sign"
        if not name:
            return v.to(CAST[self.wire]).float(), True, {}
        ratio = float(self.codec.partition(":")[2] or 0)
        warmup = self.cfg.worker.compress_warmup
        if ratio and clock < warmup and name in ("topk", "randomk"):  # DGC's warm-up training: stage s of four
            ratio = ratio ** ((4 * clock // warmup + 1) / 5)  # sends RATIO^((s+1)/5)
        out, keep = v.clone(), {}
        for s, (lo, hi) in enumerate(self.ranges):
            d, velocity = v[lo:hi], None
            if self.velocity:  # DGC: u <- m u + (g + wd w); push u (Nesterov: g' + m u), masked where sent
                # w: the weights pulled, the servers' (with local steps too, as the servers' own decay would be)
                g = d.add(wk.pulled[lo:hi], alpha=self.o.weight_decay) if self.o.weight_decay else d
                velocity = torch.mul(wk.velocity[lo:hi], self.o.momentum).add_(g)
                d = torch.add(g, velocity, alpha=self.o.momentum) if self.o.nesterov else velocity
            beta = self.cfg.worker.error_feedback_decay  # SparseLoCo's accumulator: x = g + beta e
            x = d + beta * wk.error[s] if self.ef and s in wk.error else d.clone()
            draw = wk.draws.setdefault(s, torch.Generator().manual_seed(_draw_seed(wk.rank, s)))
            sent, chosen = received(name, x, covered(lo, hi, self.sizes, self.min_numel),
                                    ratio=ratio, draw=draw, sign_scale=self._sign_scale())
            out[lo:hi] = sent
            if velocity is not None and chosen is not None and self.cfg.worker.momentum_masking:  # DGC's masking
                velocity = velocity.index_fill(0, chosen, 0.0)
            keep[s] = (x - sent if self.ef else None, velocity)
        return out, True, keep

    def _sign_scale(self) -> str:
        """sign's scale: the setting's, auto being l2, but l1 (EF-SignSGD's) for onebit_adam's momenta."""
        scale = self.cfg.worker.sign_scale
        return scale if scale != "auto" else "l1" if self.onebit else "l2"

    def _pull(self, wk: _Worker) -> torch.Tensor:
        """wk's pull: its copy of the weights, dense or brought up to date by the compressed change; what
        it holds as the shards know it (the copy with error feedback, else the weights)."""
        w, spec, cfg = self.server.w, self.cfg.worker.compress_pull, self.cfg.worker
        if not spec or cfg.pull_resync and wk.since_dense + 1 >= cfg.pull_resync:
            wk.ref, wk.since_dense = w.clone(), 0
            if cfg.pull_extrapolate:  # weight prediction: the round starts at w + K (w - the previous pull's w)
                start, wk.previous = w + cfg.pull_extrapolate * (w - wk.previous), w.clone()
                wk.load(start)
                return w
            wk.load(w)
            return w
        name, _, ratio = spec.partition(":")
        copy = wk.pulled.clone()
        for lo, hi in self.ranges:
            copy[lo:hi] = pulled(name, copy[lo:hi], w[lo:hi], wk.ref[lo:hi], covered(lo, hi, self.sizes, MIN_NUMEL),
                                 ratio=float(ratio or 0), ef=cfg.pull_error_feedback)
        wk.ref = copy.clone() if cfg.pull_error_feedback else w.clone()
        wk.since_dense += 1
        wk.load(copy)
        return copy if cfg.pull_error_feedback else w

    # --- the server's half -----------------------------------------------------------------
    def _settle(self, wk: _Worker, finite: bool) -> str:
        """Count one push of `wk` (to every shard): 'refused', 'dropped' or 'ok'."""
        self.counts["pushes"] += 1
        if finite:
            return "ok"
        self.counts["dropped"]["invalid"] += 1
        if self.cfg.server.nonfinite == "reject":
            self.refused.add(wk.rank)
            wk.alive = False
            return "refused"
        return "dropped"

    def _apply(self, g: torch.Tensor, *, worker: int | None, staleness: int, pushes: int, momentum_push: bool):
        if self.mode == "sync" and self.o.clip_grad_norm:
            g = clipped(g, self.o.clip_grad_norm)
        self.server.step(g, worker=worker, staleness=staleness, momentum_push=momentum_push, velocity=self.velocity)
        self.counts["updates_applied"] += 1
        self.counts["pushes_applied"] += pushes
        self.hist[staleness] += pushes

    def run(self) -> Expected:
        sync_free = self.mode == "sync" and not self.cfg.backup_workers and not self.cfg.quorum
        clock = {wk.rank: 0 for wk in self.workers}
        self.merge, self.merge_arrived = [], set()  # a quorum's open merge: (worker, sent, keep, age), who pushed
        self.held: list[_Worker] = []  # --quorum-wait: the workers whose fresh push is in it, their pulls held
        for step in range(self.steps):
            live = [wk for wk in self.workers if wk.alive]
            if sync_free:
                self._sync_clock(live, step, clock)
            else:
                by_rank = {w.rank: w for w in live}
                self.closed, self.waiting = False, []
                for rank in order(step, [w.rank for w in self.workers]):
                    if rank in by_rank and by_rank[rank].alive:
                        (self._quorum_turn if self.cfg.quorum else self._turn)(by_rank[rank], step, clock)
        if self.merge:  # what the last merge holds commits as the workers finish (none is left to push)
            self._close_merge()
        return Expected(self.server.w, {**self.counts, "dropped": dict(self.counts["dropped"])}, self.hist,
                        self.step_staleness, self.refused, dict(self.server.lr_scales))

    def _sync_clock(self, live: list[_Worker], step: int, clock: dict) -> None:
        pushes = []
        for wk in live:
            v = self._compute(wk, step)
            if v is None:
                self.step_staleness[wk.rank].append(0)
                continue
            sent, finite, keep = self._encode(wk, v, clock[wk.rank])
            fate = self._settle(wk, finite)
            if fate == "refused":
                continue
            self.step_staleness[wk.rank].append(0)
            pushes.append((wk, sent, finite, keep))
        if not pushes:
            return
        good = [(wk, sent, keep) for wk, sent, finite, keep in pushes if finite]
        if good:
            mean = sum(sent for _, sent, _ in good) / len(good)
            self._apply(mean, worker=None, staleness=0, pushes=len(good),
                        momentum_push=self.onebit and clock[pushes[0][0].rank] >= self.o.freeze_step)
            for wk, _, keep in good:
                wk.settle(keep, self.ranges)
        for wk, *_ in pushes:
            clock[wk.rank] += 1
            self._pull(wk)
            wk.base = self.server.k

    def _turn(self, wk: _Worker, step: int, clock: dict) -> None:
        """One whole step of one worker, alone: push, apply (or drop), pull. Under sync (with backup
        workers: N - 1 of 2 close a clock) the first finite push closes its clock and the later ones are
        late; a skipped NaN push closes nothing, and its worker's pull waits for the push that does."""
        v = self._compute(wk, step)
        if v is None:
            self.step_staleness[wk.rank].append(0)
            return
        sent, finite, keep = self._encode(wk, v, clock[wk.rank])
        staleness, waits = 0, False
        if self.mode == "sync" and self.closed and (finite or self.cfg.server.nonfinite == "skip"):
            self.counts["pushes"] += 1  # its clock was closed by an earlier push: late
            self.counts["dropped"]["late"] += 1
            fate = "late"
        else:
            fate = self._settle(wk, finite)
        if fate == "refused":
            return
        if self.mode == "sync":
            if fate == "ok":
                self._apply(sent, worker=None, staleness=0, pushes=1, momentum_push=False)
                wk.settle(keep, self.ranges)
                self.closed = True
            waits = fate == "dropped"  # a skipped NaN: its pull waits for the clock
        elif fate == "ok":
            staleness = self.server.k - wk.base
            self._apply(sent, worker=wk.rank, staleness=staleness, pushes=1, momentum_push=False)
            wk.settle(keep, self.ranges)
        self.step_staleness[wk.rank].append(staleness)
        clock[wk.rank] += 1
        if waits:
            self.waiting.append(wk)
            return
        for pulling in [*([] if self.mode != "sync" or not self.closed else self.waiting), wk]:
            held = self._pull(pulling)
            pulling.base = self.server.k
            self.server.pulled(pulling.rank, held)
        if self.closed:
            self.waiting = []


    def _quorum_turn(self, wk: _Worker, step: int, clock: dict) -> None:
        """One whole step of one worker under a quorum: its push joins the open merge (its age: the updates
        since its weights), which steps once Q distinct workers still pushing have a gradient in it (every one
        of them pushed, where fewer are left); its pull is answered at once. With --quorum-wait only fresh pushes
        (age 0) count towards Q, and a fresh one's pull is answered when its merge steps."""
        v = self._compute(wk, step)
        if v is None:
            self.step_staleness[wk.rank].append(0)
            return
        sent, finite, keep = self._encode(wk, v, clock[wk.rank])
        fate = self._settle(wk, finite)
        if fate == "refused":  # it leaves: the open merge no longer waits for it
            self._merge_if_ready()
            return
        age = self.server.k - wk.base
        self.merge_arrived.add(wk.rank)
        if fate == "ok":
            self.merge.append((wk, sent, keep, age))
        self.step_staleness[wk.rank].append(age if fate == "ok" else 0)
        clock[wk.rank] += 1
        if self.cfg.quorum_wait and fate == "ok" and age == 0:
            self.held.append(wk)
            self._merge_if_ready()
            return
        if self.cfg.quorum_wait and fate == "ok":  # answered at once: the worker keeps its residual now, before
            wk.settle(keep, self.ranges)             # its next push, which may come before this merge closes
            self.merge[-1] = (wk, sent, {}, age)
        self._merge_if_ready()
        held = self._pull(wk)
        wk.base = self.server.k
        self.server.pulled(wk.rank, held)

    def _merge_if_ready(self) -> None:
        pushing = {w.rank for w in self.workers if w.alive}
        with_gradient = {w.rank for w, *_ in self.merge}
        counted = {w.rank for w in self.held} if self.cfg.quorum_wait else with_gradient
        need = max(1, min(self.cfg.quorum, len(pushing)))
        met = len(counted & pushing) >= need and not self.cfg.quorum_grace  # a case's window is never over
        if with_gradient and (met or pushing <= self.merge_arrived):
            self._close_merge()

    def _close_merge(self) -> None:
        """The open merge's step: the mean of its pushes (each worker's as many as it made), each counted at
        its own age."""
        mean = sum(sent for _, sent, _, _ in self.merge) / len(self.merge)
        self._apply(mean, worker=None, staleness=0, pushes=len(self.merge), momentum_push=False)
        self.hist[0] -= len(self.merge)
        self.hist += Counter(age for *_, age in self.merge)
        for wk, _, keep, _ in self.merge:
            wk.settle(keep, self.ranges)
        self.merge, self.merge_arrived = [], set()
        for wk in self.held:  # their pulls, held for this merge
            held = self._pull(wk)
            wk.base = self.server.k
            self.server.pulled(wk.rank, held)
        self.held = []


def _draw_seed(rank: int, shard: int) -> int:
    """random-k's generator: one per worker and shard (psrv/codecs/randomk.py)."""
    return rank * 1_000_003 + shard
