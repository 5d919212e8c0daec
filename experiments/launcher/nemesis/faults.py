"""The faults themselves, each done to a real process, host or filesystem: SIGKILL; SIGSTOP then SIGCONT; a
blackhole route each way between two emulated hosts; a late-ack request file; a tmpfs filled then freed. A
fault that lasts returns its heal (a callable: None when healed, else why not); NotDone says why one was not done."""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Callable, Iterator

from psrv.atomic import write_json
from psrv.experiments.launcher.netns import EmulatedHosts

Heal = Callable[[], "str | None"]
FILL = ".nemesis-fill"  # the file disk_full writes into DIR/checkpoints until the filesystem is full
LATE_ACKS = "faults"  # DIR/faults/PID.json: {"id": N, "late_ack_s": D}, read by the backup of that PID


class NotDone(Exception):
    """A fault that was not done; the message says why (a process already gone, a host shared...)."""


def _how(proc: subprocess.Popen) -> str:
    code = proc.returncode
    return f"signal {-code}" if code < 0 else f"exit code {code}"


def _ended(proc: subprocess.Popen) -> NotDone:
    return NotDone(f"it had ended already ({_how(proc)})")


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL `proc` (reaped here: its exit code is then -9)."""
    if proc.poll() is not None:
        raise _ended(proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def state(pid: int) -> str:
    """A process's state letter from /proc/PID/stat ('T': stopped); '' once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return ""


def pause(proc: subprocess.Popen) -> Heal:
    """SIGSTOP `proc`; its heal sends SIGCONT (a process that ended meanwhile is said, not signalled)."""
    if proc.poll() is not None:
        raise _ended(proc)
    proc.send_signal(signal.SIGSTOP)

    def heal() -> str | None:
        if proc.poll() is not None:
            return f"it ended while paused ({_how(proc)})"
        proc.send_signal(signal.SIGCONT)
        return None
    return heal


def _ip(*args: str) -> str | None:
    """Run `ip ARGS`; None, or its error's last line."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    return None if done.returncode == 0 else ((done.stderr or done.stdout).strip().splitlines() or ["failed"])[-1]


def partition(hosts: EmulatedHosts, a: int, b: int) -> Heal:
    """Cut emulated hosts `a` and `b` (of `hosts`) apart, each still reaching every other host: in each one's
    namespace a blackhole route to the other's address (a packet between them is dropped before it leaves);
    its heal removes both routes."""
    if a == b:
        raise NotDone(f"both run on emulated host {a}: no route between them to cut")
    routes = [(hosts.namespace(a), hosts.address(b)), (hosts.namespace(b), hosts.address(a))]
    made = []
    for ns, peer in routes:
        why = _ip("-n", ns, "route", "add", "blackhole", f"{peer}/32")
        if why is not None:
            for done_ns, done_peer in made:
                _ip("-n", done_ns, "route", "del", "blackhole", f"{done_peer}/32")
            raise NotDone(f"ip -n {ns} route add blackhole {peer}: {why}")
        made.append((ns, peer))

    def heal() -> str | None:
        whys = [w for ns, peer in made if (w := _ip("-n", ns, "route", "del", "blackhole", f"{peer}/32"))]
        return "; ".join(whys) or None
    return heal


def late_ack(out: Path, pid: int, *, fault: int, seconds: float) -> Path:
    """Ask the backup of pid `pid` to hold back its next acknowledgement `seconds` (its server reads
    DIR/faults/PID.json; `fault` is the request's fresh id); the file's path."""
    path = out / LATE_ACKS / f"{pid}.json"
    path.parent.mkdir(exist_ok=True)
    write_json(path, {"id": fault, "late_ack_s": seconds})
    return path


def is_tmpfs(folder: Path) -> bool:
    """Whether `folder` is itself the mount point of a tmpfs (/proc/mounts)."""
    where = os.path.realpath(folder)
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return False
    return any(parts[1] == where and parts[2] == "tmpfs" for parts in (line.split() for line in lines)
               if len(parts) > 2)


def fill(folder: Path) -> Heal:
    """Fill the tmpfs mounted at `folder` (one file, written until ENOSPC); its heal removes that file. Only a
    tmpfs mounted there: never the disk that holds the run folder."""
    if not is_tmpfs(folder):
        raise NotDone(f"{folder} is not a tmpfs of its own (the launcher mounts one there with disk_full); "
                      "nothing filled")
    path = folder / FILL
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            block = bytes(size)
            try:
                while os.write(fd, block):
                    pass
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)

    def heal() -> str | None:
        path.unlink(missing_ok=True)
        return None
    return heal


@contextlib.contextmanager
def tmpfs(folder: Path, mib: int) -> Iterator[Path]:
    """A tmpfs of `mib` MiB mounted at `folder` while the block runs; what was written there is moved onto
    the disk beneath when it ends (the run's checkpoints stay in its folder). RuntimeError if it cannot mount."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(folder)],
                             capture_output=True, text=True, timeout=30)
    if mounted.returncode != 0:
        raise RuntimeError(f"nemesis disk_full: cannot mount a tmpfs at {folder}: {mounted.stderr.strip()}")
    kept = folder.with_name(folder.name + ".kept")
    try:
        yield folder
    finally:
        shutil.rmtree(kept, ignore_errors=True)
        try:
            shutil.copytree(folder, kept, ignore=shutil.ignore_patterns(FILL))
        finally:
            if subprocess.run(["umount", str(folder)], capture_output=True, timeout=30).returncode != 0:
                subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)
        for path in kept.iterdir():
            os.replace(path, folder / path.name)
        kept.rmdir()
