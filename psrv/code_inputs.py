"""What code a run ran, beyond its config: psrv's, Python's and torch's versions, and the sha256 of every
file the process imported from outside the standard library, site-packages and psrv itself (a user's
script and the helper modules it imports). Each worker's record holds it (psrv/client/steplog.py), the
run's summary.json the union, and `psrv experiment` reuses a finished run only while it still holds
(`why_changed`): an edited helper module or another torch reruns the runs it touches, saying why.
"""
from __future__ import annotations

import hashlib
import os
import platform
import site
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

_VENDORED = ("site-packages", "dist-packages")  # a folder of installed distributions, whatever its prefix


def versions() -> dict[str, str]:
    """psrv's, Python's and torch's versions. Torch's is read from its installed metadata, the same string as
    torch.__version__: a caller without torch (the harness) pays nothing for it."""
    return {"python": platform.python_version(), "torch": _version("torch"), "psrv": _version("psrv")}


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:  # torch built in place, psrv run from a source tree uninstalled
        if name == "torch" and "torch" in sys.modules:
            return str(sys.modules["torch"].__version__)
        return "unknown"


def _installed_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    roots = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    roots += [*site.getsitepackages(), site.getusersitepackages()]
    return [Path(r).resolve() for r in roots if r]


def _is_user_code(name: str, module) -> bool:
    spec = getattr(module, "__spec__", None)
    full = getattr(spec, "name", None) or name  # __main__ run as `python -m psrv.cli` is psrv's own
    return not (full == "psrv" or full.startswith("psrv."))


def imported_files() -> dict[str, str]:
    """{absolute path: sha256} of every module file this process has imported that is neither psrv's nor
    installed (the standard library, site-packages): the entry script (__main__) and its own modules."""
    roots = [str(root).rstrip(os.sep) + os.sep for root in _installed_roots()]
    folders: dict[str, str] = {}  # a module's folder as named -> its real path: one walk per folder, not per file
    found: dict[str, str] = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not file or not _is_user_code(name, module):
            continue
        path = _real_path(file, folders)
        if any(part in _VENDORED for part in path.split(os.sep)) or path.startswith(tuple(roots)) \
                or not os.path.isfile(path):
            continue
        found[path] = sha256_of(path)
    return dict(sorted(found.items()))


def _real_path(file: str, folders: dict[str, str]) -> str:
    """os.path.realpath(file), with its folder's real path taken from `folders` (filled in here): the file is
    its real folder's entry unless it is itself a link. Over torch's thousand modules, a realpath each took 50 ms."""
    head, tail = os.path.split(file)
    real = folders.get(head)
    if real is None:
        real = folders[head] = os.path.realpath(head)
    return os.path.realpath(file) if os.path.islink(file) else os.path.join(real, tail)


def sha256_of(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def code_inputs() -> dict:
    """This process's inputs as a record holds them: {"versions": ..., "files": {path: sha256}}."""
    return {"versions": versions(), "files": imported_files()}


def merged(inputs: list[dict]) -> dict | None:
    """The run's inputs from its processes' (the union of their files, the first one's versions); None
    where no process recorded any."""
    inputs = [i for i in inputs if i]
    if not inputs:
        return None
    files: dict[str, str] = {}
    for one in inputs:
        files.update(one.get("files", {}))
    return {"versions": inputs[0].get("versions", {}), "files": dict(sorted(files.items()))}


def why_changed(recorded: dict | None) -> str | None:
    """None while the code a run recorded (`recorded`: summary.json's "inputs") is the code here now; else
    why not, in words that name the version or file that changed."""
    if not recorded:
        return "it recorded no code inputs (an older psrv made it)"
    now = versions()
    moved = [f"{name} {recorded.get('versions', {}).get(name, 'unknown')} -> {now[name]}" for name in now
             if recorded.get("versions", {}).get(name) != now[name]]
    changed = []
    for file, digest in recorded.get("files", {}).items():
        try:
            same = sha256_of(file) == digest
        except OSError:
            changed.append(f"{_shown(file)} is gone")
            continue
        if not same:
            changed.append(f"{_shown(file)} changed since it ran")
    if not moved and not changed:
        return None
    return "; ".join([*([f"versions changed ({', '.join(moved)})"] if moved else []), *changed])


def _shown(file: str) -> str:
    """`file` relative to the current folder where it is under it, else as recorded."""
    try:
        return str(Path(file).relative_to(Path.cwd().resolve()))
    except ValueError:
        return file
