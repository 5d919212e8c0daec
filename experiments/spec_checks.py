"""Value checks for experiment specs: SpecError names the dotted key and the allowed values."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import MISSING, field, fields
from typing import Any


class SpecError(ValueError):
    """A bad spec value; `key` is its dotted path, e.g. ``variants[2].mode``."""

    def __init__(self, key: str, detail: str, *, unknown: bool = False, source: str = ""):
        self.key, self.detail, self.unknown, self.source = key, detail, unknown, source
        text = f"unknown key '{key}'{detail}" if unknown else f"{key}: {detail}" if key else detail
        super().__init__(f"{source}: {text}" if source else text)

    def under(self, prefix: str) -> SpecError:
        """The same error, with its key seen from one table further out."""
        key = f"{prefix}.{self.key}" if self.key else prefix
        return SpecError(key, self.detail, unknown=self.unknown, source=self.source)


def _int(key: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(key, f"must be an integer >= {minimum}; got {value!r}")
    return value


def _float(key: str, value: Any, *, minimum: float = 0.0, maximum: float = math.inf,
           above: bool = False) -> float:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value > maximum or \
            (value <= minimum if above else value < minimum):
        bound = (f"> {minimum}" if above else f">= {minimum}") + \
            (f" and <= {maximum}" if math.isfinite(maximum) else "")
        raise SpecError(key, f"must be a number {bound}; got {value!r}")
    return float(value)  # TOML `lr = 1` is stored as 1.0


def _choice(key: str, value: Any, *, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise SpecError(key, f"must be one of {', '.join(allowed)}; got {value!r}")
    return value


def _match(key: str, value: Any, *, regex: str, allowed: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(regex, value):
        raise SpecError(key, f"must be {allowed}; got {value!r}")
    return value


def _checked(check: Callable[..., Any], default: Any = MISSING, **bounds: Any) -> Any:
    """A dataclass field that __post_init__ validates with check(key, value, **bounds)."""
    return field(default=default, metadata={"check": functools.partial(check, **bounds)})


_DEVICE = {"regex": r"cpu|cuda(:[0-9]+)?", "allowed": "one of cpu, cuda, cuda:N"}


class _Checked:
    """Runs each field's check (skipping optional fields left at None), then _validate."""

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if "check" in f.metadata and not (value is None and f.default is None):
                object.__setattr__(self, f.name, f.metadata["check"](f.name, value))
        self._validate()

    def _validate(self) -> None:
        """Checks across fields, for subclasses."""


def parse_straggler(text: str, key: str = "straggler") -> tuple[int, float] | None:
    """'RANK:FACTOR' -> (rank, factor); '' -> None. Raises SpecError."""
    if text == "":
        return None
    try:
        rank, factor = text.split(":")
        parsed = int(rank), float(factor)
        ok = parsed[0] >= 0 and 1.0 <= parsed[1] < math.inf
    except (AttributeError, ValueError):
        ok = False
    if not ok:
        raise SpecError(key, "must be 'RANK:FACTOR' with RANK >= 0 and FACTOR >= 1 (e.g. '1:2'), "
                             f"or '' for none; got {text!r}")
    return parsed


def parse_transient(text: str, key: str = "transient_stragglers") -> tuple[float, float] | None:
    """'P:FACTOR' -> (probability, factor); '' -> None. Raises SpecError."""
    if text == "":
        return None
    try:
        prob, factor = (float(part) for part in text.split(":"))
        ok = 0.0 < prob <= 1.0 and 1.0 <= factor < math.inf
    except (AttributeError, ValueError):
        ok = False
    if not ok:
        raise SpecError(key, "must be 'P:FACTOR' with 0 < P <= 1 and FACTOR >= 1 (e.g. '0.1:4'), "
                             f"or '' for none; got {text!r}")
    return prob, factor


def _parses(key: str, value: Any, *, parse: Callable[[str, str], Any]) -> str:
    parse(value, key)
    return value
