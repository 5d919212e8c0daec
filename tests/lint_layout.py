"""`lint-imports` on psrv as it installs: `python -m tests.lint_layout` (make test runs it).

pyproject.toml maps the folders workers/ and experiments/ to psrv.workers and psrv.experiments. An
installed psrv has them inside its package, but import-linter (grimp) finds a package's modules by walking
its one folder and cannot follow the mapping (NotATopLevelModule). So this builds the installed layout out
of symlinks in a temporary folder, from pyproject's own package-dir, and runs lint-imports on it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(into: Path) -> None:
    """psrv/ under `into`: every entry of the source psrv/ plus each mapped folder, as symlinks."""
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    psrv = into / "psrv"
    psrv.mkdir()
    for entry in (ROOT / "psrv").iterdir():
        if entry.name != "__pycache__":
            (psrv / entry.name).symlink_to(entry)
    for name, folder in package_dir.items():
        parent, _, leaf = name.rpartition(".")
        assert parent == "psrv", f"package-dir maps {name}: only psrv's direct subpackages are mapped"
        (psrv / leaf).symlink_to(ROOT / folder)


def main() -> int:
    lint = Path(sys.executable).with_name("lint-imports")
    with tempfile.TemporaryDirectory(prefix="psrv-lint-") as d:
        build(Path(d))
        env = {**os.environ, "PYTHONPATH": d}
        return subprocess.run([str(lint), str(ROOT / "pyproject.toml"), "--no-cache"], cwd=d,
                              env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
