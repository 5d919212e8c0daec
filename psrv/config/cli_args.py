"""Command-line options generated from the config tree: one option per setting, named, typed,
bounded and explained by the tree, so the command line can never disagree with a spec or a
launched process. Options a user did not give stay out of the namespace; the tree's defaults fill in.
"""
from __future__ import annotations

import argparse
import json
import types
import typing
from pathlib import Path
from typing import Any

from psrv.config.base import ConfigError, _plain_type, default_of, field_types, from_dict, leaves, merge

PREFIX = "config:"  # argparse dests of generated options: PREFIX + dotted key


def flag_of(key: str, setting) -> str:
    """The command-line spelling of a setting: --field-name unless the tree names another."""
    return "--" + (setting.flag or key.rsplit(".", 1)[-1].replace("_", "-"))


def _owner_doc(cls: type, key: str) -> str:
    """The first docstring line of the section a leaf belongs to (the --help group it is shown in)."""
    *path, name = key.split(".")
    for part in path:
        cls, _ = _plain_type(field_types(cls)[part])
    owner = next(c for c in cls.__mro__ if name in c.__dict__.get("__annotations__", {}))
    return (owner.__doc__ or owner.__name__).strip().splitlines()[0].rstrip(".")


def add_config_arguments(parser: argparse.ArgumentParser, cls: type, *, skip: tuple[str, ...] = ()) -> None:
    """One option per leaf of `cls` (except those with flag '' and the dotted keys in `skip`),
    in argument groups by section; `--help` shows each default as the tree has it."""
    groups: dict[str, Any] = {}
    for key, f, s in leaves(cls):
        if s.flag == "" or key in skip:
            continue
        doc = _owner_doc(cls, key)
        group = groups.setdefault(doc, parser.add_argument_group(doc))
        default = default_of(f)
        kind, _ = _plain_type(_leaf_hint(cls, key))
        options: dict[str, Any] = {"dest": PREFIX + key, "default": argparse.SUPPRESS}
        if kind is bool:
            options["action"] = "store_false" if default else "store_true"
            help_text = s.help
        else:
            options.update(type=_int_or_text if _is_union(kind) else kind, metavar=s.metavar or (None if s.choices else key.rsplit(".", 1)[-1].upper()))
            if s.choices:
                options["choices"] = s.choices
            shown = "''" if default == "" else default
            help_text = s.help if default is None else f"{s.help} (default: {shown})"
        group.add_argument(flag_of(key, s), help=help_text.replace("%", "%%"), **options)


def _is_union(kind: Any) -> bool:
    """A leaf typed like `int | str` (local_steps: H or 'auto:H'): its own check parses it."""
    return typing.get_origin(kind) in (typing.Union, types.UnionType)


def _int_or_text(value: str) -> int | str:
    return int(value) if value.strip().lstrip("-").isdigit() else value


def _leaf_hint(cls: type, key: str) -> Any:
    *path, name = key.split(".")
    for part in path:
        cls, _ = _plain_type(field_types(cls)[part])
    return field_types(cls)[name]


def given(ns: argparse.Namespace) -> dict[str, Any]:
    """The generated options a user gave, as a nested dict by dotted key."""
    out: dict[str, Any] = {}
    for dest, value in vars(ns).items():
        if dest.startswith(PREFIX):
            *path, name = dest[len(PREFIX):].split(".")
            table = out
            for part in path:
                table = table.setdefault(part, {})
            table[name] = value
    return out


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A config written by a run (config.json) or a launcher; ValueError naming the file otherwise."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"--config {path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--config {path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: must hold a JSON object")
    return data


def config_from_args(cls: type, ns: argparse.Namespace, *, base: dict[str, Any] | None = None,
                     extra: dict[str, Any] | None = None) -> Any:
    """Build `cls` from: its defaults, then `base` (e.g. a --config file), then the options given,
    then `extra` (values the command computed). A bad value raises ValueError naming its option."""
    data = merge(merge(base or {}, given(ns)), extra or {})
    try:
        return from_dict(cls, data)
    except ConfigError as err:
        raise ValueError(_said_as_flag(cls, err)) from None


def _said_as_flag(cls: type, err: ConfigError) -> str:
    for key, _, s in leaves(cls):
        if key == err.key and s.flag != "":
            return f"{flag_of(key, s)}: {err.detail}" if not err.unknown else str(err)
    return str(err)


def to_argv(cfg: Any) -> list[str]:
    """The command-line options that give `cfg` (those that differ from the tree's defaults): the one
    emitter of flags, so a command printed for a user parses back to the same config."""
    cls = type(cfg)
    argv: list[str] = []
    for key, f, s in leaves(cls):
        value = _get(cfg, key)
        default = default_of(f)
        if value == default or (default is None and _resolves_to(cls, cfg, key, value)):
            continue
        if s.flag == "":
            raise ValueError(f"{key} has no command-line option; pass the whole config with --config FILE")
        flag = flag_of(key, s)
        if isinstance(value, bool):
            argv.append(flag)
        else:
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]
    return argv


def _get(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _resolves_to(cls: type, cfg: Any, key: str, value: Any) -> bool:
    """Whether the setting at `key`, left to its default, resolves to `value` (False where the config
    without it is refused: another setting needs it said, as inner_lr needs an inner_optimizer)."""
    try:
        return _get(_without(cls, cfg, key), key) == value
    except ConfigError:
        return False


def _without(cls: type, cfg: Any, key: str) -> Any:
    """`cfg` rebuilt with the setting at `key` left to its default (to see what the default resolves to)."""
    from psrv.config.base import to_dict
    data = to_dict(cfg)
    *path, name = key.split(".")
    table = data
    for part in path:
        table = table[part]
    del table[name]
    return from_dict(cls, data)
