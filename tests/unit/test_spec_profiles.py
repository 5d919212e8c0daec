"""A spec's profiles: the same variants on another job (`psrv experiment SPEC --profile NAME`)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from psrv.cli import build_parser
from psrv.config import ConfigError, RunConfig
from psrv.config.cli_args import config_from_args, to_argv
from psrv.experiments.launcher.provenance import default_out
from psrv.experiments.harness.spec import load_spec, profile_names

SPECS = Path(__file__).resolve().parents[2] / "experiments" / "specs"

SPEC = """\
name = "t"
seeds = [0, 1, 2]

[job]
name = "synthetic_mlp"
steps = 6

[optimizer]
name = "sgd"
lr = 0.05
momentum = 0.0

[network]
bandwidth = "200mbit"

[target]
eval_loss = 2.25

[[variants]]
name = "dense"
mode = "sync"

[[variants]]
name = "sign"
mode = "sync"
worker = { compress = "sign" }

[[variants]]
name = "local"
mode = "sync"
job = { steps = 40 }
worker = { local_steps = 20 }

[profiles.digits]
description = "on digits"
only = ["dense", "local"]
job = { name = "digits_cnn", steps = 300 }
optimizer = { lr = 0.2 }
network = { bandwidth = "" }
target = { eval_accuracy = 0.9 }

[profiles.digits.variant.local]
job = { steps = 300 }
"""


def _write(tmp_path: Path, text: str = SPEC) -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return path


def test_a_profile_lays_its_keys_over_the_spec_and_each_variant(tmp_path: Path) -> None:
    plain, digits = load_spec(_write(tmp_path)), load_spec(_write(tmp_path), "digits")
    assert [v.name for v in plain.variants] == ["dense", "sign", "local"]
    assert [v.name for v in digits.variants] == ["dense", "local"]  # `only`
    assert (plain.name, digits.name, digits.description) == ("t", "t-digits", "on digits")
    dense, local = digits.variants
    assert (dense.config.job.name, dense.config.job.steps, dense.config.optimizer.lr) == ("digits_cnn", 300, 0.2)
    assert dense.config.optimizer.momentum == 0.0  # the spec's own keys stay where the profile gives none
    assert dense.config.network.bandwidth == "" and plain.variants[0].config.network.bandwidth == "200mbit"
    assert local.config.job.steps == 300 and plain.variants[2].config.job.steps == 40  # variant.local
    assert local.config.worker.local_steps == 20 and local.config.job.name == "digits_cnn"
    assert digits.target.eval_accuracy == 0.9 and digits.target.eval_loss is None
    assert plain.target.eval_loss == 2.25
    assert digits.seeds == plain.seeds


def test_a_profile_has_a_folder_of_its_own() -> None:
    assert default_out("experiments/specs/network.toml") == Path("runs/network")
    assert default_out("experiments/specs/network.toml", "code_lm") == Path("runs/network-code_lm")


@pytest.mark.parametrize("old,new,message", [
    ('only = ["dense", "local"]', 'only = ["dense", "lokal"]', "no variant 'lokal'"),
    ('only = ["dense", "local"]', 'only = "dense"', "a list of variant names"),
    ('[profiles.digits.variant.local]', '[profiles.digits.variant.lokal]', "variant.lokal"),
    ('description = "on digits"', 'descripton = "on digits"', "did you mean 'description'"),
    ('[profiles.digits.variant.local]\njob', '[profiles.digits.variant.local]\njobb', "did you mean 'job'"),
    ('job = { name = "digits_cnn", steps = 300 }', 'job = { name = "digits_cnn", steps = -1 }', "steps"),
])
def test_a_bad_profile_is_one_error_naming_its_key(tmp_path: Path, old: str, new: str, message: str) -> None:
    assert old in SPEC
    path = _write(tmp_path, SPEC.replace(old, new))
    with pytest.raises(ConfigError, match="spec.toml") as err:
        load_spec(path, "digits")
    assert message in str(err.value)
    if "steps = -1" not in new:  # the spec without a profile does not read profiles' keys
        load_spec(path)


def test_an_unknown_profile_names_the_spec_s_profiles(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no profile 'digitz'; this spec's profiles: digits"):
        load_spec(_write(tmp_path), "digitz")
    with pytest.raises(ConfigError, match="no profile 'digits'; this spec's profiles: none"):
        load_spec(_write(tmp_path, SPEC.split("[profiles.digits]")[0]), "digits")


def _shipped_profiles() -> list[tuple[Path, str]]:
    return [(path, name) for path in sorted(SPECS.glob("*.toml")) if not path.name.startswith("simulate_")
            for name in profile_names(tomllib.loads(path.read_text()))]


def test_the_network_spec_has_its_quality_profiles() -> None:
    assert {name for path, name in _shipped_profiles() if path.name == "network.toml"} >= {"digits_cnn", "code_lm"}


@pytest.mark.parametrize("path,profile", _shipped_profiles(), ids=lambda x: getattr(x, "name", x))
def test_every_shipped_profile_loads_and_its_runs_parse_back(path: Path, profile: str) -> None:
    spec, parser = load_spec(path, profile), build_parser()
    assert spec.repeats >= 3 and spec.variants
    for variant, seed, _ in spec.runs():
        args = parser.parse_args(["run", *to_argv(spec.run_config(variant, seed)), "--out", "x"])
        assert config_from_args(RunConfig, args) == spec.run_config(variant, seed)
