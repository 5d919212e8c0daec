"""What an experiment folder's results were made from: each run's stored config (config.json) and its
hash, how two configs differ, keeping a replaced run aside, and which spec file a folder belongs to.

`psrv experiment` reuses a finished run only when its stored config is the one the spec now asks for
and the code it recorded (summary.json's "inputs": versions, a script's files; psrv/code_inputs.py) is
the code here now, and the report describes the runs from their stored configs, never from the spec's text.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from psrv import code_inputs
from psrv.config import ConfigError, RunConfig, from_dict, to_dict
from psrv.config.base import config_hash

SPEC_RECORD = "_spec-path.txt"  # starts with "_", so never a variant's directory (spec.py's name rule)


def stored_config(run: str | Path) -> RunConfig:
    """The config a run directory trained with, read back through the config tree from its config.json
    (a setting added to psrv since then reads as its default). ValueError saying why if there is none."""
    path = Path(run) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError("it has no stored config.json (an older psrv made it)") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"its config.json does not parse ({exc})") from None
    try:
        return from_dict(RunConfig, data)
    except ConfigError as exc:
        raise ValueError(f"its config.json is not a run config of this psrv ({exc})") from None


def flat(cfg: RunConfig) -> dict[str, Any]:
    """Every setting of `cfg` by dotted key (`optimizer.lr`), in the tree's order."""
    out: dict[str, Any] = {}

    def walk(prefix: str, table: dict[str, Any]) -> None:
        for key, value in table.items():
            if isinstance(value, dict):
                walk(f"{prefix}{key}.", value)
            else:
                out[prefix + key] = value
    walk("", to_dict(cfg))
    return out


def differences(old: RunConfig, new: RunConfig, *, ignore: tuple[str, ...] = ()) -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) of every setting that differs, in the tree's order."""
    a, b = flat(old), flat(new)
    return [(key, a[key], b[key]) for key in a if key not in ignore and a[key] != b[key]]


def show(value: Any) -> str:
    """A setting's value as a spec writes it: 0.05, "sgd", true, null, [0.9, 0.999]."""
    return json.dumps(value)


def describe(diffs: list[tuple[str, Any, Any]], *, between: str = " -> ", limit: int = 4) -> str:
    """'optimizer.lr 0.05 -> 0.5, job.steps 10 -> 20' (at most `limit` keys, then how many more)."""
    text = ", ".join(f"{key} {show(a)}{between}{show(b)}" for key, a, b in diffs[:limit])
    return text + (f" and {len(diffs) - limit} more" if len(diffs) > limit else "")


OUTPUT_KEYS = ("tensorboard", "mlflow")  # where results are also written: never a reason to train again


def trained(cfg: RunConfig) -> RunConfig:
    """`cfg` without the settings that only say where results also go (OUTPUT_KEYS)."""
    return cfg.replace(**{key: "" for key in OUTPUT_KEYS})


def why_changed(run: str | Path, wanted: RunConfig) -> str | None:
    """None when the run directory's stored config trains as `wanted` does (equal hashes once OUTPUT_KEYS
    are set aside) and the code its summary.json recorded is the code here now; else why it does not."""
    try:
        stored = stored_config(run)
    except ValueError as exc:
        return str(exc)
    if config_hash(trained(stored)) != config_hash(trained(wanted)):
        return f"its config changed ({describe(differences(stored, wanted, ignore=OUTPUT_KEYS))})"
    try:
        recorded = json.loads((Path(run) / "summary.json").read_text(encoding="utf-8")).get("inputs")
    except (OSError, ValueError, AttributeError):
        recorded = None
    return code_inputs.why_changed(recorded)


def keep_aside(run: str | Path) -> Path:
    """Move a run that is about to be redone to <run>.replaced-<its config hash>, where collect never looks;
    returns where it went."""
    run = Path(run)
    try:
        tag = config_hash(stored_config(run))
    except ValueError:
        tag = "noconfig"
    dest, n = run.with_name(f"{run.name}.replaced-{tag}"), 2
    while dest.exists():
        dest, n = run.with_name(f"{run.name}.replaced-{tag}-{n}"), n + 1
    run.rename(dest)
    return dest


def kept_runs(run: str | Path, wanted: RunConfig) -> list[Path]:
    """The runs kept aside from `run` whose stored config is `wanted` (to reuse when a spec changes back)."""
    run = Path(run)
    return [path for path in sorted(run.parent.glob(f"{run.name}.replaced-{config_hash(wanted)}*"))
            if path.is_dir() and why_changed(path, wanted) is None]


def default_out(spec_path: str | Path, profile: str | None = None) -> Path:
    """runs/<the spec file's name without .toml>, and -PROFILE run as a profile: a copied spec never shares the
    original's folder, nor a profile the spec's."""
    stem = Path(spec_path).stem
    return Path("runs") / (f"{stem}-{profile}" if profile else stem)


def recorded_specs(out: str | Path) -> list[Path]:
    """The spec files whose results `out` holds, as its _spec-path.txt records them (resolved paths)."""
    out = Path(out)
    try:
        lines = (out / SPEC_RECORD).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    return [(out.resolve() / line.strip()).resolve() for line in lines if line.strip()]


def claim(out: str | Path, spec_path: str | Path, *, chosen: bool) -> str | None:
    """Record in DIR/_spec-path.txt (paths relative to DIR) that `out` holds the results of `spec_path`.

    A folder that holds another spec file's results is refused with a ValueError, unless the user chose it
    (--out): then this returns a line to tell them that the folder mixes specs."""
    out, spec = Path(out), Path(spec_path).resolve()
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file, not a folder; pass --out DIR with a folder for the results")
    recorded = recorded_specs(out)
    others = [str(p) for p in recorded if p != spec]
    note = None
    if others and not chosen:
        raise ValueError(f"{out} holds the results of {others[0]}, not of {spec_path}; pass --out DIR to "
                         "write this spec's results into another folder")
    if others:
        note = (f"note: {out} also holds the results of {', '.join(others)}; a variant name both specs use "
                "is rerun whenever its config differs from this spec's (the old run kept aside)")
    if spec not in recorded:
        out.mkdir(parents=True, exist_ok=True)
        lines = [os.path.relpath(p, out.resolve()) for p in [*recorded, spec]]
        (out / SPEC_RECORD).write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return note
