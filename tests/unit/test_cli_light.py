"""The command line imports no torch until a command needs it: `psrv run` and `psrv experiment` only
launch processes, and every process a run starts pays the CLI's own imports first (torch costs about 2 s
and 225 MB). psrv top's STATS poller once imported the protocol, and with it torch, into every command."""
from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT


def test_parsing_any_command_imports_no_torch():
    code = "import sys; from psrv.cli.main import build_parser; build_parser(); sys.exit('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-P", "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr or "psrv.cli imported torch"


def test_the_check_sees_torch_when_it_is_imported():
    done = subprocess.run([sys.executable, "-P", "-c", "import sys, psrv.cli.main, torch; sys.exit('torch' in sys.modules)"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr


def test_the_versions_an_experiment_records_import_no_torch_and_are_torchs_own():
    """`psrv experiment` needs torch only for the version its report records; read from torch's installed
    metadata, it is torch.__version__ without the import (about 2 s of CPU per experiment)."""
    import json

    import torch
    code = ("import json, sys; from psrv.experiments.harness.runner import versions; v = versions(); "
            "print(json.dumps(v)); sys.exit('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-P", "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr or "the experiment's versions imported torch"
    assert json.loads(done.stdout)["torch"] == torch.__version__
