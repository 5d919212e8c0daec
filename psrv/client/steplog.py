"""A worker's step log and record: the one builder of step rows and worker records, and their one writer,
for the shipped PS loop (psrv/workers/loop.py), the all-reduce ranks (psrv/workers/allreduce/loop.py) and
a user's script on psrv.Worker. ROW and RECORD declare what they hold; a key not declared is refused.

The loops are handed a StepLog (`psrv worker` and `python -m psrv.workers.allreduce` build it from their
options). A script's psrv.Worker builds its own from the environment `psrv run --script` sets
(`StepLog.from_env`): PSRV_RECORD, PSRV_PARAMS_OUT (written by rank 0 alone), PSRV_PROGRESS, PSRV_BEACON,
PSRV_METRICS_PORT (0: a free one, written beside PSRV_RECORD as .metrics), PSRV_MODE (the metrics' label)
and PSRV_METRICS_LINGER. `{rank}` in a path is replaced by the worker's rank: one launcher process
(torchrun) gives every rank the same environment, as it gives them the same argv, so the paths are
templates (DIR/worker-{rank}.json) and each rank fills in its own.

A row holds what a step measured. The loss and batch size are the ones the loop knew, None where a
script passed none: the log never makes one up. A worker that stops on Ctrl-C writes what it did,
`interrupted` True, and no weights; one that stops on an error (the shipped PS and all-reduce loops),
`failed` with the error's line, and no weights.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from psrv.atomic import write_json, write_text
from psrv.code_inputs import code_inputs
from psrv.rss import peak_rss_bytes
from psrv.step_beacon import StepBeacon

log = logging.getLogger("psrv.worker")
_EVERY = 10  # steps between progress-file writes

ROW = {  # a step-log row's columns; staleness and pushed only where a step pushes to shards
    "wall_time": "time.time() at the step's end",
    "worker": "the rank",
    "step": "the step's index (an inner step's, with local steps)",
    "loss": "the training loss of the step's batch; None where the loop did not say",
    "staleness": "PS workers: the push's worst staleness (shard version applied - version computed on); 0 where "
                 "the step pushed nothing; a fragment push's (streaming DiLoCo) is filled in when its answer "
                 "is merged, a step later or at close(), and stays None where it never came",
    "compute_seconds": "from the previous step's end to the gradient being ready, evaluations left out: the batch, "
                       "forward and backward (and emulated compute); psrv/client/step_timer.py",
    "communication_seconds": "sending, the update and the pull (all-reduce: the collective and the step)",
    "wait_seconds": "held back for the other workers (sync barrier, SSP bound, the slowest rank)",
    "batch_size": "samples in the step's batch; None where the loop did not say",
    "pushed": "PS workers: whether the step pushed (with local steps only every H-th does)",
}
RECORD = {  # a worker record's keys (a run directory's worker-R.json)
    "rank": "the rank", "world_size": "ranks in the run",
    "job": "the shipped job's name; None for a script", "mode": "all-reduce: ddp, fsdp or zero1",
    "steps": "steps asked for (a script: steps run)", "batch_size": "the batch size; None where steps differ",
    "parameters": "parameters in the model", "device": "where the model lives",
    "step_log": "the rows (ROW)", "evals": "rank 0's held-out evaluations: wall_time, step, eval_<metric>",
    "initial_loss": "rank 0: the held-out loss before step 0", "final_loss": "rank 0: the last one",
    "eval_accuracy": "rank 0: the last held-out accuracy (classifiers)",
    "eval_metrics": "rank 0: the last evaluation's metrics", "metric": "the job's primary metric",
    "lower_is_better": "of that metric", "eval_seconds": "rank 0's evaluations between steps (off the clock)",
    "pushes": "pushes (all-reduce: gradient collectives; local steps: rounds)",
    "samples": "samples trained on; None where a step's batch size is unknown",
    "train_seconds": "the step loop's wall time, evaluations off", "wall_seconds": "the process's wall time",
    "max_rss_bytes": "peak resident memory", "max_staleness": "PS workers: the worst staleness of a push",
    "plan_hash": "PS workers: the partition plan's hash",
    "param_shapes": "psrv.Worker: each parameter tensor's shape in plan order (psrv simulate --against builds a "
                    "script's plan from it)", "wire_dtype": "PS workers: the pushes' float type",
    "overlap": "PS workers: sends during backward asked for", "early_sends": "PS workers: shards sent during backward",
    "pulls_in_place": "PS workers: pulls the model computed on where they lay in the shard's memory (pull_in_place)",
    "pulls_copied": "PS workers: pulls copied although pull_in_place asked for them in place",
    "compress": "PS workers: the codec", "error_feedback": "PS workers: residuals kept",
    "compress_pull": "PS workers: the pull codec ('': dense pulls)",
    "momentum_correction": "PS workers: the velocity kept here",
    "bytes_pushed": "PS workers: push payload bytes", "bytes_pulled": "PS workers: pull payload bytes",
    "bytes_sent": "PS workers: bytes on the wire out", "bytes_received": "PS workers: bytes on the wire in",
    "dense_push_bytes": "PS workers: what the pushes would be uncompressed",
    "compression_ratio": "dense_push_bytes / bytes_pushed",
    "backend": "all-reduce: gloo or nccl", "ddp_comm_hook": "all-reduce: DDP's gradient hook",
    "updates_applied": "all-reduce: optimizer steps that ran",
    "local_steps": "local steps H as given", "inner_steps": "local steps: inner steps run",
    "pseudo_grad_norms": "local steps: each push's pseudo-gradient norm",
    "inner_steps_per_push": "local steps: the inner steps each push carried",
    "fragments": "local steps: streaming DiLoCo's fragments F (1: the whole model per push)",
    "outer_dtype": "local steps: the pushed pseudo-gradients' wire dtype",
    "settings_overridden": "PS workers: the keywords a run's script gave against its config ({name: {run, script}})",
    "interrupted": "stopped by Ctrl-C or SIGTERM", "failed": "stopped by an error: its first line",
    "steps_done": "interrupted or failed: the steps that ran",
    "inputs": "the code that ran: versions and the sha256 of each file imported from outside psrv, the standard "
              "library and site-packages (psrv/code_inputs.py)",
}


def check_step_args(loss, batch_size) -> None:
    """ValueError unless `loss` is None, a number or a one-element tensor and `batch_size` None or an int >= 0."""
    if loss is not None and not (isinstance(loss, torch.Tensor) and loss.numel() == 1 or
                                 isinstance(loss, (int, float)) and not isinstance(loss, bool)):
        shown = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else repr(loss)
        raise ValueError(f"step(loss=...) takes a number or a one-element tensor; got {shown}")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0):
        raise ValueError(f"step(batch_size=...) takes an int >= 0; got {batch_size!r}")


@dataclass(frozen=True)
class RecordFiles:
    """Where a worker's record goes, each optional: the record (JSON), the final flat parameter vector
    and model.state_dict() (torch.save; give them on rank 0 only), the number of finished steps, and the
    step beacon (psrv/step_beacon.py: every step and the collective the rank is in, for the launcher's
    stall watch)."""
    record: Path | None = None
    params: Path | None = None
    state: Path | None = None
    progress: Path | None = None
    beacon: Path | None = None

    @classmethod
    def from_env(cls, *, rank: int) -> "RecordFiles":
        """The files `psrv run --script` names in the environment, `{rank}` in each replaced by `rank`."""
        return cls(record=_env_path("PSRV_RECORD", rank), params=_env_path("PSRV_PARAMS_OUT", rank),
                   progress=_env_path("PSRV_PROGRESS", rank), beacon=_env_path("PSRV_BEACON", rank))


class StepLog:
    """One worker's rows and record. `metrics` (psrv.metrics.WorkerMetrics) sees every row, and says
    finished once a whole record is written; `linger` seconds it stays up after that, for a last scrape.
    `beacon` (psrv/step_beacon.py) counts every row as a step; the loops mark on it what they are in (it
    writes nothing where `files` names no beacon)."""

    def __init__(self, files: RecordFiles = RecordFiles(), *, metrics=None, linger: float = 0.0):
        self.files, self.metrics, self.linger = files, metrics, linger
        self.started = time.time()
        self.rows: list[dict] = []
        self.fields: dict = {"evals": [], "eval_seconds": 0.0}
        self.rank = 0
        self._loop: list[float | None] = [None, None]  # the step loop's start and end, time.time()
        self.beacon = StepBeacon(files.beacon)

    @classmethod
    def from_env(cls, *, rank: int) -> "StepLog | None":
        """A script's log, where `psrv run --script` asked for one (PSRV_RECORD); else None."""
        files = RecordFiles.from_env(rank=rank)
        if files.record is None:
            return None
        metrics, port = None, os.environ.get("PSRV_METRICS_PORT", "").strip()
        if port:
            from psrv.metrics import WorkerMetrics, start_metrics
            metrics = start_metrics(WorkerMetrics, int(port), files.record.with_suffix(".metrics"),
                                    worker=rank, mode=os.environ.get("PSRV_MODE", ""))
        return cls(files, metrics=metrics, linger=float(os.environ.get("PSRV_METRICS_LINGER") or 0))

    def describe(self, **fields) -> None:
        """Record keys known before the end (declared in RECORD)."""
        _declared(fields, RECORD, "record")
        self.rank = fields.get("rank", self.rank)
        self.fields.update(fields)

    def loop_began(self) -> None:
        """The step loop starts (the worker has joined): the progress file says 0 steps from here on."""
        self._loop[0] = time.time()
        if self.files.progress is not None:
            self._progress()

    def _progress(self) -> None:
        """The steps logged so far into the progress file, replaced whole: the launcher reads it at any moment
        (psrv run's kills and deaths record worker 0's step), and a file truncated then written was read
        empty, as 0 steps, once in CI."""
        write_text(self.files.progress, str(len(self.rows)))

    def loop_ended(self) -> None:
        if self._loop[0] is not None and self._loop[1] is None:
            self._loop[1] = time.time()

    def row(self, *, step: int, loss, compute_seconds: float, communication_seconds: float,
            wait_seconds: float, batch_size: int | None, answered: tuple[int, int] | None = None,
            **pushes) -> dict:
        """Log a step: `pushes` are staleness and pushed, where the step pushes to shards; `answered`
        (StepInfo.answered): (step, staleness) of an earlier fragment push answered in this one, written
        into that step's row."""
        if isinstance(loss, torch.Tensor):
            loss = loss.detach().item()
        given = {"wall_time": time.time(), "worker": self.rank, "step": step,
                 "loss": None if loss is None else float(loss), "compute_seconds": compute_seconds,
                 "communication_seconds": communication_seconds, "wait_seconds": wait_seconds,
                 "batch_size": batch_size, **pushes}
        _declared(given, ROW, "step row")
        row = {k: given[k] for k in ROW if k in given}  # the declared order
        self.rows.append(row)
        self.beacon.stepped(compute_seconds + communication_seconds + wait_seconds)
        if self.metrics is not None:
            self.metrics.observe_step(row)
        if self.files.progress is not None and len(self.rows) % _EVERY == 0:
            self._progress()
        if answered is not None:
            self._answered(*answered)
        return row

    def _answered(self, step: int, staleness: int) -> None:
        """The push of `step`'s row was answered (a fragment push's answer, merged later): its staleness."""
        row = next((r for r in reversed(self.rows) if r["step"] == step), None)
        if row is not None and row.get("staleness", 0) is None:
            row["staleness"] = staleness
            if self.metrics is not None:
                self.metrics.observe_staleness(staleness)

    def pushed_round(self, pseudo_grad_norm: float, next_local_steps: int) -> None:
        """Local steps: a round was pushed (for the metrics)."""
        if self.metrics is not None:
            self.metrics.observe_round(pseudo_grad_norm, next_local_steps)

    def evaluated(self, step: int, metrics: dict[str, float]) -> None:
        """Rank 0's held-out evaluation before `step`."""
        self.fields["evals"].append({"wall_time": time.time(), "step": step,
                                     **{f"eval_{name}": value for name, value in metrics.items()}})
        if step == 0 and "loss" in metrics:  # a script's evaluation may report other metrics only
            self.fields["initial_loss"] = metrics["loss"]

    def off_clock(self, seconds: float) -> None:
        """An evaluation between steps took `seconds`: train_seconds leaves them out."""
        self.fields["eval_seconds"] += seconds

    def record(self, *, interrupted: bool = False, failed: str | None = None, answered: list[tuple[int, int]] = (),
               **fields) -> dict:
        """The record: the fields described, `fields` (declared in RECORD), and what the rows say, with the
        staleness of the fragment pushes `answered` at close() (psrv.Worker.totals()) in their rows.
        `interrupted` (Ctrl-C) or `failed` (the error's line): the steps done so far, and no weights."""
        for step, staleness in answered:
            self._answered(step, staleness)
        rows = self.rows
        sizes = {r["batch_size"] for r in rows}
        known = None not in sizes  # samples only when every step said its batch size
        began, ended = self._loop
        if began is None:  # a script: from the log's start to its last row
            began, ended = self.started, rows[-1]["wall_time"] if rows else self.started
        record = {"job": None, "steps": len(rows), "batch_size": next(iter(sizes)) if len(sizes) == 1 else None,
                  **self.fields, "step_log": rows, "pushes": len(rows),
                  "samples": sum(r["batch_size"] for r in rows) if known else None,
                  "train_seconds": max(0.0, (ended or time.time()) - began - self.fields["eval_seconds"]),
                  "wall_seconds": time.time() - self.started, "max_rss_bytes": peak_rss_bytes()}
        if "plan_hash" in self.fields:  # a PS worker's
            record["max_staleness"] = max((r["staleness"] for r in rows if r["staleness"] is not None), default=0)
        if "pseudo_grad_norms" in fields:
            record.update(pushes=len(fields["pseudo_grad_norms"]), inner_steps=len(rows))
        record.update(fields)
        if interrupted:
            record.update(interrupted=True, steps_done=len(rows))
        if failed is not None:
            record.update(failed=failed, steps_done=len(rows))
        _declared(record, RECORD, "record")
        return record

    def save_failed(self, error: BaseException, **fields) -> None:
        """The loop stopped on `error`: save the record of the steps done, `failed` with the error's first line.
        The launcher's stop signal, sent as another process died of the same cause, may land in the write: it
        raises once (psrv.process.interrupt_on_signals ignores the next ones for a while), and the write is done
        again."""
        self.loop_ended()
        record = self.record(failed=(str(error).splitlines() or [type(error).__name__])[0], **fields)
        try:
            self.save(record)
        except KeyboardInterrupt:
            self.save(record)

    def save(self, record: dict, *, params: torch.Tensor | None = None, state: dict | None = None) -> None:
        """Write the record, and the final weights where files name them (not after an interruption)."""
        files, whole = self.files, not record.get("interrupted") and not record.get("failed")
        if files.progress is not None:
            self._progress()
        if whole and params is not None and files.params is not None:
            files.params.parent.mkdir(parents=True, exist_ok=True)
            torch.save(params.detach().cpu().clone(), files.params)
        if whole and state is not None and files.state is not None:
            files.state.parent.mkdir(parents=True, exist_ok=True)
            torch.save({k: v.detach().cpu().clone() for k, v in state.items()}, files.state)
        if files.record is not None:  # the code that ran, for the run's reuse: only where a record is kept (its
            # scan of sys.modules: 15 ms over torch's modules)
            write_json(files.record, {**record, "inputs": code_inputs()})
        if self.metrics is not None and whole:  # it has left the shards: it finished, it did not die
            self.metrics.finished.set(1)
            if self.linger > 0:
                time.sleep(self.linger)


def _declared(got: dict, schema: dict, what: str) -> None:
    unknown = sorted(set(got) - set(schema))
    if unknown:
        raise ValueError(f"{what} keys not declared in psrv/client/steplog.py: {', '.join(unknown)}")


def _env_path(name: str, rank: int) -> Path | None:
    value = os.environ.get(name, "").strip()
    return Path(value.replace("{rank}", str(rank))) if value else None
