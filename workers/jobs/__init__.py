"""Job registry: a job is a model, its training batches, a loss and an evaluation (workers/jobs/job.py).

`load_job("digits_mlp", seed=0)` for a shipped job; any factory `factory(seed: int) -> Job` as
`load_job("pkg.mod:factory", seed=0)` (the module imported as `python -m` would, the current folder
first) or `load_job("path/to/file.py:factory", seed=0)` (a relative path is from the current folder).
`job_factory(name)` finds the factory without building the job: what a launcher checks first.
Importing this package does not import torch; building a job does.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import zlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Callable

from psrv.config.sections import SHIPPED_JOBS
from psrv.workers.jobs.job import Job, batch_size_of, to_device  # noqa: F401  (the job interface)

if TYPE_CHECKING:
    import torch


def _registry() -> dict[str, str]:
    return {"digits_mlp": "psrv.workers.jobs.digits:digits_mlp",
            "mnist1d_mlp": "psrv.workers.jobs.mnist1d:mnist1d_mlp",
            "synthetic_mlp": "psrv.workers.jobs.synthetic:synthetic_mlp",
            "digits_cnn": "psrv.workers.jobs.digits:digits_cnn",
            "digits_mlp3": "psrv.workers.jobs.digits:digits_mlp3",
            "mnist1d_cnn": "psrv.workers.jobs.mnist1d:mnist1d_cnn",
            "code_lm": "psrv.workers.jobs.code_lm:code_lm"}


JOB_NAMES = SHIPPED_JOBS  # the config tree checks a job's name against these; _registry() builds them


def _with_path(folder: str, load: Callable[[], ModuleType]) -> ModuleType:
    """`load()` with `folder` first on sys.path while it runs (as `python -m` and `python FILE` have it)."""
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    importlib.invalidate_caches()  # a module written since this process started is found too
    try:
        return load()
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)


def _from_file(path: Path) -> ModuleType:
    """The module in the file at `path`, loaded once per process under a name of its own."""
    name = f"_psrv_job_{path.stem}_{zlib.crc32(str(path).encode()):08x}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up here
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def job_factory(name: str) -> Callable[[int], Job]:
    """The factory `name` stands for, imported but not called; ValueError saying what is wrong."""
    target = _registry().get(name, name)
    if ":" not in target:
        raise ValueError(f"unknown job {name!r}; use one of {', '.join(JOB_NAMES)}, package.module:factory "
                         "or path/to/file.py:factory")
    where, _, attr = target.rpartition(":")
    try:
        if where.endswith(".py"):
            path = Path(where).expanduser().resolve()
            if not path.is_file():
                raise ValueError(f"job {name!r}: no such file {path}")
            module = _with_path(str(path.parent), lambda: _from_file(path))
        else:
            module = _with_path(os.getcwd(), lambda: importlib.import_module(where))
    except ImportError as exc:
        raise ValueError(f"job {name!r}: cannot import {where}: {exc} (a module is looked for in the current "
                         f"folder {os.getcwd()} and on the Python path)") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"job {name!r}: {where} has no function {attr!r}")
    return factory


def load_job(name: str, *, seed: int) -> Job:
    """Build the job `name` names (a shipped name, 'package.module:factory' or 'path/to/file.py:factory')."""
    factory = job_factory(name)
    import torch
    # torch.manual_seed's CPU part, and CUDA's where there is one: torch.manual_seed also queues a seed for each
    # lazy device with its caller's stack formatted (XPU and MTIA too), milliseconds where no such device is
    torch.random.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    job = factory(seed)
    if not isinstance(job, Job):
        raise ValueError(f"job factory {name!r} returned {type(job).__name__}, not workers.jobs.Job")
    return job


def evaluate(job: Job, model: torch.nn.Module, *, device: str | torch.device = "cpu") -> dict[str, float]:
    """Held-out metrics of `model` ({name: float}; "loss" always, "accuracy" for a classifier)."""
    return job.evaluate_on(model, device=device)
