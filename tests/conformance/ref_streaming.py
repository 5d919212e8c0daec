"""The reference run of a streaming DiLoCo case (fragments > 1), written from the paper (Douillard et al. 2025,
arXiv:2501.18512) and never by calling psrv's code: the whole cluster in one process, in the order
tests/conformance/cluster.py fixes.

- Fragments strided by tensor: fragment f holds the model's parameter tensors f, f+F, ...; each has an
  outer optimizer of its own (ref_optim.py's ServerMath over its elements: state, rule and lr schedule by its
  own update count), and the shards' version counts every fragment's update.
- Every H/F inner steps a worker pushes the next fragment in turn: Δ_f = (its weights at f's last sync) -
  (its weights now), quantised per shard piece as the outer dtype says (bfloat16's rounding; int8 / fp4
  absmax per block of 1024 from the piece's start, ref_codecs.py); no error feedback.
- The answer is f's servers' weights when the push's pull is answered (at once in async and ssp; in sync
  once its clock is stepped), and is merged at the worker's next step: local_f <- local_f / 2 + answer / 2,
  and the answer becomes f's base. Its push's staleness is its pushing step's row's, filled in then (or at the
  end, close()'s merge); a step that pushes nothing has 0, and a push never answered (refused) None.
- A refused push (--nonfinite reject) surfaces at that next step: the worker stops there.
- A worker whose weights have NaN or Inf anywhere at a push (an inner step on a NaN gradient) pushes its
  fragment as it is (non-finite where the NaN reached it) and restarts every fragment from its last sync, so
  one NaN costs one push.
- Under a quorum (Decoupled DiLoCo's setting: the synchronizer's quorum is per fragment) each fragment has an
  open merge of its own: a push joins its fragment's, and is answered at once; a fragment's merge closes as the
  plain reference's merge does (Q distinct workers still pushing with a finite push of that fragment in it, or
  every one of them in it; a case's grace window is never over), and the fragment steps once on the mean of its
  pushes. What is still open when the workers finish closes then. A push's staleness is its age when it came
  in; a worker whose push was refused stops counting at its next step.
- Compressed pulls (DoubleSqueeze, Tang et al. 2019; DORE, Liu et al. 2020), per fragment: the answer is the
  worker's copy of f brought to copy_f + C(w_f - r_f), per shard piece of f with the pulls' codec (small
  tensors exactly), where r_f is the shards' mirror of that copy with error feedback and the fragment's
  weights last sent without; every PULL_RESYNC-th pull of a fragment, counted per fragment, is dense.
"""
from __future__ import annotations

from collections import Counter

import torch
from torch.nn.utils import vector_to_parameters

from tests.conformance.ref_codecs import MIN_NUMEL, covered, pulled, received
from tests.conformance.ref_optim import ServerMath
from tests.conformance.reference import CAST, Expected, Reference, _Worker
from tests.conformance.cluster import order


class StreamingReference(Reference):
    def __init__(self, cfg, *, nan: bool):
        super().__init__(cfg, nan=nan)
        w = cfg.worker
        self.fragments, self.outer, self.every = w.fragments, w.outer_dtype, w.local_steps // w.fragments
        bounds, at = [], 0
        for n in self.sizes:
            bounds.append((at, at + n))
            at += n
        self.index = [torch.cat([torch.arange(a, b) for a, b in bounds[f::self.fragments]])
                      for f in range(self.fragments)]
        self.pieces = [[(int(torch.searchsorted(ix, lo)), int(torch.searchsorted(ix, hi))) for lo, hi in self.ranges]
                       for ix in self.index]  # each shard's piece of the fragment vector
        self.maths = [ServerMath(self.o, self.server.w[ix], workers=self.n, mode=self.mode) for ix in self.index]
        for fragment_math, pieces in zip(self.maths, self.pieces):
            fragment_math.slices = pieces
        self.k = 0  # the shards' version: updates of any fragment
        whole = covered(0, at, self.sizes, MIN_NUMEL)
        self.cover = [whole[ix] for ix in self.index]  # the pulls' codec covers these elements of each fragment
        for wk in self.workers:
            wk.flight, wk.pushes, wk.refused_now = None, 0, False
            wk.fragment_since = [0] * self.fragments  # compressed pulls of each fragment since its last dense one

    def weights(self) -> torch.Tensor:
        w = self.server.w.clone()
        for ix, m in zip(self.index, self.maths):
            w[ix] = m.w
        return w

    # --- a worker's half ------------------------------------------------------------------
    def _inner(self, wk: _Worker) -> None:
        wk.gradient()
        with torch.no_grad():
            for p in wk.model.parameters():
                p.add_(p.grad, alpha=-self.inner_lr)

    def _merge(self, wk: _Worker) -> None:
        """The answer of the worker's last push mixed in; its staleness into its pushing step's row."""
        if wk.flight is None:
            return
        f, answer, staleness, base, row = wk.flight
        self.step_staleness[wk.rank][row] = staleness
        wk.flight = None
        ix, local = self.index[f], wk.flat()
        local[ix] = local[ix].mul(0.5).add(answer, alpha=0.5)
        vector_to_parameters(local, wk.model.parameters())
        wk.pulled[ix] = answer
        wk.base = base

    def _delta(self, wk: _Worker) -> tuple[int, torch.Tensor, bool]:
        """(the fragment pushed, what the shards receive, finite)."""
        f = wk.pushes % self.fragments
        wk.pushes += 1
        wk.row = len(self.step_staleness[wk.rank]) - 1  # this step's row: its staleness comes with the answer
        self.step_staleness[wk.rank][wk.row] = None
        ix, local = self.index[f], wk.flat()
        d = wk.pulled[ix] - local[ix]
        if not bool(torch.isfinite(local).all()):  # NaN anywhere: every fragment restarts from its last sync
            vector_to_parameters(wk.pulled.clone(), wk.model.parameters())
        if not bool(torch.isfinite(d).all()):
            return f, d, False
        if self.outer in ("float32", "bfloat16"):
            return f, d.to(CAST[self.outer]).float(), True
        out = d.clone()
        for a, b in self.pieces[f]:
            out[a:b], _ = received(self.outer, d[a:b], torch.ones(b - a, dtype=torch.bool), ratio=0.0, draw=None)
        return f, out, True

    def _answer(self, wk: _Worker, f: int, staleness: int) -> None:
        wk.flight = (f, self._fragment_pull(wk, f), staleness, self.k, wk.row)

    def _fragment_pull(self, wk: _Worker, f: int) -> torch.Tensor:
        """What the answer to wk's pull of fragment f brings: its weights, or the worker's copy of them brought
        up to date by the compressed change (module docstring)."""
        w, cfg, ix = self.maths[f].w, self.cfg.worker, self.index[f]
        if not cfg.compress_pull or cfg.pull_resync and wk.fragment_since[f] + 1 >= cfg.pull_resync:
            wk.ref[ix], wk.fragment_since[f] = w, 0
            return w.clone()
        name, _, ratio = cfg.compress_pull.partition(":")
        copy, ref = wk.pulled[ix].clone(), wk.ref[ix]
        for a, b in self.pieces[f]:
            copy[a:b] = pulled(name, copy[a:b], w[a:b], ref[a:b], self.cover[f][a:b], ratio=float(ratio or 0),
                               ef=cfg.pull_error_feedback)
        wk.ref[ix] = copy if cfg.pull_error_feedback else w
        wk.fragment_since[f] += 1
        return copy

    def _apply_fragment(self, f: int, g: torch.Tensor, *, worker: int | None, staleness: int, pushes: int) -> None:
        self.maths[f].step(g, worker=worker, staleness=staleness)
        self.k += 1
        self.counts["updates_applied"] += 1
        self.counts["pushes_applied"] += pushes
        self.hist[staleness] += pushes

    def _begin_step(self, wk: _Worker) -> bool:
        """The inner step, then the merge; False where the worker stops here (its last push was refused)."""
        self._inner(wk)
        if wk.refused_now:
            wk.alive = False
            return False
        self._merge(wk)
        self.step_staleness[wk.rank].append(0)
        return True

    # --- the run ---------------------------------------------------------------------------
    def run(self) -> Expected:
        sync_free = self.mode == "sync" and not self.cfg.backup_workers and not self.cfg.quorum
        # a quorum's open merges, per fragment: (worker, fragment, sent, age) each, and who pushed to it
        self.merges: dict[int, list] = {}
        self.arrivals: dict[int, set[int]] = {}
        for step in range(self.steps):
            live = [wk for wk in self.workers if wk.alive]
            if sync_free:
                self._sync_clock(live, step)
            else:
                by_rank = {w.rank: w for w in live}
                self.closed, self.waiting = False, []
                for rank in order(step, [w.rank for w in self.workers]):
                    if rank in by_rank and by_rank[rank].alive:
                        (self._quorum_turn if self.cfg.quorum else self._turn)(by_rank[rank], step)
        for f in list(self.merges):  # what the last merges hold commits as the workers finish
            self._close_fragment(f)
        for wk in self.workers:  # close(): the answer in flight
            if wk.alive and not wk.refused_now:
                self._merge(wk)
        lr_scales = sum((m.lr_scales for m in self.maths), start=type(self.maths[0].lr_scales)())
        return Expected(self.weights(), {**self.counts, "dropped": dict(self.counts["dropped"])}, self.hist,
                        self.step_staleness, self.refused, dict(lr_scales))

    def _pushes_now(self, step: int) -> bool:
        return (step + 1) % self.every == 0

    def _settle_push(self, wk: _Worker, finite: bool) -> str:
        fate = self._settle(wk, finite)
        if fate == "refused":  # the worker learns it at its next step
            wk.alive, wk.refused_now = True, True
        return fate

    def _sync_clock(self, live: list[_Worker], step: int) -> None:
        pushed = []
        for wk in live:
            if not self._begin_step(wk):
                continue
            if not self._pushes_now(step):
                continue
            f, sent, finite = self._delta(wk)
            if self._settle_push(wk, finite) != "refused":
                pushed.append((wk, f, sent, finite))
        good = [sent for _, _, sent, finite in pushed if finite]
        if good:
            self._apply_fragment(pushed[0][1], sum(good) / len(good), worker=None, staleness=0, pushes=len(good))
        for wk, f, _, _ in pushed:
            self._answer(wk, f, 0)

    def _turn(self, wk: _Worker, step: int) -> None:
        """One worker's whole step, alone (async, ssp; sync with backup workers, where the first finite push
        closes its clock, later ones are late, and a skipped NaN's answer waits for the push that closes it)."""
        if not self._begin_step(wk) or not self._pushes_now(step):
            return
        f, sent, finite = self._delta(wk)
        if self.mode == "sync" and self.closed and (finite or self.cfg.server.nonfinite == "skip"):
            self.counts["pushes"] += 1
            self.counts["dropped"]["late"] += 1
            self._answer(wk, f, 0)
            return
        fate = self._settle_push(wk, finite)
        if fate == "refused":
            return
        if self.mode == "sync":
            if fate == "dropped":  # its answer waits for the clock
                self.waiting.append((wk, f))
                return
            self._apply_fragment(f, sent, worker=None, staleness=0, pushes=1)
            self.closed = True
            for waiting, wf in [*self.waiting, (wk, f)]:
                self._answer(waiting, wf, 0)
            self.waiting = []
            return
        staleness = self.k - wk.base if fate == "ok" else 0
        if fate == "ok":
            self._apply_fragment(f, sent, worker=wk.rank, staleness=staleness, pushes=1)
        self._answer(wk, f, staleness)

    def _quorum_turn(self, wk: _Worker, step: int) -> None:
        """One worker's whole step under a quorum: its fragment push joins the open merge, which may close;
        its pull is answered at once."""
        if not self._begin_step(wk):  # its last push was refused: the merges no longer wait for it
            for f in list(self.merges):
                self._fragment_if_ready(f)
            return
        if not self._pushes_now(step):
            return
        f, sent, finite = self._delta(wk)
        fate = self._settle_push(wk, finite)
        if fate == "refused":
            return
        age = self.k - wk.base if fate == "ok" else 0
        self.arrivals.setdefault(f, set()).add(wk.rank)
        merge = self.merges.setdefault(f, [])
        if fate == "ok":
            merge.append((wk, f, sent, age))
        self._fragment_if_ready(f)
        self._answer(wk, f, age)

    def _fragment_if_ready(self, f: int) -> None:
        pushing = {w.rank for w in self.workers if w.alive}
        with_gradient = {w.rank for w, *_ in self.merges.get(f, [])}
        need = max(1, min(self.cfg.quorum, len(pushing)))
        met = len(with_gradient & pushing) >= need and not self.cfg.quorum_grace  # a case's window is never over
        if with_gradient and (met or pushing <= self.arrivals.get(f, set())):
            self._close_fragment(f)

    def _close_fragment(self, f: int) -> None:
        """Fragment f's open merge: one step on the mean of its pushes, each counted at its own age."""
        merge = self.merges.pop(f, [])
        self.arrivals.pop(f, None)
        if not merge:
            return
        self._apply_fragment(f, sum(sent for _, _, sent, _ in merge) / len(merge), worker=None, staleness=0,
                             pushes=len(merge))
        self.hist[0] -= len(merge)
        self.hist += Counter(age for *_, age in merge)


def reference_of(cfg, *, nan: bool) -> Reference:
    """The reference a case's config calls for: streaming DiLoCo's with fragments, else the plain one."""
    return StreamingReference(cfg, nan=nan) if cfg.worker.fragments > 1 else Reference(cfg, nan=nan)
