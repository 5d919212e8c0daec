"""A spec whose [job] names a script: the script is part of each run's config (its sha256 too), so an
edited script is another config; what a script's run cannot use is refused, naming the key."""
from __future__ import annotations

import json

import pytest

from psrv.code_inputs import code_inputs
from psrv.config import ConfigError
from psrv.config.base import config_hash
from psrv.experiments.launcher.provenance import why_changed
from psrv.experiments.launcher.launch import write_config
from psrv.experiments.harness.spec import spec_from_dict


def _spec(tmp_path, job: dict, variants=({"mode": "sync"}, {"mode": "ssp", "staleness": 2}), **top) -> dict:
    return {"name": "s", "seeds": [0, 1], "job": job, "target": {"eval_accuracy": 0.5},
            "variants": [dict(v) for v in variants], **top}


@pytest.fixture
def script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a script's path is found from the current folder, as --script's is
    (tmp_path / "train.py").write_text("print('v1')\n")
    return "train.py"


def test_a_script_in_a_spec_is_in_every_runs_config_with_its_hash(tmp_path, script):
    spec = spec_from_dict(_spec(tmp_path, {"script": script, "script_args": ["--width", "8"], "steps": 40}))
    for variant in spec.variants:
        job = spec.run_config(variant, 1).job
        assert (job.script, job.script_args, len(job.script_sha256)) == ("train.py", ("--width", "8"), 64)
        assert spec.steps_given(variant)
    assert not spec_from_dict(_spec(tmp_path, {"script": script})).steps_given(spec.variants[0])


def test_an_edited_script_is_another_config_and_its_finished_run_is_not_reused(tmp_path, script):
    before = spec_from_dict(_spec(tmp_path, {"script": script}))
    cfg = before.run_config(before.variants[0], 0)
    write_config(tmp_path / "run" / "config.json", cfg)
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"inputs": code_inputs()}))
    assert why_changed(tmp_path / "run", cfg) is None
    (tmp_path / script).write_text("print('v2')\n")
    after = spec_from_dict(_spec(tmp_path, {"script": script}))
    edited = after.run_config(after.variants[0], 0)
    assert config_hash(edited) != config_hash(cfg)
    assert "job.script_sha256" in why_changed(tmp_path / "run", edited)


def test_a_scripts_runs_keep_the_specs_worker_settings(tmp_path, script):
    spec = spec_from_dict(_spec(tmp_path, {"script": script}, variants=(
        {"mode": "sync", "worker": {"compress": "topk:0.01", "local_steps": 4}}, {"mode": "async"})))
    worker = spec.run_config(spec.variants[0], 0).worker  # reaches the script's psrv.Worker through PSRV_CONFIG
    assert (worker.compress, worker.local_steps) == ("topk:0.01", 4)


def test_a_variant_may_name_the_script(tmp_path, script):
    spec = spec_from_dict(_spec(tmp_path, {"steps": 10}, variants=({"mode": "sync"},
                                                                    {"mode": "async", "job": {"script": script}})))
    assert [spec.run_config(v, 0).job.script for v in spec.variants] == ["", "train.py"]


@pytest.mark.parametrize("job, extra, says", [
    ({"script": "nope.py"}, {}, "job.script: no such file: nope.py"),
    ({"script": "train.py", "name": "digits_mlp"}, {}, "give script or name, not both"),
    ({"script": "train.py", "batch_size": 8}, {}, "job.batch_size: not used with a script"),
    ({"script": "train.py"}, {"faults": {"compute_ms": 5}}, "faults.compute_ms: not used with a script"),
    ({"script": "train.py"}, {"worker": {"local_steps": 4, "inner_lr": 0.1}},
     "worker.inner_lr: not used with a script"),
    ({"script": "train.py"}, {"cluster": {"transport": "rpc"}}, "cluster.transport: a script's workers"),
    ({"script": "train.py", "script_sha256": "ab"}, {}, "computed from the script"),
    ({"script_args": ["x"]}, {}, "only used with job.script"),
], ids=["missing", "name", "batch-size", "faults", "inner-lr", "rpc", "sha", "args-alone"])
def test_what_a_scripts_run_cannot_use_is_refused_naming_the_key(tmp_path, script, job, extra, says):
    with pytest.raises(ConfigError) as err:
        spec_from_dict(_spec(tmp_path, job, **extra))
    assert says in str(err.value), str(err.value)
