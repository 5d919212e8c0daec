"""What a job is: a model, a source of training batches per rank, a loss and an evaluation.

Two forms, one interface (`Job.batches_for`, `Job.loss_of`, `Job.evaluate_on`):

- **Tensor jobs** give `train` and `test` as in-memory (inputs, targets) tensors and optionally
  `loss_fn(output, target)` (default cross-entropy). Batches are DistributedSampler shards of
  `train`; evaluation reports `loss`, and `accuracy` where the targets are integer class labels.
- **General jobs** give any of `batches(rank=, world_size=, batch_size=, seed=)` (any iterable of
  batches: a DataLoader over a DistributedSampler, a generator; a batch may be a tensor, a tuple or
  list, or a dict of tensors), `loss(model, batch) -> scalar tensor` and
  `evaluate(model) -> {name: float}` (it must include "loss").

`metric` names the job's primary metric (a key of its evaluation) and `lower_is_better` its
direction: what a spec's target and the report read by default.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from psrv.metric_names import lower_is_better_by_name

if TYPE_CHECKING:
    import torch


@dataclass
class Job:
    name: str
    model: torch.nn.Module
    train: tuple[torch.Tensor, torch.Tensor] | None = None   # inputs, targets (a tensor job)
    test: tuple[torch.Tensor, torch.Tensor] | None = None
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None  # None: cross-entropy
    batches: Callable[..., Iterable[Any]] | None = None      # (rank=, world_size=, batch_size=, seed=)
    loss: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None
    evaluate: Callable[[torch.nn.Module], dict[str, float]] | None = None
    metric: str | None = None          # None: accuracy for a classifier's tensor job, else loss
    lower_is_better: bool | None = None  # None: from the metric (loss, perplexity, bits_per_byte: lower)

    def __post_init__(self) -> None:
        if self.batches is None and self.train is None:
            raise ValueError(f"job {self.name!r}: give train tensors or a batches(rank=, world_size=, "
                             "batch_size=, seed=) function")
        if self.evaluate is None and self.test is None:
            raise ValueError(f"job {self.name!r}: give test tensors or an evaluate(model) function")
        if self.loss is None and self.train is None and self.loss_fn is None:
            raise ValueError(f"job {self.name!r}: a job with its own batches needs loss(model, batch)")
        if self.loss_fn is None:
            import torch
            self.loss_fn = torch.nn.functional.cross_entropy
        if self.metric is None:
            self.metric = "accuracy" if self.evaluate is None and self._classifier() else "loss"
        if self.lower_is_better is None:
            self.lower_is_better = lower_is_better_by_name(self.metric)

    def _classifier(self) -> bool:
        import torch
        return self.test is not None and not torch.is_floating_point(self.test[1])

    def batches_for(self, *, rank: int, world_size: int, batch_size: int, seed: int,
                    device: str | torch.device = "cpu") -> Iterator[Any]:
        """This rank's endless stream of training batches, on `device`.

        A tensor job's batches are DistributedSampler shards of `train` (the whole split moved to the
        device once). A general job's iterable is gone through again when it ends, with the next epoch
        set on its sampler where it has one (DataLoader + DistributedSampler); an empty one is an error."""
        if self.batches is None:
            from psrv.workers.data import batch_indices
            x, y = (t.to(device) for t in self.train)
            for idx in batch_indices(len(x), rank=rank, world_size=world_size, batch_size=batch_size, seed=seed):
                idx = idx.to(device)
                yield x[idx], y[idx]
            return
        source = self.batches(rank=rank, world_size=world_size, batch_size=batch_size, seed=seed)
        epoch = 0
        while True:
            empty = True
            for batch in source:
                empty = False
                yield to_device(batch, device)
            if empty and epoch == 0:
                raise ValueError(f"job {self.name!r}: batches() gave no batch for rank {rank} of {world_size}")
            if empty:
                raise ValueError(f"job {self.name!r}: batches() ran out after one pass; return an iterable "
                                 "that can be gone through again (a DataLoader, a list) or an endless generator")
            epoch += 1
            sampler = getattr(source, "sampler", None)
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)

    def loss_of(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """The training loss of `model` on `batch` (a scalar tensor to call backward on)."""
        if self.loss is not None:
            return self.loss(model, batch)
        x, y = batch
        return self.loss_fn(model(x), y)

    def evaluate_on(self, model: torch.nn.Module, *, device: str | torch.device = "cpu") -> dict[str, float]:
        """The held-out metrics of `model` ({name: float}, "loss" always among them), in eval mode."""
        import torch
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                if self.evaluate is not None:
                    metrics = {k: float(v) for k, v in self.evaluate(model).items()}
                else:
                    x, y = (t.to(device) for t in self.test)
                    out = model(x)
                    metrics = {"loss": float(self.loss_fn(out, y))}
                    if self._classifier():
                        metrics["accuracy"] = float((out.argmax(1) == y).float().mean())
        finally:
            model.train(was_training)
        if "loss" not in metrics:
            raise ValueError(f"job {self.name!r}: evaluate(model) must report 'loss' (it gave {sorted(metrics)})")
        if self.metric not in metrics:
            raise ValueError(f"job {self.name!r}: its metric {self.metric!r} is not among the metrics its "
                             f"evaluation reports ({', '.join(sorted(metrics))})")
        return metrics


def batch_size_of(batch: Any) -> int:
    """How many samples `batch` holds: the first dimension of its first tensor."""
    import torch
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        n = batch_size_of(item)
        if n:
            return n
    return 0


def to_device(batch: Any, device: str | torch.device) -> Any:
    """`batch` with every tensor in it (nested in dicts, lists and tuples) moved to `device`."""
    import torch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [to_device(v, device) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch


def perplexity(loss: float) -> float:
    """exp(loss) of a mean per-token cross-entropy in nats (inf where it overflows)."""
    return math.exp(loss) if loss < 700 else math.inf
