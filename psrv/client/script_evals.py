"""A script's held-out evaluations: `psrv.Worker.log_eval(metrics)` and the `evaluate=` callable.

Each evaluation becomes a row of the worker record's `evals` (wall_time, step, eval_<name>), which the
launcher writes to evals.csv and the summary, a spec's [target] and the report read, as they read a
shipped job's. Rank 0's are the run's. The step is the number of steps done when it was taken: 0 before
the first step, N after close() of a run of N steps.

With `evaluate=fn` (fn() -> {name: number}), rank 0 calls it itself: once the first weights are pulled
(step 0), every `eval_every` steps (0: never between), and in close() on the final weights; its time is
off the clock (train_seconds leaves it out, and in sync, where every worker waits for it, samples/s too).
A number given to log_eval was computed in the caller's time, which psrv cannot see: it counts as
training time, as any other work in the loop does.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch

from psrv.metric_names import lower_is_better_by_name, primary_metric
from psrv.client.steplog import StepLog


def checked_metrics(metrics) -> dict[str, float]:
    """{name: float} from a mapping of names to numbers or one-element tensors; ValueError otherwise."""
    if not isinstance(metrics, Mapping) or not metrics:
        raise ValueError(f"log_eval takes a non-empty dict of metrics, e.g. {{'loss': 0.31, 'accuracy': 0.9}}; "
                         f"got {metrics!r}")
    out = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"log_eval: a metric's name must be an identifier like 'accuracy'; got {name!r}")
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.detach().item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"log_eval: metric {name!r} must be a number or a one-element tensor; got {value!r}")
        out[name] = float(value)
    return out


class Evaluations:
    """One worker's evaluations into its step log (None: a worker that keeps no log records nothing)."""

    def __init__(self, log: StepLog | None, *, rank: int, evaluate: Callable[[], Mapping] | None = None,
                 eval_every: int = 0):
        if evaluate is not None and not callable(evaluate):
            raise ValueError(f"evaluate= takes a function of no arguments returning a dict of metrics; got {evaluate!r}")
        if isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 0:
            raise ValueError(f"eval_every must be an int >= 0 (0: only before the first step and at close); "
                             f"got {eval_every!r}")
        if eval_every and evaluate is None:
            raise ValueError("eval_every needs evaluate= (the function psrv.Worker calls every eval_every steps)")
        self.log, self.rank, self.evaluate, self.every = log, rank, evaluate, eval_every
        self.last: dict[str, float] | None = None

    def record(self, step: int, metrics) -> dict[str, float]:
        """Log one evaluation taken after `step` steps."""
        metrics = checked_metrics(metrics)
        self.last = metrics
        if self.log is not None:
            self.log.evaluated(step, metrics)
        return metrics

    def run(self, step: int, *, between_steps: bool = True) -> None:
        """Rank 0 calls evaluate= (when given) and logs what it returns; its time is off the clock."""
        if self.evaluate is None or self.rank != 0:
            return
        started = time.perf_counter()
        self.record(step, self.evaluate())
        if self.log is not None and between_steps:
            self.log.off_clock(time.perf_counter() - started)

    def due(self, steps_done: int) -> bool:
        return bool(self.every) and steps_done % self.every == 0

    def concluded(self) -> dict:
        """The record's keys that the last evaluation gives (what the summary reads): final_loss,
        eval_metrics, eval_accuracy, metric and lower_is_better; none where nothing was evaluated."""
        if self.last is None:
            return {}
        metric = primary_metric(self.last)
        loss = self.last.get("loss")  # None where the script reported none
        return {"final_loss": loss,
                "eval_metrics": dict(self.last), "metric": metric, "lower_is_better": lower_is_better_by_name(metric),
                **({"eval_accuracy": self.last["accuracy"]} if "accuracy" in self.last else {})}
