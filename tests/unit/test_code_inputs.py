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


def test_a_script_and_its_helper_are_hashed_and_nothing_installed_is(tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text("import json\nNOISE = 0.1\n")
    (tmp_path / "train.py").write_text(
        "import json, sys, torch, psrv, helper\n"
        "from psrv.code_inputs import code_inputs\n"
        "print(json.dumps(code_inputs()))\n")
    out = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    files = {str((tmp_path / n).resolve()): hashlib.sha256((tmp_path / n).read_bytes()).hexdigest()
             for n in ("helper.py", "train.py")}
    assert got["files"] == files  # not json, torch or psrv: their versions say what they were
    assert got["versions"] == versions() and got["versions"]["python"] == platform.python_version()


def test_a_runs_inputs_are_the_union_of_its_workers() -> None:
    a = {"versions": {"psrv": "1"}, "files": {"/x/a.py": "1"}}
    b = {"versions": {"psrv": "1"}, "files": {"/x/b.py": "2"}}
    assert merged([a, None, b]) == {"versions": {"psrv": "1"}, "files": {"/x/a.py": "1", "/x/b.py": "2"}}
    assert merged([None, {}]) is None
