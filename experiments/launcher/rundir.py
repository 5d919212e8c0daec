"""A run's output folder is owned by one run while it runs, and a reused one keeps nothing of the run before.

Ownership is an exclusive `flock` on a lock file in the folder (DIR/.psrv-run.lock; an experiment's folder
has DIR/.psrv-experiment.lock). The kernel drops the lock when the last process holding it ends, so a
run killed with kill -9 leaves nothing stuck. The run's processes inherit it (experiments/launcher/cluster.py passes
the descriptor on and stops them when their launcher dies), so the folder stays owned while anything of the
run can still write into it. The lock file itself is never removed: unlinking it would let a second run
lock a new file of the same name while the first still holds the old one.
"""
from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import shutil
from pathlib import Path

from psrv.config import ConfigError, RunConfig, from_dict

RUN_LOCK = ".psrv-run.lock"
EXPERIMENT_LOCK = ".psrv-experiment.lock"
# What docs/deploy.md has a user put beside a run (Prometheus reads targets.json from its own folder, and
# keeps its database there): never a run's, never cleared, and no reason to refuse the folder.
COMPANIONS = ("prometheus.yml", "rules.yml", "tsdb")


class FolderInUse(ValueError):
    """Another run (or experiment) owns the folder: the message says which and what to do."""


def holder(folder: Path, lock: str = RUN_LOCK) -> str | None:
    """Who holds `folder`'s lock ('psrv run, pid 123, started 12:00:01'); None when no one does."""
    path = folder / lock
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            return _describe(path)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _describe(path: Path) -> str:
    try:
        pid, what, started = path.read_text().split("\t")[:3]
    except (OSError, ValueError):
        return "a process that has not said which yet"
    try:
        os.kill(int(pid), 0)
        gone = ""
    except ProcessLookupError:
        gone = "; it is gone and its processes are still stopping"
    except (PermissionError, ValueError):
        gone = ""
    return f"{what}, pid {pid}, started {started.strip()}{gone}"


def refusal(folder: Path, who: str, *, what: str = "run") -> FolderInUse:
    return FolderInUse(f"{folder} is in use by another {what} ({who}); wait for it to end, or pass another --out")


class OwnedFolder:
    """`with OwnedFolder(DIR, what="psrv run"):` creates DIR and holds its lock, or raises FolderInUse.
    `fd` is the lock's descriptor (for the run's processes to inherit). The lock file then says who holds
    it (`announce`), unless `announce` is False: the caller says it once its own checks have passed, so a
    command refused for another reason leaves the folder as it was."""

    def __init__(self, folder: str | Path, *, what: str, lock: str = RUN_LOCK, announce: bool = True):
        self.folder, self.what, self.lock, self._announce = Path(folder), what, lock, announce
        self.fd: int | None = None
        self._had_lock = False

    def __enter__(self) -> OwnedFolder:
        if self.folder.exists() and not self.folder.is_dir():
            raise ValueError(f"{self.folder} is a file, not a folder; pass --out DIR with a folder")
        self.folder.mkdir(parents=True, exist_ok=True)
        self._had_lock = (self.folder / self.lock).exists()  # a folder a run of this psrv owned before
        fd = os.open(self.folder / self.lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            kind = "experiment" if self.lock == EXPERIMENT_LOCK else "run"
            raise refusal(self.folder, _describe(self.folder / self.lock), what=kind) from None
        self.fd = fd
        if self._announce:
            self.announce()
        return self

    def announce(self) -> None:
        """Write who holds the lock (pid, what, when) into the lock file, for a refused command to say."""
        started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\t{self.what}\t{started}\n".encode(), 0)

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # the lock goes once the run's processes, which share it, have ended too
            self.fd = None

    def clear(self) -> list[str]:
        """Remove everything an earlier run left in the folder (the lock file and the COMPANIONS stay);
        the names removed. A folder that holds other files but was never a run's (no lock file, no run's
        config.json) is refused: it may be anything of the user's."""
        entries = sorted(p for p in self.folder.iterdir() if p.name != self.lock and p.name not in COMPANIONS)
        if entries and not self._was_a_run(entries):
            shown = ", ".join(p.name for p in entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise ValueError(f"{self.folder} holds files that no psrv run wrote ({shown}); pass --out with a new "
                             "or empty folder, or a run's folder")
        names = []
        for path in entries:
            if path.is_dir() and not path.is_symlink():
                names.append(path.name + "/")
                shutil.rmtree(path)
            else:
                names.append(path.name)
                path.unlink()
        return names

    def _was_a_run(self, entries: list[Path]) -> bool:
        if self._had_lock:
            return True
        config = self.folder / "config.json"  # a run of a psrv from before the lock file
        if config not in entries:
            return False
        try:
            from_dict(RunConfig, json.loads(config.read_text()))
        except (OSError, ValueError, ConfigError):
            return False
        return True
