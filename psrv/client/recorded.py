"""What psrv.Worker and its all-reduce form (psrv/client/allreduce.py) share around the loop: the `with`
block, `log_eval`, and writing the record with the evaluations' final keys. A subclass sets `rank`,
`steps`, `_open`, `_log` (a StepLog or None), `_evals` (script_evals.Evaluations) and `_flat` (FlatModel),
and defines `totals()`, `close()` and `_abandon()`."""
from __future__ import annotations


class RecordedWorker:
    def log_eval(self, metrics) -> None:
        """Record a held-out evaluation ({name: number or one-element tensor}) at the steps done so far;
        after close(), at the end (on rank 0, the final weights), and the record is written again."""
        self._evals.record(self.steps, metrics)
        if not self._open:
            self._save()

    def _save(self) -> None:
        """The record, with the last evaluation's keys, and rank 0's final weights, where a log is kept."""
        if self._log is not None:
            record = self._log.record(**self.totals(), **self._evals.concluded())
            self._log.save(record, params=self._flat.params if self.rank == 0 else None)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._abandon()
