"""A run's worker settings as psrv.Worker's keywords (psrv/client/run_settings.py): every worker setting but the
shipped loop's inner optimizer is a psrv.Worker keyword, mapped in one place; a run's config gives the planes,
not the cluster's counts; and a script's run refuses what only the shipped loop reads, not the worker settings."""
from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

from psrv.config import ConfigError, RunConfig
from psrv.config.base import from_dict, to_dict
from psrv.config.sections import WorkerSettings
from psrv.experiments.launcher.script import check_script_run, with_script
from psrv.client.run_settings import TIMEOUT_OPTION, keywords_of, run_config_from_env, run_keywords
from psrv.client.session import Worker
from psrv.client.settings import keyword_names

NAMES = keyword_names(inspect.signature(Worker.__init__))  # its own and the worker settings' (psrv/client/settings.py)
SCRIPT_DECIDES = {"inner_optimizer", "inner_lr"}  # the shipped loop's inner optimizer: a script steps its own


def test_every_worker_setting_but_the_inner_optimizer_is_a_keyword_of_psrv_worker():
    mapped = keywords_of(WorkerSettings(), NAMES)
    settings = {f.name for f in dataclasses.fields(WorkerSettings)}
    assert set(mapped) == (settings - SCRIPT_DECIDES - {"request_timeout"}) | {"timeout"}
    assert set(mapped) <= set(NAMES)


def test_request_timeout_is_timeout_and_local_steps_counts_only_above_one():
    plain = keywords_of(WorkerSettings(request_timeout=7.5, compress="topk:0.01"), NAMES)
    assert (plain["timeout"], plain["local_steps"], plain["compress"]) == (7.5, None, "topk:0.01")
    local = keywords_of(WorkerSettings(local_steps=8, fragments=2, outer_dtype="int8"), NAMES)
    assert (local["local_steps"], local["fragments"], local["outer_dtype"]) == (8, 2, "int8")
    assert keywords_of(WorkerSettings(local_steps="auto:6"), NAMES)["local_steps"] == "auto:6"


def test_a_run_gives_its_planes_not_the_clusters_counts():
    cfg = from_dict(RunConfig, {"mode": "async", "cluster": {"servers": 3, "workers": 4, "bulk": "auto"},
                                "worker": {"compress_pull": "int8", "push_chunk_mb": 0.5}})
    run = run_keywords(cfg, NAMES)
    assert (run["bulk"], run["shared_memory"], run["transport"]) == ("auto", "auto", "zmq")
    assert (run["compress_pull"], run["push_chunk_mb"]) == ("int8", 0.5)
    assert not {"servers", "world_size", "device"} & set(run)                      # counts and the device: not keywords


def test_the_run_config_is_read_from_psrv_config_and_must_be_the_modes(tmp_path, monkeypatch):
    monkeypatch.delenv("PSRV_CONFIG", raising=False)
    assert run_config_from_env() is None                                            # psrv.Worker outside a run
    path = tmp_path / "config.json"
    path.write_text(json.dumps(to_dict(from_dict(RunConfig, {"mode": "sync", "worker": {"compress": "sign"}}))))
    monkeypatch.setenv("PSRV_CONFIG", str(path))
    monkeypatch.setenv("PSRV_MODE", "sync")
    assert run_config_from_env().worker.compress == "sign"
    monkeypatch.setenv("PSRV_MODE", "async")
    with pytest.raises(ValueError, match=r"PSRV_MODE is 'async' but PSRV_CONFIG .* is a 'sync' run's"):
        run_config_from_env()
    assert TIMEOUT_OPTION.startswith("worker.request_timeout")


@pytest.fixture
def script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("pass\n")
    return "train.py"


def _run(script, mode="sync", **worker) -> RunConfig:
    return with_script(from_dict(RunConfig, {"mode": mode, "worker": worker}), script)


def test_a_scripts_run_keeps_its_worker_settings_and_refuses_the_inner_optimizer(script):
    check_script_run(_run(script, compress="topk:0.01", local_steps=8, compress_pull="int8"),
                     {"worker.compress", "worker.local_steps", "worker.compress_pull"})
    check_script_run(_run(script, local_steps=8), set())  # adamw, which local steps alone imply: not refused
    with pytest.raises(ValueError, match=r"^--inner-optimizer: not used with --script \(the shipped loop's inner"):
        check_script_run(_run(script, local_steps=8, inner_optimizer="sgd"), set())  # from a --config file
    with pytest.raises(ValueError, match=r"^worker.inner_lr: not used with a script"):
        check_script_run(_run(script, local_steps=8, inner_lr=0.1), {"worker.inner_lr"}, flags=False)
    with pytest.raises(ValueError, match=r"^--request-timeout: not used with --script in mode 'ddp' \(psrv.Worker "
                                         r"all-reduces"):
        check_script_run(_run(script, "ddp", request_timeout=30.0), {"worker.request_timeout"})


def test_a_scripts_run_still_refuses_what_the_script_decides(script):
    cfg = _run(script)
    with pytest.raises(ValueError, match=r"^--batch-size: not used with --script \(the shipped loop's setting; "
                                         r"your script decides it\); remove it$"):
        check_script_run(cfg.replace(job=cfg.job.replace(batch_size=8)), {"job.batch_size"})
    with pytest.raises(ValueError, match=r"^job.eval_every: not used with a script"):
        check_script_run(cfg, {"job.eval_every"}, flags=False)
    with pytest.raises(ConfigError):  # the run's own checks still hold: fragments need local steps
        _run(script, fragments=2)
