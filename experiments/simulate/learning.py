"""The learning level: the job's real gradients, applied on real psrv Shards in the simulated order.

Each simulated worker holds the weights it last pulled (one row of a N x P tensor); its gradient is
the job's loss on its own next batch (the batches a real worker of that rank would draw) at those
weights, so it is as stale as the simulation says. Shards are psrv's own (psrv/server/shard.py), with
the run's optimizer, schedule and update rule, told each push's context as the shard service tells them.
Rank 0 evaluates what it pulled every eval_every steps, at simulated time; the final evaluation is of
the shards' weights after every push, as a real rank 0's final pull. A run that diverged says why
(`divergence`): a non-finite loss, a final held-out loss above the initial, or a classifier's final
accuracy at chance."""
from __future__ import annotations

import math

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from psrv.experiments.simulate.config import SimulationConfig
from psrv.clip import clip_flat_
from psrv.server.rules import PushContext
from psrv.server.shard import Shard


class Learner:
    def __init__(self, cfg: SimulationConfig, job, plan):
        self.cfg, self.job, self.model = cfg, job, job.model
        self.ranges = plan.ranges
        self.params = list(self.model.parameters())
        initial = parameters_to_vector(self.params).detach().clone()
        self.shards = []
        for s, (lo, hi) in enumerate(self.ranges):
            optim = cfg.server_config(s, bind="tcp://127.0.0.1:0").optimizer  # dn's period resolved there
            shard = Shard(hi - lo, optim)
            shard.init(initial[lo:hi])
            self.shards.append(shard)
        n = cfg.cluster.workers
        self.pulled = initial.repeat(n, 1)          # what each worker last pulled (rank 0's INIT, first)
        self.batches = [None] * n
        self.last_loss = [float("nan")] * n
        self.non_finite: str | None = None          # the first non-finite training loss: whose, at which step
        self.clip = cfg.optimizer.clip_grad_norm if cfg.mode != "sync" else 0.0  # sync: the shard clips the mean
        self.evals: list[dict] = []
        self.final: dict = {}
        self._evaluate(initial, step=0, at=0.0)

    # --- what the cluster asks ------------------------------------------------
    def gradient(self, w: int, step: int) -> torch.Tensor:
        """Worker `w`'s gradient of its step `step`, on the weights it pulled."""
        if self.batches[w] is None:
            cfg = self.cfg
            self.batches[w] = self.job.batches_for(rank=w, world_size=cfg.cluster.workers,
                                                   batch_size=cfg.job.batch_size, seed=cfg.seed)
        vector_to_parameters(self.pulled[w], self.params)
        for p in self.params:
            p.grad = None
        loss = self.job.loss_of(self.model, next(self.batches[w]))
        loss.backward()
        self.last_loss[w] = float(loss.detach())
        if self.non_finite is None and not math.isfinite(self.last_loss[w]):
            self.non_finite = f"worker {w}'s training loss was {self.last_loss[w]} at its step {step}"
        grad = torch.cat([p.grad.reshape(-1) for p in self.params])
        if self.clip:  # async, ssp: the worker clips its own gradient before its push
            clip_flat_(grad, self.clip)
        return grad

    def apply(self, s: int, w: int, clock: int, base: int, staleness: int, grad: torch.Tensor) -> None:
        lo, hi = self.ranges[s]
        self.shards[s].apply(grad[lo:hi], PushContext(w, clock, base, staleness))

    def accumulate(self, s: int, grad: torch.Tensor) -> None:
        lo, hi = self.ranges[s]
        self.shards[s].accumulate(grad[lo:hi])

    def commit(self, s: int) -> None:
        self.shards[s].apply_accumulated()

    def answered(self, s: int, w: int) -> None:
        """Shard `s` answered `w`'s pull with its weights as they are now."""
        lo, hi = self.ranges[s]
        shard = self.shards[s]
        if self.cfg.mode != "sync":  # as the shard service: a sync clock's mean has no one worker's weights
            shard.pulled(w)
        self.pulled[w, lo:hi] = shard.weights

    def step_done(self, w: int, done: int, at: float) -> None:
        every, steps = self.cfg.job.eval_every, self.cfg.job.steps
        if w == 0 and every and done % every == 0 and done < steps:
            self._evaluate(self.pulled[0], step=done, at=at)

    def loss_of(self, w: int, step: int) -> float:
        return self.last_loss[w]

    def finish(self, at: float) -> None:
        """The final evaluation: the shards' weights after every push."""
        weights = torch.cat([shard.weights for shard in self.shards])
        metrics = self._evaluate(weights, step=self.cfg.job.steps, at=at)
        self.final = {"initial_loss": self.evals[0]["eval_loss"], "final_loss": metrics["loss"],
                      "eval_accuracy": metrics.get("accuracy"), "eval_metrics": metrics,
                      "metric": self.job.metric, "lower_is_better": self.job.lower_is_better}
        why = divergence(self.evals, non_finite=self.non_finite, chance=chance_accuracy(self.job))
        self.final.update(diverged=why is not None, diverged_why=why)
        self.final_weights = weights.clone()

    def _evaluate(self, weights: torch.Tensor, *, step: int, at: float) -> dict[str, float]:
        vector_to_parameters(weights, self.params)
        metrics = self.job.evaluate_on(self.model)
        self.evals.append({"wall_time": round(at, 6), "step": step,
                           **{f"eval_{name}": value for name, value in metrics.items()}})
        return metrics


def chance_accuracy(job) -> float | None:
    """A classifier's accuracy by always guessing its commonest held-out class; None for a job that is not
    a tensor classifier (its held-out targets are not integer class labels)."""
    if job.test is None or torch.is_floating_point(job.test[1]):
        return None
    counts = torch.bincount(job.test[1].reshape(-1).long())
    return float(counts.max()) / float(counts.sum())


def divergence(evals: list[dict], *, non_finite: str | None, chance: float | None) -> str | None:
    """Why the run diverged, or None: a non-finite loss (in training or held out), the final held-out loss
    above the initial, or (`chance`: a classifier's) the final accuracy no better than a constant guess."""
    first, last = evals[0], evals[-1]
    if non_finite is not None:
        return f"a non-finite loss: {non_finite}"
    bad = next((e for e in evals if not math.isfinite(e["eval_loss"])), None)
    if bad is not None:
        return f"a non-finite loss: the held-out loss was {bad['eval_loss']} at step {bad['step']}"
    if last["eval_loss"] > first["eval_loss"]:
        return f"the final held-out loss {last['eval_loss']:.4g} is above the initial {first['eval_loss']:.4g}"
    accuracy = last.get("eval_accuracy")
    if chance is not None and accuracy is not None and accuracy <= chance:
        return (f"the final accuracy {accuracy:.3g} is at chance (always guessing the commonest class scores "
                f"{chance:.3g}; {first['eval_accuracy']:.3g} at the start)")
    return None
