"""A run's worker settings as psrv.Worker's keywords: `keywords_of` is the one mapping of a config section to
them (Worker.from_settings, the shipped loop's), and `TakesRunSettings`, psrv.Worker's metaclass, gives a
script's psrv.Worker(model) the run's settings (PSRV_CONFIG, the config.json `psrv run --script` and a spec's
`[job] script` hand each rank) for every keyword the call leaves out; a keyword the script passes wins, and
the worker's record says where it differs from the run's (`settings_overridden`)."""
from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
from pathlib import Path
from typing import Iterable

from psrv.config import RunConfig
from psrv.config.base import from_dict
from psrv.config.sections import Placement, WorkerSettings
from psrv.client.keywords import allreduce_mode
from psrv.client.settings import ALIASES, WORKER_KEYWORDS, call_keywords, keyword_names

log = logging.getLogger("psrv.worker")

TIMEOUT_OPTION = "worker.request_timeout (--request-timeout)"  # what a timeout's messages call a run's bound


def keywords_of(settings, names: Iterable[str]) -> dict:
    """psrv.Worker's keywords among `names` that a config section gives by name: a WorkerSettings, a Placement,
    a GradClip, or a WorkerConfig holding them all (`request_timeout` is `timeout`; `local_steps` is None,
    off, unless the settings step an inner optimizer: local_steps > 1, or an inner_optimizer given)."""
    names = set(names)
    given = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings) if f.name in names}
    if isinstance(settings, WorkerSettings):
        given.update(timeout=settings.request_timeout,
                     local_steps=settings.local_steps if settings.local_updates else None)
    return given


def run_keywords(config: RunConfig, names: Iterable[str]) -> dict:
    """What a run gives its script's psrv.Worker (`names`: its keywords): the worker settings and the
    cluster's placement (transport and the payload planes; not `servers`, which is a count there)."""
    placement = {f.name for f in dataclasses.fields(Placement)}
    return {**{k: v for k, v in keywords_of(config.cluster, names).items() if k in placement},
            **keywords_of(config.worker, names)}


def run_config_from_env() -> RunConfig | None:
    """The run's resolved config, from the config.json PSRV_CONFIG names; None where it is unset (psrv.Worker
    outside a run); ValueError, in one line, where it is unreadable, not a config, or another mode's than
    PSRV_MODE's."""
    path = os.environ.get("PSRV_CONFIG", "").strip()
    if not path:
        return None
    try:
        config = from_dict(RunConfig, json.loads(Path(path).read_text()))
    except (OSError, ValueError) as exc:  # ConfigError is a ValueError, as is bad JSON
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise ValueError(f"PSRV_CONFIG {path}: {why}") from None
    mode = os.environ.get("PSRV_MODE", "").strip()
    if mode and config.mode != mode:
        raise ValueError(f"PSRV_MODE is {mode!r} but PSRV_CONFIG {path} is a {config.mode!r} run's; they must agree")
    return config


class TakesRunSettings(type):
    """psrv.Worker's metaclass. psrv.Worker(model, ...) under an all-reduce mode (PSRV_MODE ddp or zero1) is refused in
    one line that names psrv.make_worker (psrv/client/make.py). With PSRV_CONFIG set, it is called with the
    run's keywords (run_keywords) where the call gives none, and the worker's `settings_overridden` names each
    keyword the call gave that differs from the run's: {name: {"run": the config's value, "script": the one
    used}}, logged as a WARNING and kept in its record."""

    def __call__(cls, *args, **keywords):
        mode = allreduce_mode()
        if mode is not None:
            raise ValueError(f"psrv.Worker is the parameter-server worker, and this run all-reduces "
                             f"(PSRV_MODE={mode}): call psrv.make_worker(model), which is psrv.AllReduceWorker there "
                             "and psrv.Worker in a parameter-server mode")
        config = run_config_from_env()
        if config is None:
            return super().__call__(*args, **keywords)
        signature = inspect.signature(cls.__init__)
        given = call_keywords(signature, args, keywords)  # a TypeError as the constructor's own
        run = run_keywords(config, keyword_names(signature))
        if given.get("settings") is not None:  # the script's own settings, whole: the run's fill no worker setting
            mine = given["settings"]
            given = {**{k: getattr(mine, ALIASES.get(k, k)) for k in WORKER_KEYWORDS if k != "local_steps"}, **given}
        taken = {name: value for name, value in run.items() if name not in given}
        if "timeout" in taken and "timeout_option" not in given:
            taken["timeout_option"] = TIMEOUT_OPTION
        worker = super().__call__(*args, **keywords, **taken)
        overridden = {name: {"run": run[name], "script": given[name]} for name in sorted(run)
                      if name in given and given[name] != run[name]}
        if overridden:
            log.warning("worker %d: the script's own %s, not the run's config (%s)", worker.rank,
                        ", ".join(f"{name}={o['script']!r}" for name, o in overridden.items()),
                        ", ".join(f"{name}={o['run']!r}" for name, o in overridden.items()))
            worker.settings_overridden = overridden
        return worker
