"""What a run directory was made from: config hashes, what changed, keeping a run aside, which spec file
a folder belongs to, and a report built from the runs' stored configs rather than the spec's text."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from psrv.experiments.harness.collect import collect, read_csv, run_dir
from psrv.experiments.launcher.launch import write_config
from psrv.experiments.launcher.provenance import claim, default_out, keep_aside, stored_config, why_changed
from psrv.experiments.harness.report import write_report
from psrv.experiments.harness.spec import ExperimentSpec, load_spec, spec_from_dict
from psrv.config import RunConfig, from_dict, to_dict
from psrv.code_inputs import code_inputs
from psrv.config.base import config_hash
from tests.unit.test_report import VERSIONS, _fabricate

SPECS = sorted(p for p in (Path(__file__).resolve().parents[2] / "experiments" / "specs").glob("*.toml")
               if not p.name.startswith("simulate_"))  # psrv simulate's specs: tests/unit/test_simulate.py


def _spec(lr: float = 0.05, **job) -> ExperimentSpec:
    return spec_from_dict({"name": "fab", "job": {"name": "digits_mlp", "steps": 3, "eval_every": 1, **job},
                           "optimizer": {"lr": lr}, "target": {"eval_accuracy": 0.9}, "seeds": [0, 1],
                           "variants": [{"mode": "sync"}, {"mode": "async"}]})


def _store(out: Path, spec: ExperimentSpec, variant: str, repeat: int) -> None:
    write_config(run_dir(out, variant, repeat) / "config.json",
                 spec.run_config(spec.variant(variant), spec.seeds[repeat]))


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_the_hash_of_every_shipped_run_survives_config_json(path: Path) -> None:
    spec = load_spec(path)
    hashes = set()
    for variant, seed, _ in spec.runs():
        cfg = spec.run_config(variant, seed)
        again = from_dict(RunConfig, json.loads(json.dumps(to_dict(cfg))))
        assert config_hash(again) == config_hash(cfg) and len(config_hash(cfg)) == 16
        hashes.add(config_hash(cfg))
    assert len(hashes) == len(spec.variants) * spec.repeats  # every run is told apart


def _summary(run: Path, inputs: dict | None) -> None:
    (run / "summary.json").write_text(json.dumps({"complete": True, "inputs": inputs}))


def test_why_changed_names_the_keys(tmp_path: Path) -> None:
    cfg = _spec().run_config(_spec().variant("sync"), 0)
    write_config(tmp_path / "config.json", cfg)
    _summary(tmp_path, code_inputs())
    assert stored_config(tmp_path) == cfg and why_changed(tmp_path, cfg) is None
    # where results also go (OUTPUT_KEYS) is no reason to train again
    assert why_changed(tmp_path, cfg.replace(tensorboard="tb", mlflow="sqlite:///runs/mlflow.db")) is None
    changed = _spec(lr=0.5, steps=4)
    new = changed.run_config(changed.variant("sync"), 1)
    assert why_changed(tmp_path, new) == "its config changed (seed 0 -> 1, job.steps 3 -> 4, optimizer.lr 0.05 -> 0.5)"
    (tmp_path / "config.json").unlink()
    assert why_changed(tmp_path, cfg) == "it has no stored config.json (an older psrv made it)"
    (tmp_path / "config.json").write_text('{"optimizer": {"lr": 0.05}, "gpus": 2}')
    assert "not a run config of this psrv (unknown key 'gpus'" in why_changed(tmp_path, cfg)


def test_a_run_whose_code_changed_is_not_reused_and_the_reason_names_it(tmp_path: Path) -> None:
    cfg = _spec().run_config(_spec().variant("sync"), 0)
    write_config(tmp_path / "config.json", cfg)
    _summary(tmp_path, None)
    assert why_changed(tmp_path, cfg) == "it recorded no code inputs (an older psrv made it)"
    helper = tmp_path / "helper.py"
    helper.write_text("NOISE = 0.1\n")
    inputs = code_inputs()
    inputs["files"][str(helper)] = hashlib.sha256(helper.read_bytes()).hexdigest()
    _summary(tmp_path, inputs)
    assert why_changed(tmp_path, cfg) is None
    helper.write_text("NOISE = 0.5\n")
    assert why_changed(tmp_path, cfg) == f"{helper} changed since it ran"
    helper.unlink()
    assert why_changed(tmp_path, cfg) == f"{helper} is gone"
    inputs["versions"]["torch"] = "0.0.1"
    del inputs["files"][str(helper)]
    _summary(tmp_path, inputs)
    assert why_changed(tmp_path, cfg) == f"versions changed (torch 0.0.1 -> {code_inputs()['versions']['torch']})"


def test_keep_aside_never_overwrites(tmp_path: Path) -> None:
    cfg = _spec().run_config(_spec().variant("sync"), 0)
    for expected in (f"rep-0.replaced-{config_hash(cfg)}", f"rep-0.replaced-{config_hash(cfg)}-2"):
        run = tmp_path / "rep-0"
        run.mkdir()
        write_config(run / "config.json", cfg)
        assert keep_aside(run) == tmp_path / expected and not run.exists()
    (tmp_path / "rep-0").mkdir()
    assert keep_aside(tmp_path / "rep-0").name == "rep-0.replaced-noconfig"


def test_a_folder_belongs_to_one_spec_file(tmp_path: Path) -> None:
    assert default_out("experiments/specs/modes.toml") == Path("runs/modes")
    out, mine, other = tmp_path / "runs" / "x", tmp_path / "x.toml", tmp_path / "b" / "x.toml"
    assert claim(out, mine, chosen=False) is None and claim(out, mine, chosen=False) is None
    assert (out / "_spec-path.txt").read_text() == "../../x.toml\n"
    with pytest.raises(ValueError, match=f"^{out} holds the results of {mine}, not of {other}; pass --out DIR"):
        claim(out, other, chosen=False)
    assert claim(out, other, chosen=True).startswith(f"note: {out} also holds the results of {mine};")
    assert (out / "_spec-path.txt").read_text().split() == ["../../x.toml", "../../b/x.toml"]
    with pytest.raises(ValueError, match="is a file, not a folder"):
        claim(out / "_spec-path.txt", mine, chosen=True)


def test_the_report_says_what_was_run_not_what_the_spec_says(tmp_path: Path) -> None:
    _fabricate(tmp_path)  # runs made with lr 0.1 ...
    ran = _spec(lr=0.1)
    for variant, _, repeat in ran.runs():
        _store(tmp_path, ran, variant.name, repeat)
    spec = _spec(lr=0.5)  # ... reported against a spec that now says 0.5
    collect(tmp_path, spec)
    text = write_report(tmp_path, spec, spec_path="fab.toml", versions=VERSIONS).read_text()
    assert "- Optimizer: sgd, lr 0.1, momentum 0.9, weight decay 0" in text
    assert "lr 0.5" not in text and "--lr 0.5" not in text and "--lr 0.1 " in text
    assert "## The runs disagree" in text
    assert ("- `sync` rep-0 was run with another config than the spec's: optimizer.lr 0.1 -> 0.5 "
            "(stored -> spec)") in text
    assert f"psrv run --config {tmp_path}/sync/rep-0/config.json" in text
    rows = read_csv(tmp_path / "runs.csv")
    assert [r["config_hash"] for r in rows] == [config_hash(ran.run_config(v, s)) for v, s, _ in
                                                sorted(ran.runs(), key=lambda r: r[0].name != "sync")]


def test_the_report_names_runs_that_disagree_with_each_other(tmp_path: Path) -> None:
    _fabricate(tmp_path)
    spec = _spec()
    (run_dir(tmp_path, "sync", 1) / "config.json").unlink()  # as an older psrv left it
    _store(tmp_path, _spec(lr=0.1), "async", 0)             # async at another lr than sync ...
    _store(tmp_path, _spec(lr=0.1, steps=4), "async", 1)    # ... and its repeats differ beyond the seed
    collect(tmp_path, spec)
    text = write_report(tmp_path, spec, spec_path="fab.toml", versions=VERSIONS).read_text()
    assert ("- Optimizer: **differs between runs**: sgd, lr 0.05, momentum 0.9, weight decay 0 (`sync`); "
            "sgd, lr 0.1, momentum 0.9, weight decay 0 (`async`)") in text
    assert "- Job: **differs between runs**: " in text and "(`async` rep-1)" in text
    assert "- `async` rep-1 differs from rep-0 in more than the seed: job.steps 3 -> 4" in text
    assert "- `sync` rep-1: it has no stored config.json (an older psrv made it); its settings are unknown" in text


def test_a_consistent_folder_says_so_and_extra_repeats_are_left_out(tmp_path: Path) -> None:
    _fabricate(tmp_path)
    spec = _spec()
    for variant, _, repeat in spec.runs():
        _store(tmp_path, spec, variant.name, repeat)
    (run_dir(tmp_path, "sync", 2)).mkdir()  # a third repeat from when the spec had three seeds
    for name in ("summary.json", "steps.csv", "evals.csv"):
        (run_dir(tmp_path, "sync", 2) / name).write_bytes((run_dir(tmp_path, "sync", 1) / name).read_bytes())
    assert collect(tmp_path, spec)[0].repeats == 2
    text = write_report(tmp_path, spec, spec_path="fab.toml", versions=VERSIONS).read_text()
    assert "all finished runs (4) are the spec's" in text and "disagree" not in text
    assert "- Repeats: 2 per variant (seeds 0, 1)" in text
