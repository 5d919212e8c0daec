"""Experiment specs: shipped specs load, mistakes name their key and the allowed values."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.spec import (ExperimentSpec, FaultSpec, JobSpec, TargetSpec, VariantSpec,
                              load_spec)

SPECS = sorted((Path(__file__).resolve().parents[2] / "experiments" / "specs").glob("*.toml"))

BASE = """\
name = "t"
seeds = [0, 1]

[job]
name = "digits_mlp"
steps = 10

[optimizer]
name = "sgd"
lr = 0.1

[cluster]
workers = 2

[faults]
compute_ms = 5

[target]
eval_accuracy = 0.9

[[variants]]
mode = "sync"

[[variants]]
mode = "ssp"
staleness = 2

[[variants]]
mode = "async"
"""


def _load(tmp_path: Path, text: str) -> ExperimentSpec:
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return load_spec(path)


def _flags(argv: list[str]) -> dict[str, str]:
    assert len(argv) % 2 == 0 and all(a.startswith("--") for a in argv[::2]), argv
    return dict(zip(argv[::2], argv[1::2]))


def test_shipped_specs_exist() -> None:
    assert {p.name for p in SPECS} >= {"modes.toml", "stragglers.toml", "mnist1d.toml"}


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_shipped_spec_loads(path: Path) -> None:
    spec = load_spec(path)
    assert spec.variants and spec.repeats >= 1
    assert len({v.name for v in spec.variants}) == len(spec.variants)


def test_modes_spec_contents() -> None:
    spec = load_spec(SPECS[0].parent / "modes.toml")
    assert [v.name for v in spec.variants] == ["sync", "ssp-1", "ssp-2", "ssp-4", "async", "ddp"]
    assert spec.job == JobSpec(name="digits_mlp", steps=300, batch_size=32, eval_every=25)
    assert (spec.cluster.servers, spec.cluster.workers, spec.cluster.device) == (1, 2, "cpu")
    assert spec.target == TargetSpec(eval_loss=0.2) and spec.seeds == (0,)


def test_stragglers_spec_measures_both_straggler_models() -> None:
    spec = load_spec(SPECS[0].parent / "stragglers.toml")
    faults = {v.name: spec.faults_for(v) for v in spec.variants}
    assert faults["sync-transient"] == FaultSpec(compute_ms=20, transient_stragglers="0.1:4")
    assert faults["sync-persistent"] == FaultSpec(compute_ms=20, straggler="1:2")
    assert {v.mode for v in spec.variants} == {"sync", "ssp", "async"}
    assert {v.staleness for v in spec.variants if v.mode == "ssp"} == {2, 8}


def test_base_spec_loads(tmp_path: Path) -> None:
    spec = _load(tmp_path, BASE)
    assert [v.name for v in spec.variants] == ["sync", "ssp-2", "async"]
    assert spec.optimizer.lr == 0.1 and spec.faults.compute_ms == 5.0
    assert isinstance(spec.faults.compute_ms, float)


BAD = [  # (replace this, with that, every piece the message must contain)
    ("workers = 2", "wokers = 2", ["unknown key 'cluster.wokers'", "servers, workers, device, transport"]),
    ('mode = "async"', 'mode = "bsp"', ["variants[2].mode", "sync, async, ssp, ddp", "'bsp'"]),
    ("staleness = 2\n", "", ["variants[1].staleness", "required when mode = 'ssp'", ">= 0"]),
    ('mode = "sync"', 'mode = "sync"\nstaleness = 1', ["variants[0].staleness", "only allowed when mode = 'ssp'"]),
    ("steps = 10", "steps = -5", ["job.steps", "integer >= 1", "-5"]),
    ("steps = 10", "steps = 2.5", ["job.steps", "integer >= 1"]),
    ('mode = "async"', 'mode = "async"\nname = "sync"', ["variants[2].name", "duplicate", "unique"]),
    ('mode = "async"', 'mode = "async"\nname = "a/b"', ["variants[2].name", "A-Z a-z 0-9 _ . -"]),
    ("[target]\neval_accuracy = 0.9\n", "", ["target: required", "eval_loss, eval_accuracy"]),
    ("eval_accuracy = 0.9\n", "", ["target", "at least one of eval_loss, eval_accuracy"]),
    ("eval_accuracy = 0.9", "eval_accuracy = 1.5", ["target.eval_accuracy", "<= 1.0"]),
    ("staleness = 2", "stalenes = 2", ["variants[1].stalenes", "did you mean 'staleness'"]),
    ('name = "sgd"', 'name = "adamx"', ["optimizer.name", "sgd, adam, adamw"]),
    ('name = "sgd"\nlr = 0.1', 'name = "adam"\nlr = 0.1\nmomentum = 0.9', ["optimizer.momentum", "'sgd'"]),
    ("lr = 0.1", "lr = 0", ["optimizer.lr", "> 0.0"]),
    ("workers = 2", 'workers = 2\ntransport = "tcp"', ["cluster.transport", "zmq, rpc"]),
    ("workers = 2", 'workers = 2\ndevice = "gpu"', ["cluster.device", "cpu, cuda, cuda:N"]),
    ("compute_ms = 5", 'compute_ms = 5\nstraggler = "5:2"', ["faults.straggler", "0..1"]),
    ("compute_ms = 5", 'straggler = "1"', ["faults.straggler", "RANK:FACTOR"]),
    ('mode = "sync"', 'mode = "sync"\nfaults = { stragler = "1:2" }', ["variants[0].faults.stragler", "straggler"]),
    ('mode = "sync"', 'mode = "sync"\nfaults = { transient_stragglers = "2:4" }',
     ["variants[0].faults.transient_stragglers", "0 < P <= 1"]),
    ('mode = "async"', 'mode = "async"\nbackup_workers = 1', ["variants[2].backup_workers", "mode = 'sync'"]),
    ('mode = "sync"', 'mode = "sync"\nbackup_workers = 2', ["variants[0].backup_workers", "< cluster.workers"]),
    ('mode = "async"', 'mode = "ddp"\ntransport = "rpc"', ["variants[2].transport", "ddp"]),
    ("seeds = [0, 1]", "seeds = [0, 0]", ["seeds[1]", "unique"]),
    ("seeds = [0, 1]", "seeds = []", ["seeds", "at least one"]),
    ("seeds = [0, 1]", "seed = [0]", ["unknown key 'seed'", "did you mean 'seeds'", "variants"]),
    ('mode = "sync"', "", ["variants[0].mode: required", "sync, async, ssp, ddp"]),
]


@pytest.mark.parametrize(("old", "new", "expected"), BAD, ids=[c[2][0] for c in BAD])
def test_bad_spec_names_key_and_allowed_values(tmp_path: Path, old: str, new: str,
                                               expected: list[str]) -> None:
    assert old in BASE
    with pytest.raises(ValueError) as info:
        _load(tmp_path, BASE.replace(old, new, 1))
    message = str(info.value)
    assert message.startswith(str(tmp_path / "spec.toml"))
    for piece in expected:
        assert piece in message, message


def test_invalid_toml_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not valid TOML"):
        _load(tmp_path, "name = ")


def test_default_variant_names() -> None:
    names = [VariantSpec(mode="sync").name, VariantSpec(mode="sync", backup_workers=1).name,
             VariantSpec(mode="ssp", staleness=4).name, VariantSpec(mode="async").name,
             VariantSpec(mode="ddp").name, VariantSpec(mode="async", name="mine").name]
    assert names == ["sync", "sync-b1", "ssp-4", "async", "ddp", "mine"]


def test_runs_are_repeat_major(tmp_path: Path) -> None:
    spec = _load(tmp_path, BASE.replace("seeds = [0, 1]", "seeds = [7, 3]"))
    runs = [(v.name, seed, k) for v, seed, k in spec.runs()]
    assert runs == [("sync", 7, 0), ("ssp-2", 7, 0), ("async", 7, 0),
                    ("sync", 3, 1), ("ssp-2", 3, 1), ("async", 3, 1)]


def test_run_argv(tmp_path: Path) -> None:
    spec = _load(tmp_path, BASE)
    sync, ssp, asynchronous = spec.variants
    argv = spec.run_argv(sync, 1)
    assert "--out" not in argv
    assert _flags(argv) == {
        "--servers": "1", "--workers": "2", "--mode": "sync", "--backup-workers": "0",
        "--job": "digits_mlp", "--steps": "10", "--batch-size": "32", "--optimizer": "sgd",
        "--lr": "0.1", "--momentum": "0.0", "--weight-decay": "0.0", "--seed": "1",
        "--device": "cpu", "--transport": "zmq", "--eval-every": "25", "--compute-ms": "5.0",
        "--net-delay-ms": "0.0"}
    flags = _flags(spec.run_argv(ssp, 0))
    assert (flags["--mode"], flags["--staleness"]) == ("ssp", "2") and "--backup-workers" not in flags
    flags = _flags(spec.run_argv(asynchronous, 0))
    assert flags["--mode"] == "async" and "--staleness" not in flags


def test_run_argv_variant_overrides(tmp_path: Path) -> None:
    text = BASE.replace('name = "sgd"', 'name = "adam"').replace(
        'mode = "sync"', 'mode = "sync"\nbackup_workers = 1\ntransport = "rpc"\ndevice = "cuda:0"\n'
        'faults = { straggler = "1:2", transient_stragglers = "0.1:4" }')
    spec = _load(tmp_path, text)
    flags = _flags(spec.run_argv(spec.variants[0], 0))
    assert spec.variants[0].name == "sync-b1"
    assert flags["--backup-workers"] == "1" and flags["--transport"] == "rpc"
    assert flags["--device"] == "cuda:0" and flags["--optimizer"] == "adam"
    assert "--momentum" not in flags
    assert (flags["--straggler"], flags["--transient-stragglers"]) == ("1:2", "0.1:4")
    assert flags["--compute-ms"] == "5.0"  # the experiment's [faults], merged key by key
    other = _flags(spec.run_argv(spec.variants[1], 0))
    assert other["--transport"] == "zmq" and "--straggler" not in other


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_every_run_argv_parses_with_the_cli(path: Path) -> None:
    cli = pytest.importorskip("psrv.cli")
    parser = cli.build_parser()
    spec = load_spec(path)
    for variant, seed, _ in spec.runs():
        argv = ["run", *spec.run_argv(variant, seed), "--out", "x"]
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"psrv {' '.join(argv)} does not parse")
        assert getattr(args, "mode", variant.mode) == variant.mode
        assert getattr(args, "seed", seed) == seed
