"""A nemesis for `psrv run` (`--nemesis SPEC`, docs/reliability.md "The nemesis"): kills, pauses, partitions,
late acks and full disks on a schedule, fixed or seeded, done to the processes the targets are at that moment
and recorded in DIR/nemesis.jsonl. The schedule's text form is parsed in psrv/config/nemesis.py."""
from psrv.experiments.launcher.nemesis.nemesis import Nemesis
from psrv.experiments.launcher.nemesis.setup import check_launch, checkpoint_disk, needs_hosts

__all__ = ["Nemesis", "check_launch", "checkpoint_disk", "needs_hosts"]
