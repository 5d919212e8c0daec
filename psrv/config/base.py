"""The machinery of the config tree: a setting declared once (type, default, bounds, help, flag) and
checked with a dotted-key error; sections built from dicts (TOML, JSON) and written back to them.

A `Section` is a frozen, keyword-only dataclass whose fields are `setting(...)`s or nested sections.
Everything a user can set is declared here, once: the command line (psrv/config/cli_args.py), the
spec keys (experiments/harness/spec.py) and the JSON a launched process reads are all generated from it.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any


class ConfigError(ValueError):
    """A bad setting; `key` is its dotted path in the tree, e.g. ``optimizer.momentum``."""

    def __init__(self, key: str, detail: str, *, unknown: bool = False, source: str = ""):
        self.key, self.detail, self.unknown, self.source = key, detail, unknown, source
        text = f"unknown key '{key}'{detail}" if unknown else f"{key}: {detail}" if key else detail
        super().__init__(f"{source}: {text}" if source else text)

    def under(self, prefix: str) -> ConfigError:
        """The same error, its key seen from one table further out."""
        key = f"{prefix}.{self.key}" if prefix and self.key else prefix or self.key
        return ConfigError(key, self.detail, unknown=self.unknown, source=self.source)

    def within(self, source: str) -> ConfigError:
        """The same error, said of a file."""
        return ConfigError(self.key, self.detail, unknown=self.unknown, source=source)


@dataclass(frozen=True)
class Setting:
    """What the tree knows of one leaf: its help, its flag, and how a value is checked."""

    help: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    above: bool = False               # minimum is exclusive
    check: Callable[[Any], Any] | None = None  # extra check: raises ValueError(detail), may return a new value
    flag: str | None = None           # command-line name; None: --field-name; "" : not on the command line
    metavar: str | None = None


def setting(default: Any = MISSING, help: str = "", **meta: Any) -> Any:
    """A leaf of the tree: `lr: float = setting(0.05, "learning rate", above=True, minimum=0)`."""
    return field(default=default, metadata={"setting": Setting(help=help, **meta)})


def defaults_of(cls: type) -> Any:
    """A section's defaults by name, for a library face that repeats them as keywords (psrv.Worker,
    PSClient): the section stays their one source, so the two cannot drift apart."""
    import types
    return types.SimpleNamespace(**{f.name: f.default for f in dataclasses.fields(cls) if f.default is not MISSING})


def section(cls: type) -> Any:
    """A nested section, built from its own defaults."""
    return field(default_factory=cls)


def leaf_setting(f: dataclasses.Field) -> Setting | None:
    return f.metadata.get("setting")


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """A section's field types, resolved once per class (its annotations are strings)."""
    return typing.get_type_hints(cls)


@functools.cache
def _plain_type(hint: Any) -> tuple[Any, bool]:
    """(the type, whether None is allowed) of an annotation like `float | None`; once per annotation (a run's
    config tree checks about 150 leaves, each time a section is built or replaced)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return hint, False


@functools.cache
def _origin(kind: Any) -> Any:
    return typing.get_origin(kind)


def coerce(key: str, hint: Any, value: Any) -> Any:
    """`value` as type `hint`, from TOML/JSON/argparse: int -> float, list -> tuple; else ConfigError."""
    kind, optional = _plain_type(hint)
    if value is None and optional:
        return None
    if _origin(kind) is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"must be a list; got {value!r}")
        inner = typing.get_args(kind)
        each = inner[0] if len(inner) == 2 and inner[1] is Ellipsis else None
        if each is None and len(inner) != len(value):
            raise ConfigError(key, f"must be a list of {len(inner)} values; got {value!r}")
        return tuple(coerce(f"{key}[{i}]", each or inner[i], v) for i, v in enumerate(value))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is bool and not isinstance(value, bool) or kind is not bool and isinstance(value, bool) \
            or isinstance(kind, type) and not isinstance(value, kind):
        name = {float: "a number", int: "an integer", bool: "true or false", str: "a string"}.get(kind, str(kind))
        raise ConfigError(key, f"must be {name}; got {value!r}")
    return value


def _check_leaf(name: str, s: Setting, value: Any) -> Any:
    if s.choices is not None and value not in s.choices:
        raise ConfigError(name, f"must be one of {', '.join(s.choices)}; got {value!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(name, f"must be a finite number; got {value!r}")
        low_bad = s.minimum is not None and (value <= s.minimum if s.above else value < s.minimum)
        if low_bad or (s.maximum is not None and value > s.maximum):
            bound = [f"{'>' if s.above else '>='} {s.minimum:g}"] if s.minimum is not None else []
            bound += [f"<= {s.maximum:g}"] if s.maximum is not None else []
            raise ConfigError(name, f"must be {' and '.join(bound)}; got {value!r}")
    if s.check is not None:
        try:
            checked = s.check(value)
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(name, str(exc)) from None
        if checked is not None:
            value = checked
    return value


@functools.cache
def _leaves(cls: type) -> tuple[tuple[str, Any, Setting], ...]:
    """A section's leaves as (name, annotation, Setting), once per class."""
    hints = field_types(cls)
    return tuple((f.name, hints[f.name], s) for f in fields(cls) if (s := leaf_setting(f)) is not None)


class Section:
    """Checks each leaf (type, choices, bounds, its own check), then the section's `validate()`."""

    def __post_init__(self) -> None:
        for name, hint, s in _leaves(type(self)):
            value = coerce(name, hint, getattr(self, name))
            if value is not None:
                value = _check_leaf(name, s, value)
            object.__setattr__(self, name, value)
        self.validate()

    def validate(self) -> None:
        """Checks across fields, for subclasses; raise ConfigError(key, detail)."""

    def replace(self, **changes: Any):
        """A copy with `changes`, checked again."""
        return dataclasses.replace(self, **changes)


def is_section(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, Section)


def from_dict(cls: type, data: Mapping[str, Any], *, where: str = "") -> Any:
    """Build section `cls` from nested dicts; unknown keys and bad values raise ConfigError with the
    dotted key (and a "did you mean" for a near miss)."""
    if not isinstance(data, Mapping):
        raise ConfigError(where, f"must be a table; got {data!r}")
    hints = field_types(cls)
    known = {f.name: f for f in fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{where}.{key}" if where else key, f"{hint}; allowed: {', '.join(known)}",
                              unknown=True)
        kind, _ = _plain_type(hints[key])
        kwargs[key] = from_dict(kind, value, where=f"{where}.{key}" if where else key) \
            if is_section(kind) else value
    missing = [f.name for f in known.values() if f.default is MISSING and f.default_factory is MISSING
               and f.name not in kwargs]
    if missing:
        raise ConfigError(f"{where}.{missing[0]}" if where else missing[0], "required")
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise err.under(where) from None


def to_dict(obj: Any) -> dict[str, Any]:
    """The section as nested plain dicts (tuples as lists): what a run directory stores as JSON."""
    out = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        out[f.name] = to_dict(value) if isinstance(value, Section) else \
            list(value) if isinstance(value, tuple) else value
    return out


def config_hash(section: Section) -> str:
    """The identity of a resolved config: the first 16 hex digits of the sha256 of its sorted-keys JSON
    (`to_dict`). Equal hashes, equal settings; a run directory records its run's hash."""
    text = json.dumps(to_dict(section), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` laid on `base`, table by table (a variant's keys over the experiment's)."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) \
            else value
    return out


def leaves(cls: type, prefix: str = "") -> list[tuple[str, dataclasses.Field, Setting]]:
    """Every (dotted key, field, setting) of section `cls`, depth first, in declaration order."""
    hints = field_types(cls)
    out = []
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        kind, _ = _plain_type(hints[f.name])
        if is_section(kind):
            out += leaves(kind, key + ".")
        elif leaf_setting(f) is not None:
            out.append((key, f, leaf_setting(f)))
    return out


def default_of(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default  # type: ignore[misc]
