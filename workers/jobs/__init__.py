"""Job registry: a job is a model, a train split, a held-out test split and a loss.

`load_job("digits_mlp", seed=0)` for a shipped job, or `load_job("pkg.mod:factory", seed=0)`
for any factory `factory(seed: int) -> Job`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass
class Job:
    name: str
    model: torch.nn.Module
    train: tuple[torch.Tensor, torch.Tensor]   # inputs, integer labels
    test: tuple[torch.Tensor, torch.Tensor]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(
        default=torch.nn.functional.cross_entropy)


def _registry() -> dict[str, str]:
    return {"digits_mlp": "workers.jobs.digits:digits_mlp",
            "mnist1d_mlp": "workers.jobs.mnist1d:mnist1d_mlp",
            "synthetic_mlp": "workers.jobs.synthetic:synthetic_mlp"}


JOB_NAMES = tuple(_registry())


def load_job(spec: str, *, seed: int) -> Job:
    """Build the job `spec` names (a shipped name or 'package.module:factory')."""
    target = _registry().get(spec, spec)
    if ":" not in target:
        raise ValueError(f"unknown job {spec!r}; use one of {', '.join(JOB_NAMES)} or 'package.module:factory'")
    module_name, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load job factory {target!r}: {exc}") from None
    torch.manual_seed(seed)
    job = factory(seed)
    if not isinstance(job, Job):
        raise ValueError(f"job factory {target!r} returned {type(job).__name__}, not workers.jobs.Job")
    return job


@torch.no_grad()
def evaluate(job: Job, model: torch.nn.Module, *, device: str | torch.device = "cpu") -> tuple[float, float]:
    """Held-out (loss, accuracy) of `model`."""
    x, y = (t.to(device) for t in job.test)
    model.eval()
    logits = model(x)
    model.train()
    return float(job.loss_fn(logits, y)), float((logits.argmax(1) == y).float().mean())
