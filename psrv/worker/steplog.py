"""A psrv.Worker's step log, kept only when the environment asks for it (`psrv run --script` does):

    PSRV_RECORD          write this worker's record (JSON) here at close(), in `psrv worker --out`'s format
    PSRV_PARAMS_OUT      rank 0: save the final flat parameter vector here (torch.save) at close()
    PSRV_PROGRESS        keep the number of finished steps in this file
    PSRV_METRICS_PORT    serve this worker's /metrics on this port (0: a free one, written beside
                         PSRV_RECORD as .metrics); PSRV_MODE labels them, PSRV_METRICS_LINGER keeps
                         them up that many seconds after close()

A row holds what step() measured (`pushed`: whether the step pushed; with local steps only every H-th
does, and staleness is a push's): compute_seconds is the time since the previous step() returned (the
first: since the constructor's first pull), communication and wait the time inside step(). The loss
and batch size are the ones the loop passed to step(), None where it passed none: the log never
makes one up. A worker that stops on an error or Ctrl-C writes what it did, `interrupted` True.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from psrv.rss import peak_rss_bytes
from psrv.atomic import write_json

log = logging.getLogger("psrv.worker")
_EVERY = 10  # steps between progress-file writes


def check_step_args(loss, batch_size) -> None:
    """ValueError unless `loss` is None, a number or a one-element tensor and `batch_size` None or an int >= 0."""
    if loss is not None and not (isinstance(loss, torch.Tensor) and loss.numel() == 1 or
                                 isinstance(loss, (int, float)) and not isinstance(loss, bool)):
        shown = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else repr(loss)
        raise ValueError(f"step(loss=...) takes a number or a one-element tensor; got {shown}")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0):
        raise ValueError(f"step(batch_size=...) takes an int >= 0; got {batch_size!r}")


class StepLog:
    """The rows and the record of one psrv.Worker; `from_env` makes one where PSRV_RECORD is set."""

    def __init__(self, path: Path, *, rank: int, world_size: int, params: torch.Tensor, plan_hash: str,
                 wire_dtype: str, overlap: bool):
        self.path = path
        self.rank = rank
        self.params_out = _path("PSRV_PARAMS_OUT")
        self.progress = _path("PSRV_PROGRESS")
        self.started = self._last_wall = time.time()
        self._last = time.perf_counter()
        self.rows: list[dict] = []
        self.record = {"rank": rank, "world_size": world_size, "job": None, "parameters": params.numel(),
                       "device": str(params.device), "plan_hash": plan_hash, "wire_dtype": wire_dtype,
                       "overlap": overlap, "evals": []}
        self.metrics, self.linger = None, float(os.environ.get("PSRV_METRICS_LINGER") or 0)
        port = os.environ.get("PSRV_METRICS_PORT", "").strip()
        if port:
            from psrv.metrics import WorkerMetrics, start_metrics
            self.metrics = start_metrics(WorkerMetrics, int(port), path.with_suffix(".metrics"),
                                         worker=rank, mode=os.environ.get("PSRV_MODE", ""))

    @classmethod
    def from_env(cls, **kw) -> "StepLog | None":
        path = _path("PSRV_RECORD")
        return cls(path, **kw) if path is not None else None

    def step(self, info, *, loss, batch_size: int | None, started: float) -> None:
        """Log the step `info` (step() began at perf_counter `started`)."""
        inside = info.seconds
        if isinstance(loss, torch.Tensor):
            loss = loss.detach().item()
        row = {"wall_time": time.time(), "worker": self.rank, "step": info.step,
               "loss": None if loss is None else float(loss),
               "staleness": info.staleness, "compute_seconds": max(0.0, started - self._last),
               "communication_seconds": max(0.0, inside - info.waited), "wait_seconds": min(info.waited, inside),
               "batch_size": batch_size, "pushed": info.pushed}  # False: a local step that sent nothing
        self.rows.append(row)
        if self.metrics is not None:
            self.metrics.observe_step(row)
        if self.progress is not None and len(self.rows) % _EVERY == 0:
            self.progress.write_text(str(len(self.rows)))
        self._last_wall, self._last = row["wall_time"], time.perf_counter()

    def write(self, *, params: torch.Tensor | None = None, early_sends: int = 0, interrupted: bool = False,
              local_steps: int | str | None = None, pseudo_grad_norms: list[float] | None = None,
              inner_steps_per_push: list[int] | None = None, wire: dict | None = None) -> None:
        """Write the record (and rank 0's final parameters, `params`, unless `interrupted`). With
        `local_steps`, a push is a round of them: `pushes` counts `pseudo_grad_norms` (one per push).
        `wire`: the bytes sent and received (psrv.Worker.wire_bytes())."""
        rows = self.rows
        sizes = {r["batch_size"] for r in rows}
        known = bool(rows) and None not in sizes  # samples only when every step said its batch size
        record = {**self.record, "steps": len(rows), "batch_size": next(iter(sizes)) if len(sizes) == 1 else None,
                  "step_log": rows, "pushes": len(rows),
                  "samples": sum(r["batch_size"] for r in rows) if known else None,
                  "train_seconds": self._last_wall - self.started if rows else 0.0, "early_sends": early_sends,
                  "wall_seconds": time.time() - self.started,
                  "max_staleness": max((r["staleness"] for r in rows), default=0),
                  "max_rss_bytes": peak_rss_bytes(), **(wire or {})}
        if local_steps is not None:
            norms = list(pseudo_grad_norms or [])
            record.update(pushes=len(norms), local_steps=local_steps, inner_steps=len(rows), pseudo_grad_norms=norms,
                          inner_steps_per_push=list(inner_steps_per_push or []))
        if interrupted:
            record.update(interrupted=True, steps_done=len(rows))
        if self.progress is not None:
            self.progress.write_text(str(len(rows)))
        if params is not None and self.params_out is not None and not interrupted:
            self.params_out.parent.mkdir(parents=True, exist_ok=True)
            torch.save(params.detach().cpu().clone(), self.params_out)
        write_json(self.path, record)
        if self.metrics is not None and self.linger > 0 and not interrupted:
            time.sleep(self.linger)


def _path(name: str) -> Path | None:
    value = os.environ.get(name, "").strip()
    return Path(value) if value else None
