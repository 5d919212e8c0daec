"""The history checker behind `psrv check`: a run's recorded events (docs/history.md) held against the model of
a replicated parameter server. reading: the files; lineage: a shard's replicas and what each state holds; rules
1-5 in writes, epochs, barrier, bound (on replay's rebuilt controller) and counts; result: the verdict."""
from psrv.experiments.launcher.history.check import check_run
from psrv.experiments.launcher.history.reading import HistoryError
from psrv.experiments.launcher.history.result import RULES, CheckResult, Counts, Violation

__all__ = ["RULES", "CheckResult", "Counts", "HistoryError", "Violation", "check_run"]
