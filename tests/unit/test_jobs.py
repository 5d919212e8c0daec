"""The job registry: the default job's data is scikit-learn's digits with train_test_split's split (read
without sklearn), and a job's factory is found, from the current folder too, without building the job."""
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.helpers import ROOT
from psrv.workers.jobs import job_factory, load_job
from psrv.workers.jobs.digits import digits_arrays


def test_digits_are_load_digits_and_the_split_is_train_test_split():
    # imported here, not at the top: scikit-learn's import costs about 1 s of CPU, which every pytest process
    # would pay in collecting this file, where only the one that runs this test needs it
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    x, y = load_digits(return_X_y=True)
    gx, gy = digits_arrays()
    np.testing.assert_array_equal(gx, x)
    np.testing.assert_array_equal(gy, y)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    job = load_job("digits_mlp", seed=0)
    for got, want in ((job.train[0], x_tr), (job.test[0], x_te)):
        torch.testing.assert_close(got, torch.tensor(want / 16.0, dtype=torch.float32), rtol=0, atol=0)
    for got, want in ((job.train[1], y_tr), (job.test[1], y_te)):
        assert torch.equal(got, torch.tensor(want, dtype=torch.long))


def test_the_shipped_names_are_the_config_trees():
    from psrv.config.sections import SHIPPED_JOBS
    from psrv.workers.jobs import JOB_NAMES, _registry
    assert tuple(_registry()) == SHIPPED_JOBS == JOB_NAMES


def test_importing_the_registry_imports_no_torch():
    """A launcher checks a custom job's factory without paying for torch."""
    code = "import sys, psrv.workers.jobs; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


USER_JOB = '''CALLS = []


def make(seed):
    CALLS.append(seed)
    raise AssertionError("job_factory must not build the job")
'''


def test_a_module_in_the_current_folder_is_found_and_the_path_left_as_it_was(tmp_path, monkeypatch):
    (tmp_path / "userjob_mod.py").write_text(USER_JOB)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    before = list(sys.path)
    factory = job_factory("userjob_mod:make")
    assert factory.__module__ == "userjob_mod" and sys.modules["userjob_mod"].CALLS == []
    assert sys.path == before


def test_a_file_is_found_from_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "userjob_file.py").write_text(USER_JOB)
    monkeypatch.chdir(tmp_path)
    factory = job_factory("sub/userjob_file.py:make")
    assert factory is job_factory(str(tmp_path / "sub" / "userjob_file.py") + ":make")  # loaded once
    assert sys.modules[factory.__module__].CALLS == []


@pytest.mark.parametrize(("name", "says"), [
    ("nosuch", "unknown job 'nosuch'"),
    ("no_such_module_here:make", "cannot import no_such_module_here"),
    ("psrv.workers.jobs.digits:no_such_factory", "has no function 'no_such_factory'"),
    ("missing/file.py:make", "no such file"),
])
def test_a_job_that_does_not_resolve_is_a_value_error_saying_why(name, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        job_factory(name)
