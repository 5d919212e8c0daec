"""psrv.Worker's and PSClient's worker settings passed whole: a WorkerSettings (psrv/config/worker_settings.py, where
each setting is declared, checked and described once) with the keywords a call gives by name laid over it and
checked there, in the config tree's one-line errors. `timeout` is request_timeout's keyword; psrv.Worker's
`local_steps` (None: off) turns local steps on by itself, since the caller's own optimizer takes the inner steps."""
from __future__ import annotations

import dataclasses
import difflib
import inspect
from typing import Any, Iterable

from psrv.config.base import ConfigError
from psrv.config.worker_settings import WorkerSettings

ALIASES = {"timeout": "request_timeout"}  # keyword -> setting
_LOOP_ONLY = ("inner_optimizer", "inner_lr")  # the shipped loop's own: a script's optimizer is the script's
WORKER_KEYWORDS = tuple({v: k for k, v in ALIASES.items()}.get(f.name, f.name)
                        for f in dataclasses.fields(WorkerSettings) if f.name not in _LOOP_ONLY)
CLIENT_KEYWORDS = ("timeout", "wire_dtype", "compress", "error_feedback", "error_feedback_decay", "compress_min_numel",
                   "momentum_correction", "momentum_masking", "compress_warmup", "sign_scale", "push_chunk_mb", "compress_pull",
                   "pull_error_feedback", "pull_resync", "pull_in_place")  # what PSClient reads


def default_of(keyword: str) -> Any:
    """A settings keyword's value when the call leaves it out (local_steps: None, off)."""
    if keyword == "local_steps":
        return None
    return getattr(WorkerSettings(), ALIASES.get(keyword, keyword))


def _checked_names(keywords: dict, allowed: Iterable[str], who: str) -> None:
    allowed = tuple(allowed)
    for name in keywords:
        if name not in allowed:
            close = difflib.get_close_matches(name, allowed, n=1)
            raise TypeError(f"{who}() got an unexpected keyword argument {name!r}" +
                            (f" (did you mean {close[0]!r}?)" if close else ""))


def overlaid(settings: WorkerSettings | None, keywords: dict, *, who: str,
             allowed: Iterable[str] = WORKER_KEYWORDS) -> WorkerSettings:
    """`settings` (None: the defaults) with `keywords` over it, checked by the config tree: a ConfigError (a
    ValueError) naming the keyword; a TypeError for a keyword that is no setting of `who`'s."""
    _checked_names(keywords, allowed, who)
    if settings is None:
        settings = WorkerSettings()
    elif not isinstance(settings, WorkerSettings):
        raise TypeError(f"{who}(settings=...) takes a psrv.config WorkerSettings; got {type(settings).__name__}")
    changes = {ALIASES.get(k, k): v for k, v in keywords.items()}
    if "local_steps" in changes:  # the caller's optimizer steps: no inner optimizer of the shipped loop's
        steps = changes.pop("local_steps")
        changes.update(local_steps=1 if steps is None else steps, inner_optimizer=None, inner_lr=None)
    try:
        return dataclasses.replace(settings, **changes)
    except ConfigError as err:
        said = "timeout" if err.key == "request_timeout" and "timeout" in keywords else err.key
        raise ConfigError(said, err.detail) from None


def local_steps_of(settings: WorkerSettings, keywords: dict) -> int | str | None:
    """psrv.Worker's H: the `local_steps` keyword where given (None: off), else the settings' where they step
    local updates; None: every step pushes its gradient."""
    if "local_steps" in keywords:
        return None if keywords["local_steps"] is None else settings.local_steps
    return settings.local_steps if settings.local_updates else None


def client_settings(settings: WorkerSettings, local_steps: int | str | None) -> WorkerSettings:
    """What the worker's client pushes with: one fragment of local steps goes through the client's own codec
    (outer_dtype bfloat16 as the wire dtype; int8 and fp4 as the codec, without error feedback, over every
    tensor, small ones too); otherwise the settings' own codec. The local-step fields are the worker's, not
    the client's."""
    plain = {"local_steps": 1, "inner_optimizer": None, "inner_lr": None, "fragments": 1, "outer_dtype": "float32",
             "pull_extrapolate": 0.0}
    outer = settings.outer_dtype if local_steps is not None and settings.fragments == 1 else "float32"
    if outer == "bfloat16":
        plain["wire_dtype"] = "bfloat16"
    elif outer != "float32":
        plain.update(compress=outer, error_feedback=False, compress_min_numel=0)
    return dataclasses.replace(settings, **plain)


def call_keywords(signature: inspect.Signature, args: tuple, keywords: dict) -> dict:
    """psrv.Worker(*args, **keywords)'s arguments by name, its settings keywords among them, bound as its
    constructor (`signature`, with self) binds them: a TypeError as the constructor's own."""
    bound = dict(signature.bind(None, *args, **keywords).arguments)
    bound.pop("self", None)
    var = [p.name for p in signature.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    overrides = bound.pop(var[0], {}) if var else {}
    return {**bound, **overrides}


def keyword_names(signature: inspect.Signature) -> list[str]:
    """Every keyword psrv.Worker takes by name: its constructor's own and the worker settings'."""
    own = [p.name for p in signature.parameters.values()
           if p.name not in ("self", "model") and p.kind is not inspect.Parameter.VAR_KEYWORD]
    return [*own, *WORKER_KEYWORDS]


def keyword_default(signature: inspect.Signature, name: str) -> Any:
    """The value psrv.Worker's keyword `name` has when a call leaves it out."""
    parameter = signature.parameters.get(name)
    return parameter.default if parameter is not None else default_of(name)
