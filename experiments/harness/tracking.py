"""TensorBoard event files of a finished run, written from its records when it ends: the scalars of
steps.csv (per worker) and evals.csv, and each server's staleness histogram. Runs then open in TensorBoard
beside a user's other experiments, and W&B ingests them with `wandb.init(sync_tensorboard=True)`.

Tags: `worker-R/<column>` (loss, staleness, compute_seconds, communication_seconds, wait_seconds,
batch_size) at global step = the worker's step; `eval/<metric>` at rank 0's step; `server-K/staleness`,
a histogram of every push the shard applied (one bucket per staleness value). Scalars are what the CSVs
hold, stored as TensorBoard stores them (float32).

The events are written with tensorboard's own event-file writer and protos, not torch's SummaryWriter
(which writes the same records): the harness and the launcher need no torch, and importing it for the
writer cost every `--tensorboard` experiment or run about 2 s of CPU."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from psrv.config import RunConfig

from psrv.experiments.harness.collect import number, read_csv

STEP_SCALARS = ("loss", "staleness", "compute_seconds", "communication_seconds", "wait_seconds", "batch_size")


def run_origin(run: Path) -> float:
    """The run's start in seconds since the epoch: steps.csv's wall times are relative to it."""
    starts = []
    for path in run.glob("worker-*.json"):
        try:
            first = json.loads(path.read_text())["step_log"][0]
        except (OSError, ValueError, KeyError, IndexError):
            continue
        starts.append(first["wall_time"] - first["compute_seconds"] - first["communication_seconds"]
                      - first["wait_seconds"])
    return min(starts, default=(run / "steps.csv").stat().st_mtime)


class _Writer:
    """One event file in `logdir`, written as torch.utils.tensorboard's SummaryWriter writes its scalars
    (a Summary value's simple_value) and raw histograms (a HistogramProto)."""

    def __init__(self, logdir: Path):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter  # only when asked for
        self._file = EventFileWriter(str(logdir))

    def _add(self, value, step: int, walltime: float) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        self._file.add_event(Event(wall_time=walltime, step=step, summary=Summary(value=[value])))

    def add_scalar(self, tag: str, value: float, step: int, *, walltime: float) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary
        self._add(Summary.Value(tag=tag, simple_value=float(value)), step, walltime)

    def add_histogram_raw(self, tag: str, *, min: float, max: float, num: int, sum: float, sum_squares: float,
                          bucket_limits: list[float], bucket_counts: list[int], step: int, walltime: float) -> None:
        from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary
        histo = HistogramProto(min=min, max=max, num=num, sum=sum, sum_squares=sum_squares,
                               bucket_limit=bucket_limits, bucket=bucket_counts)
        self._add(Summary.Value(tag=tag, histo=histo), step, walltime)

    def close(self) -> None:
        self._file.close()


def _staleness_histogram(writer: _Writer, tag: str, counts: dict[str, int], step: int, walltime: float) -> None:
    values = sorted((float(k), int(n)) for k, n in counts.items() if int(n) > 0)
    if not values:
        return
    num = sum(n for _, n in values)
    writer.add_histogram_raw(tag, min=values[0][0], max=values[-1][0], num=num,
                             sum=sum(k * n for k, n in values), sum_squares=sum(k * k * n for k, n in values),
                             bucket_limits=[k + 0.5 for k, _ in values], bucket_counts=[n for _, n in values],
                             step=step, walltime=walltime)


def write_events(run: str | Path, logdir: str | Path) -> Path:
    """Write one TensorBoard run for the finished run directory `run` into `logdir` (replacing the event
    files a previous call left there); returns `logdir`."""
    run, logdir = Path(run), Path(logdir)
    if logdir.exists():
        shutil.rmtree(logdir)  # one run, one set of events: a rewrite must not double every point
    origin = run_origin(run)
    writer = _Writer(logdir)
    try:
        for row in read_csv(run / "steps.csv"):
            step, t = int(number(row["step"])), origin + (number(row.get("wall_time")) or 0.0)
            for column in STEP_SCALARS:
                value = number(row.get(column))
                if value is not None:  # DDP's staleness is empty: it has none
                    writer.add_scalar(f"worker-{row['worker']}/{column}", value, step, walltime=t)
        for row in read_csv(run / "evals.csv"):
            step, t = int(number(row["step"])), origin + (number(row.get("wall_time")) or 0.0)
            for column, cell in row.items():
                value = number(cell)
                if column.startswith("eval_") and value is not None:
                    writer.add_scalar(f"eval/{column[len('eval_'):]}", value, step, walltime=t)
        for path in sorted(run.glob("server-*.json")):
            record = json.loads(path.read_text())
            _staleness_histogram(writer, f"server-{record['shard']}/staleness",
                                 record.get("staleness_histogram") or {}, int(record.get("version", 0)),
                                 path.stat().st_mtime)
    finally:
        writer.close()
    return logdir


def run_name(variant: str, seed: int) -> str:
    return f"{variant}/seed-{seed}"


def write_run_events(cfg: RunConfig, run: str | Path) -> Path:
    """`psrv run --tensorboard DIR`: the run's events in DIR/<mode name>-seed-<seed>."""
    from psrv.experiments.harness.spec import default_name
    return write_events(run, Path(cfg.tensorboard) / f"{default_name(cfg)}-seed-{cfg.seed}")
