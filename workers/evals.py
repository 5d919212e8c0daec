"""Rank 0's held-out evaluations, the same in the PS loop and the DDP baseline.

Each evaluation is a row of the record's `evals`: wall_time, step and `eval_<name>` for every metric
the job reports (eval_loss always, eval_accuracy for a classifier). At the end the record gains
`final_loss`, `eval_metrics` (the last evaluation's metrics by name), `eval_accuracy` where there is
one, and the job's primary `metric` with `lower_is_better`."""
from __future__ import annotations

import logging

import torch

_log = logging.getLogger("psrv.worker")


def record_eval(job, model, device, log, *, step: int) -> dict[str, float]:
    """Evaluate `model` on the job's held-out data into the step log `log` (psrv/client/steplog.py)."""
    metrics = job.evaluate_on(model, device=device)
    log.evaluated(step, metrics)
    _log.info("eval at step %d: %s", step, "  ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    return metrics


def record_initial(job, model, device, log, *, initial: torch.Tensor | None) -> None:
    """The step-0 evaluation: of `model` as it is (a worker there from the start holds the initial weights), or
    where rank 0 joined a run under way, of `initial`, the flat initial weights, which the parameters view for it
    (and then their own tensors again: psrv.Worker's views of its flat buffer, or under pull_in_place of the
    shard's read-only weights, which are never written)."""
    if initial is None:
        record_eval(job, model, device, log, step=0)
        return
    params = list(model.parameters())
    held = [p.data for p in params]
    offset = 0
    for p in params:
        p.data = initial[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    try:
        record_eval(job, model, device, log, step=0)
    finally:
        for p, data in zip(params, held):
            p.data = data


def record_final(job, model, device, log, *, step: int) -> None:
    """The last evaluation, and what the summary reads from it."""
    metrics = record_eval(job, model, device, log, step=step)
    log.describe(final_loss=metrics["loss"], eval_metrics=metrics, metric=job.metric,
                 lower_is_better=job.lower_is_better, **({"eval_accuracy": metrics["accuracy"]}
                                                        if "accuracy" in metrics else {}))
