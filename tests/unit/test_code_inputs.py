"""The code a run ran (psrv/code_inputs.py): a script's own modules are hashed, what is installed (the
standard library, site-packages) and psrv itself are not, and the versions are this interpreter's."""
from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
from pathlib import Path

from psrv.code_inputs import merged, versions


def inputs_of_script(folder: Path, imports: str) -> dict:
    """code_inputs() as `python train.py` in `folder` records it, train.py importing `imports` first."""
    (folder / "train.py").write_text(f"import json, {imports}\nfrom psrv.code_inputs import code_inputs\n"
                                     "print(json.dumps(code_inputs()))\n")
    out = subprocess.run([sys.executable, "train.py"], cwd=folder, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_script_and_its_helper_are_hashed_and_nothing_installed_is(tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text("import json\nNOISE = 0.1\n")
    got = inputs_of_script(tmp_path, "sys, torch, psrv, helper")
    files = {str((tmp_path / n).resolve()): hashlib.sha256((tmp_path / n).read_bytes()).hexdigest()
             for n in ("helper.py", "train.py")}
    assert got["files"] == files  # not json, torch or psrv: their versions say what they were
    assert got["versions"] == versions() and got["versions"]["python"] == platform.python_version()


def test_modules_reached_through_links_are_recorded_at_their_real_paths(tmp_path: Path) -> None:
    """A folder that is a link (lib -> ../real) and a module file that is one (h2.py -> ../real/linked.py): each
    file is named by its real path, as Path.resolve names it."""
    real, proj = tmp_path / "real", tmp_path / "proj"
    real.mkdir()
    proj.mkdir()
    (real / "helper.py").write_text("A = 1\n")
    (real / "linked.py").write_text("B = 2\n")
    (proj / "lib").symlink_to(real, target_is_directory=True)
    (proj / "h2.py").symlink_to(real / "linked.py")
    got = inputs_of_script(proj, "lib.helper, h2")
    assert sorted(got["files"]) == sorted(str(p.resolve()) for p in (real / "helper.py", real / "linked.py",
                                                                     proj / "train.py"))


def test_a_runs_inputs_are_the_union_of_its_workers() -> None:
    a = {"versions": {"psrv": "1"}, "files": {"/x/a.py": "1"}}
    b = {"versions": {"psrv": "1"}, "files": {"/x/b.py": "2"}}
    assert merged([a, None, b]) == {"versions": {"psrv": "1"}, "files": {"/x/a.py": "1", "/x/b.py": "2"}}
    assert merged([None, {}]) is None
