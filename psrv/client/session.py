"""psrv.Worker: a parameter-server worker inside a user's own training loop.

    ps = psrv.Worker(model)          # RANK, WORLD_SIZE and PSRV_SERVERS from the environment
    for x, y in loader:
        loss_fn(model(x), y).backward()
        ps.step()                    # push the gradient, pull the new weights into the model
    ps.close()                       # rank 0 ends with the final weights; every worker leaves

Local SGD / DiLoCo: `psrv.Worker(model, local_steps=H)` with the user's own (inner) optimizer; call
`opt.step()` then `ps.step()` every step, and every H-th `ps.step()` pushes w_pulled - w_now
(`fragments=F`: streaming DiLoCo, one fragment every H/F steps; `outer_dtype`: those pushes quantised).
psrv.Worker never steps that optimizer: a loop without one pushes zeros under local steps.

Under `psrv run --script` or a spec's `[job] script` (PSRV_CONFIG set), every keyword the call leaves out
comes from the run's config (psrv/client/run_settings.py): `psrv run --compress topk:0.01 --local-steps 8
--script train.py` runs `psrv.Worker(model)` with those; a keyword the script passes wins, and the record's
`settings_overridden` says so.

Clocks, versions, the partition plan and the flat buffers stay inside. Its parts, mixins of psrv.Worker: the
local steps' rounds (psrv/client/local_rounds.py) and its compression's state (psrv/client/compression_state.py).
"""
from __future__ import annotations

import inspect
import logging
import math
import time
from typing import Sequence

import torch

from psrv.config.base import defaults_of
from psrv.config.sections import Placement, WorkerSettings
from psrv.client.psclient import PSClient
from psrv.client.compression_state import CompressionState
from psrv.clip import clip_flat_
from psrv.client.flat import FlatModel
from psrv.client.keywords import clip_of, constructor_signature, env, planes, servers_of
from psrv.client.local_rounds import LocalRounds
from psrv.local_period import LocalPeriod, fastest_of
from psrv.client.overlap import ShardReadiness
from psrv.partition import PartitionPlan
from psrv.client.roundtrip import PushPull
from psrv.client.run_settings import TakesRunSettings, keywords_of
from psrv.client.step_info import StepInfo
from psrv.client.step_timer import StepTimer
from psrv.client.recorded import RecordedWorker
from psrv.client.script_evals import Evaluations
from psrv.client.steplog import StepLog, check_step_args
from psrv.client.fragments import Fragments
from psrv.client.settings import client_settings, keyword_names, local_steps_of, overlaid
from psrv.client.streaming import StreamingOuter
from psrv.client.waiting import LIBRARY_OPTION

log = logging.getLogger("psrv.worker")
_PLACE = defaults_of(Placement)  # the placement keywords' defaults


class Worker(LocalRounds, CompressionState, RecordedWorker, metaclass=TakesRunSettings):
    """One worker of a parameter-server cluster, driving `model` (an nn.Module, float32 parameters on one
    device) from the caller's own training loop: `step()` after each backward pushes the gradient and pulls
    the new weights into the model; `close()` (or the `with` block's end) leaves, rank 0 last, holding the
    final weights. The constructor says HELLO to every shard, rank 0 sends the initial weights, and every
    rank pulls them. `servers`, `rank` and `world_size` default to PSRV_SERVERS, RANK and WORLD_SIZE.

    The model's parameters become views of one flat buffer, and their `.grad` views of another: do not
    re-create them. Buffers do not travel; rank 0's are the model's. A worker that raises inside step(),
    close() or the `with` block leaves every shard, so the others go on. psrv.Worker changes nothing in its
    host process.

    Every keyword (overlap, clip_grad_norm, local_steps, fragments, outer_dtype, compress and its knobs,
    compress_pull, shared_memory, bulk, push_chunk_mb, step_log, evaluate and eval_every, ...) is described in
    docs/scripts.md, "psrv.Worker's keywords"; under `psrv run --script` the run's config gives each one the
    call leaves out (psrv/client/run_settings.py). Under `--mode ddp` or `zero1` it is refused:
    psrv.make_worker(model) picks this class or the all-reduce worker by the run's mode (psrv/client/make.py)."""

    def __init__(self, model: torch.nn.Module, servers: Sequence[str] | None = None, *,
                 settings: WorkerSettings | None = None, rank: int | None = None, world_size: int | None = None,
                 transport: str = _PLACE.transport, shared_memory: str = _PLACE.shared_memory, bulk: str = _PLACE.bulk,
                 curve_keys: str = "", clip_grad_norm: float | None = 0.0, step_log: StepLog | None = None,
                 evaluate=None, eval_every: int = 0, timeout_option: str = LIBRARY_OPTION, **overrides):
        settings = overlaid(settings, overrides, who="psrv.Worker")  # each checked once, by the config tree
        local_steps = local_steps_of(settings, overrides)
        fragments, outer_dtype, timeout = settings.fragments, settings.outer_dtype, settings.request_timeout
        if clip_grad_norm is not None and not clip_grad_norm >= 0:
            raise ValueError(f"clip_grad_norm must be >= 0 (0: off); got {clip_grad_norm!r}")
        self.settings = settings
        self.rank = int(rank if rank is not None else env("RANK"))
        self.world_size = int(world_size if world_size is not None else env("WORLD_SIZE"))
        self._evals = Evaluations(None, rank=self.rank, evaluate=evaluate, eval_every=eval_every)  # checked first
        servers = servers_of(servers, wait=timeout, transport=transport)  # an @FILE entry: once that server is up
        self.model = model
        self._flat = FlatModel(model, grads=False)  # the flat gradient is placed below
        self.plan = PartitionPlan.from_module(model, len(servers))
        pieces = Fragments(self.plan, fragments) if fragments > 1 else None  # ValueError: more than the tensors
        self._readiness: ShardReadiness | None = None  # made after HELLO, which says the mode
        # the pulls' own dense threshold: an outer dtype's codec covers the pushes' small tensors only
        self._client = PSClient(servers, self.plan, client_settings(settings, local_steps), worker=self.rank,
                                world_size=self.world_size, transport=transport, curve_keys=curve_keys,
                                pull_min_numel=settings.compress_min_numel, timeout_option=timeout_option,
                                **planes(shared_memory, bulk, curve_keys))
        # Shared memory: pushes read in place. Shared from an untouched buffer, which costs no resident memory
        # (sharing a zeroed one left a freed model-sized buffer resident in the heap; docs/benchmarks.md)
        params = self._flat.params
        self._flat.place_grads(self._client.share(torch.empty_like(params)).zero_())
        self._pushing: PushPull | None = None
        self._open = True
        self.steps = self.start_step = self.start_clock = 0  # set from the shards' clock after the first pull
        self.early_sends = 0  # shard pushes sent while backward was still running
        self.local_steps = local_steps
        self._period = LocalPeriod(local_steps if pieces is None else local_steps // fragments) \
            if local_steps is not None else None
        self.fragments, self.outer_dtype = fragments, outer_dtype
        self._stream: StreamingOuter | None = None  # fragments > 1: streaming DiLoCo
        self._answered_at_close: list[tuple[int, int]] = []  # its fragment push close() merged: (step, staleness)
        self.pseudo_grad_norms: list[float] = []  # one per push with local_steps
        self._pulled: torch.Tensor | None = None  # the weights last pulled (local_steps)
        self._previous_pull: torch.Tensor | None = None  # pull_extrapolate: the weights the last pull brought
        try:
            welcomes = self._client.hello()
            self.mode = welcomes[0].get("mode", "")
            try:
                self.clip_grad_norm = clip_of(clip_grad_norm, welcomes, self.mode)
            except ValueError:
                self._abandon()
                raise
            if self.clip_grad_norm and pieces is not None:
                self._abandon()
                raise ValueError("clip_grad_norm clips by the global norm; fragments push one fragment at a time "
                                 "(fragments=1, or no clip here and on the servers)")
            self._clip_here = bool(self.clip_grad_norm) and self.mode != "sync"  # sync: the servers clip
            if settings.overlap and self.plan.num_shards > 1 and not self._clip_here and local_steps is None:
                self._readiness = ShardReadiness(model, self.plan.ranges)
            if self.rank == 0:
                self._client.init(self._flat.params.cpu())
            first = self._client.first_pull(welcomes, out=self._flat.own)
            self._flat.point(first.weights)  # pull_in_place: the shard's weights, where they lie
            self._clock, self._version = first.clock, min(first.versions)
            # a worker (re)joining a run under way starts at the shards' clock: its steps count from there
            self.start_clock = self._clock
            self.steps = self.start_step = self._clock * (self._period.base if self._period is not None else 1)
            if local_steps is not None:
                self._pulled = self._flat.params.clone()
                if settings.pull_extrapolate:
                    self._previous_pull = self._flat.params.clone()
            if pieces is not None:
                self._stream = StreamingOuter(self._client, self._flat.params, self._pulled, pieces, outer_dtype,
                                              norms=self.pseudo_grad_norms, pushes=self.start_clock)
        except KeyboardInterrupt:
            self._abandon()
            raise
        except BaseException:
            if self._open:
                self._open = False
                self._client.close()
            raise
        self._arm()
        self.settings_overridden: dict = {}  # a run's script: the keywords it gave against config.json (its metaclass)
        self._log = step_log if step_log is not None else StepLog.from_env(rank=self.rank)
        if self._log is not None:
            self._log.describe(**self.described())
        self._evals.log = self._log
        self._evals.run(self.steps)  # the first weights, before any step of this worker
        self._timer = StepTimer()  # a logged step's compute: from here to its step() call

    @classmethod
    def from_settings(cls, model: torch.nn.Module, settings, **keywords) -> "Worker":
        """A Worker whose keywords come from a config section by name: a WorkerSettings, a Placement, a
        GradClip, or a WorkerConfig holding them all with `servers`, `rank`, `world_size` and
        `curve_keys` (`request_timeout` is `timeout`; `local_steps` counts only with an inner optimizer).
        `keywords` override them. The mapping is psrv/client/run_settings.py's `keywords_of`, the one place a
        worker's settings become psrv.Worker's keywords (a script's psrv.Worker(model) under a run uses it too)."""
        given = keywords_of(settings, keyword_names(inspect.signature(Worker.__init__)))
        return cls(model, **{**given, **keywords})

    def step(self, *, loss: float | torch.Tensor | None = None, batch_size: int | None = None) -> StepInfo:
        """Push the gradient backward left in the model (the shards not sent during backward now),
        wait for the new weights, copy them into the model and zero the gradients. `loss` (a number or
        a one-element tensor) and `batch_size`, if given, go into the step log, where one is kept
        (`step_log`, or psrv run --script's; psrv/client/steplog.py); nothing else reads them."""
        t0 = time.perf_counter()
        check_step_args(loss, batch_size)
        self._check_open()
        if self._stream is not None:
            return self._streaming_step(t0, loss, batch_size)
        if self._period is not None and not self._period.stepped(t0):
            return self._local_step(t0, loss, batch_size)
        try:
            if self._readiness is not None:
                self._readiness.disarm()
                if self._readiness.repeated:
                    raise RuntimeError("two backward passes between step() calls with overlap on: the shards "
                                       "sent during the first carried its gradient only; pass overlap=False "
                                       "to accumulate gradients over several backward passes")
            reply = self._finish()
            self._flat.zero_grad()
            self._arm()
        except BaseException:
            self._abandon()
            raise
        info = StepInfo(step=self.steps, clock=self._clock, version=min(reply.versions),
                        staleness=reply.staleness, waited=reply.waited, seconds=time.perf_counter() - t0)
        self.steps += 1
        self._logged(info, loss, batch_size, t0)
        if self._period is not None:
            self._period.returned(time.perf_counter())
        return info

    def close(self) -> None:
        """End this worker: rank 0 first pulls the final weights into the model (answered once every
        other worker has left, so they hold every worker's last push), then every worker leaves."""
        if not self._open:
            return
        try:
            if self._pushing is not None:  # a backward after the last step() already sent some shards
                log.warning("worker %d: a backward after the last step(); pushing its gradient", self.rank)
                self._finish()
            if self._stream is not None:  # the fragment in flight, then the inner steps not pushed yet
                self._settle_stream()
            elif self._period is not None and self._period.pending:  # inner steps not pushed yet
                self._finish()
            if self._readiness is not None:
                self._readiness.disarm()
            if self.rank == 0:
                self._flat.point(self._client.pull(clock=self._clock, out=self._flat.own, final=True).weights)
        except BaseException:
            self._abandon()
            raise
        self._open = False
        self._flat.keep_own()  # pull_in_place: the model keeps the weights, not a view of the shard's memory
        try:
            self._client.leave(timeout=5.0)
        finally:
            self._client.close()
        self._evals.run(self.steps, between_steps=False)  # rank 0's final weights, after LEAVE: no one waits
        self._save()

    def described(self) -> dict:
        """What a worker record says of this worker before it trains (psrv/client/steplog.py RECORD)."""
        return {"rank": self.rank, "world_size": self.world_size, "parameters": self._flat.params.numel(),
                "device": str(self._flat.params.device), "plan_hash": self.plan.hash,
                "param_shapes": [list(p.shape) for p in self.plan.params],
                "wire_dtype": self._client.settings.wire_dtype, "overlap": self.settings.overlap,
                **self.compression()}

    def totals(self) -> dict:
        """What a worker record counts of this worker at its end: early sends, the wire bytes and, with
        local steps, each push's pseudo-gradient norm and inner steps; with fragments, `answered`: the
        staleness of the fragment push close() merged, for its step's row (StepLog.record); and
        `settings_overridden` (a run's script: the keywords it gave against the run's config)."""
        local = {} if self.local_steps is None else {
            "local_steps": self.local_steps, "pseudo_grad_norms": list(self.pseudo_grad_norms),
            "inner_steps_per_push": self.inner_steps_per_push, "fragments": self.fragments,
            "outer_dtype": self.outer_dtype}
        if self._stream is not None:
            local["answered"] = list(self._answered_at_close)
        in_place = {} if not self.settings.pull_in_place else {
            "pulls_in_place": self._client.in_place.read, "pulls_copied": self._client.in_place.copied}
        return {"early_sends": self.early_sends, **self.wire_bytes(), **local, **in_place,
                "settings_overridden": self.settings_overridden}

    # --- mechanics ----------------------------------------------------------
    def _arm(self) -> None:
        if self._readiness is not None:
            self._readiness.arm(self._ready)

    def _begin(self) -> PushPull:
        if self._pushing is None:
            self._pushing = self._client.begin_push_pull(self._flat.grads, clock=self._clock, out=self._flat.own,
                                                         at=self._pulled if self._pulled is not None else
                                                         self._flat.params)  # local steps: the weights pulled
        return self._pushing

    def _ready(self, shard: int) -> None:
        """Shard's slice of the gradient is final (during backward): send it now."""
        self._begin().ready(shard)

    def _logged(self, info: StepInfo, loss, batch_size, started: float) -> None:
        """The step's row in the step log, if one is kept: compute since the previous step() returned."""
        self._timer.computed(started)
        seconds = self._timer.row(waited=info.waited, end=started + info.seconds)
        if self._log is not None:
            self._log.row(step=info.step, loss=loss, **seconds, batch_size=batch_size, staleness=info.staleness,
                          pushed=info.pushed, answered=info.answered)
        if self._evals.due(self.steps):
            self._evals.run(self.steps)
        self._timer.restart()  # an evaluation above is no step's compute

    def _finish(self):
        if self._pulled is not None:  # the pseudo-gradient w_pulled - w_now goes where the gradient would
            torch.sub(self._pulled, self._flat.params, out=self._flat.grads)
            self.pseudo_grad_norms.append(float(self._flat.grads.norm()))
            if not math.isfinite(self.pseudo_grad_norms[-1]):  # the pull below brings back finite weights
                log.warning("worker %d: the push at step %d has NaN or Inf (an inner step on a non-finite gradient); "
                            "the shards' --nonfinite decides, and this worker goes on from the weights it pulls",
                            self.rank, self.steps)
        if self._clip_here:  # no early sends then: the whole gradient is here
            clip_flat_(self._flat.grads, self.clip_grad_norm)
        pushing, self._pushing = self._begin(), None
        if self._period is not None:  # its inner steps (and, auto:H, this worker's speed) ride on its push
            pushing.annotate(self._period.push_fields())
        self.early_sends += pushing.early
        reply = pushing.finish()
        self._flat.point(reply.weights)  # pull_in_place: the shard's weights, where they lie
        self._clock = reply.clock
        self._version = min(reply.versions)
        if self._pulled is not None:
            self._extrapolated()
            self._pulled.copy_(self._flat.params)
        if self._period is not None:
            self._period.pushed(fastest_of(reply.fields))
        return reply

    def _extrapolated(self) -> None:
        """pull_extrapolate K: the round starts from the weights just pulled plus K times their change since the
        previous pull (docs/algorithms.md, "Pulls extrapolated"); the previous pull is kept for the next."""
        if self._previous_pull is None:
            return
        pulled = self._flat.params
        change = torch.sub(pulled, self._previous_pull)
        self._previous_pull.copy_(pulled)
        pulled.add_(change, alpha=self.settings.pull_extrapolate)

    def _check_open(self) -> None:
        if not self._open:
            raise RuntimeError(f"worker {self.rank}: this psrv.Worker has left its shards (close() or an error)")

    def _abandon(self) -> None:
        """Leave every shard at once, bounded (Ctrl-C, an error): no final pull."""
        if not self._open:
            return
        self._open = False
        if self._readiness is not None:
            self._readiness.disarm()
        log.info("worker %d: stopped at step %d; leaving every shard", self.rank, self.steps)
        self._flat.keep_own()
        try:
            self._client.leave(timeout=2.0)  # an interrupted worker exits promptly
        finally:
            self._client.close()
            if getattr(self, "_log", None) is not None:  # what it did, marked interrupted
                self._log.save(self._log.record(interrupted=True, **self.totals()))


# What psrv.Worker(...) takes, for help(), editors and inspect: its constructor's keywords, not the metaclass's
# __call__'s (*args, **keywords), which only fills those a run's config gives.
Worker.__signature__ = constructor_signature(Worker)
