"""One source per setting: the command line, a spec, a launched process's JSON and the DDP baseline
are all derived from the config tree, so each setting has one name, one default and one check."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from psrv.experiments.harness.spec import spec_from_dict
from psrv.cli import build_parser
from psrv.config import ConfigError, RunConfig, ServerConfig, WorkerConfig, from_dict, to_dict
from psrv.config.base import default_of, leaves, merge
from psrv.config.cli_args import config_from_args, flag_of, to_argv
from psrv.experiments.launcher.script import with_script
from psrv.workers.allreduce.main import build_parser as ddp_parser

SCRIPT = str(Path(__file__).resolve().parents[1] / "integration" / "script_loop.py")  # a real file: its hash is taken

# what a setting needs beside it to be valid at a value other than its default
COMPANIONS: dict[str, dict[str, Any]] = {
    "backup_workers": {"mode": "sync"}, "mode": {}, "quorum": {"mode": "sync"},
    "quorum_max_age": {"mode": "sync", "quorum": 1}, "quorum_grace": {"mode": "sync", "quorum": 1},
    "quorum_grace_adaptive": {"mode": "sync", "quorum": 1, "quorum_grace": 0.5},
    "quorum_wait": {"mode": "sync", "quorum": 1},
    "lr_schedule": {"optimizer": {"lr_decay_steps": 10}},  # its other value, warmup_cosine, needs a horizon
    "lr_decay_steps": {"optimizer": {"lr_schedule": "linear"}},
    "lr_end_factor": {"optimizer": {"lr_schedule": "linear", "lr_decay_steps": 10}},
    "lr_step_size": {"optimizer": {"lr_schedule": "step"}},
    "lr_gamma": {"optimizer": {"lr_schedule": "step", "lr_step_size": 3}},
    "dc_lambda": {"optimizer": {"update_rule": "dc-asgd"}},
    "dn_period": {"optimizer": {"update_rule": "dn", "nesterov": True}},
    "cgad_alpha": {"mode": "async", "optimizer": {"update_rule": "cgad"}},
    "cgad_cutoff": {"mode": "async", "optimizer": {"update_rule": "cgad"}},
    **{key: {"mode": "async", "optimizer": {"update_rule": "heloco", "nesterov": True}}
       for key in ("heloco_keep", "heloco_shrink", "heloco_reorient", "heloco_kappa", "heloco_block")},
    "inner_lr": {"worker": {"local_steps": 5}},
    "regions": {"mode": "async"},  # regional shards are asynchronous
    **{key: {"mode": "async", "hierarchy": {"regions": 2}} for key in ("region_every", "global_lr", "global_momentum")},
    "fragments": {"worker": {"local_steps": 4}}, "outer_dtype": {"worker": {"local_steps": 4}},
    "pull_extrapolate": {"worker": {"local_steps": 4}},
    "pull_in_place": {"mode": "sync", "cluster": {"servers": 1}},  # a shard that never writes while a worker computes
    "ddp_comm_hook": {"mode": "ddp"}, "wait_barrier": {"mode": "ddp"}, "stall_timeout": {"mode": "ddp"},
    "freeze_step": {"mode": "sync", "optimizer": {"name": "onebit_adam"}},
    "powersgd_rank": {"mode": "ddp", "allreduce": {"ddp_comm_hook": "powersgd"}},
    "script_args": {"job": {"script": SCRIPT}}, "script_sha256": {"job": {"script": SCRIPT}},
    "disk_mb": {"nemesis": {"schedule": "disk_full at 5s for 1s"}, "checkpoints": {"every": 1.0}},
    # the codec's settings, where a codec they act on runs (psrv/config/codec_knobs.py)
    "error_feedback": {"worker": {"compress": "topk:0.1"}}, "compress_warmup": {"worker": {"compress": "topk:0.1"}},
    "momentum_correction": {"worker": {"compress": "topk:0.1"}},
    "momentum_masking": {"worker": {"compress": "topk:0.1"}}, "sign_scale": {"worker": {"compress": "sign"}},
    "pull_error_feedback": {"worker": {"compress_pull": "topk:0.1"}},
    "error_feedback_decay": {"worker": {"compress": "topk:0.1"}}}
OTHER = {"worker.compress": "topk:0.01", "worker.compress_pull": "sign", "mode": "sync", "cluster.device": "cuda:1", "job.name": "synthetic_mlp", "faults.straggler": "1:2",
         "faults.transient_stragglers": "0.1:4", "optimizer.momentum": 0.5, "optimizer.betas": (0.8, 0.99),
         "optimizer.dc_lambda": 0.5, "optimizer.cgad_alpha": 0.5, "optimizer.cgad_cutoff": 4,
         "optimizer.heloco_keep": 0.5, "optimizer.heloco_shrink": 2.0, "optimizer.heloco_reorient": 0.25,
         "optimizer.heloco_kappa": 2.0, "optimizer.heloco_block": 64, "worker.error_feedback_decay": 0.5,
         "worker.inner_lr": 0.01, "tensorboard": "runs/tb", "network.bandwidth": "200mbit",
         "job.script": SCRIPT, "job.script_args": ("--epochs", "2"), "job.script_sha256": "0" * 64,
         "kill.server": "1:5", "kill.worker": "1:5", "nemesis.schedule": "pause worker:1 at step 5 for 1s",
         "mlflow": "sqlite:///runs/mlflow.db"}


def _nest(key: str, value: Any) -> dict[str, Any]:
    *path, name = key.split(".")
    out: dict[str, Any] = {name: value}
    for part in reversed(path):
        out = {part: out}
    return out


def _other_value(key: str, f, s) -> Any:
    """A valid value other than the default, for every leaf of a run."""
    if key in OTHER:
        return OTHER[key]
    default = default_of(f)
    if isinstance(default, bool):
        return not default
    if s.choices:
        return next(c for c in s.choices if c != default)
    if isinstance(default, int):
        return default + 1
    if isinstance(default, float):
        return default * 2 if default else 0.5
    raise AssertionError(f"no other value for {key}")


RUN_LEAVES = leaves(RunConfig)


def test_every_leaf_is_reachable_and_checked():
    keys = [key for key, _, _ in RUN_LEAVES]
    assert len(keys) == len(set(keys))
    assert {"mode", "optimizer.momentum", "job.steps", "cluster.workers", "faults.straggler",
            "server.worker_timeout", "worker.wire_dtype"} <= set(keys)
    for key, _, s in RUN_LEAVES:
        assert s.help, f"{key} has no help text"


@pytest.mark.parametrize(("key", "f", "s"), RUN_LEAVES, ids=[k for k, _, _ in RUN_LEAVES])
def test_one_setting_reads_the_same_from_the_cli_a_spec_and_a_launched_process(key, f, s):
    value = _other_value(key, f, s)
    data = merge(COMPANIONS.get(key.split(".")[-1], {}), _nest(key, value))
    expected = from_dict(RunConfig, data)

    # a spec: the same dotted key, given in a variant
    if key == "seed":  # a spec lists its seeds, one run each
        spec = spec_from_dict({"name": "t", "target": {"eval_loss": 1.0}, "seeds": [value], "variants": [{}]})
        assert [spec.run_config(v, seed) for v, seed, _ in spec.runs()] == [expected]
    elif key == "job.script_sha256":  # a spec's script is hashed when the spec is read, never given
        with pytest.raises(ConfigError, match="computed from the script"):
            spec_from_dict({"name": "t", "target": {"eval_loss": 1.0}, "variants": [{"name": "v", **data}]})
    else:
        spec = spec_from_dict({"name": "t", "target": {"eval_loss": 1.0}, "variants": [{"name": "v", **data}]})
        hashed = with_script(expected, SCRIPT, expected.job.script_args) if expected.job.script else expected
        assert spec.run_config(spec.variants[0], expected.seed) == hashed

    # the command line: its option (or, for a setting without one, --config), printed by the one emitter
    if s.flag != "":
        argv = to_argv(expected)
        assert flag_of(key, s) in argv
        assert config_from_args(RunConfig, build_parser().parse_args(["run", *argv])) == expected
        assert config_from_args(RunConfig, ddp_parser().parse_args(argv)) == expected
    else:
        with pytest.raises(ValueError, match="--config"):
            to_argv(expected)

    # a launched process: the JSON it is given
    assert from_dict(RunConfig, json.loads(json.dumps(to_dict(expected)))) == expected
    server = expected.server_config(0, bind="tcp://127.0.0.1:0") if not expected.is_allreduce else None
    address = "rpc://127.0.0.1:1/server-0" if expected.cluster.transport == "rpc" else "tcp://127.0.0.1:1"
    worker = expected.worker_config(0, servers=(address,))
    for process in filter(None, (server, worker)):
        assert from_dict(type(process), json.loads(json.dumps(to_dict(process)))) == process
    for process, cls in ((server, ServerConfig), (worker, WorkerConfig)):
        for pkey, _, ps in leaves(cls) if process is not None else ():
            if ps is s:  # the very same setting, handed to the process
                assert _get(process, pkey) == _get(expected, key)


def _get(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def test_each_setting_has_one_default_everywhere():
    """Left out, a setting has the same value on each command line, in a spec, and in a launched process."""
    tree = RunConfig()
    assert config_from_args(RunConfig, build_parser().parse_args(["run"])) == tree
    assert config_from_args(RunConfig, ddp_parser().parse_args([])) == tree
    spec = spec_from_dict({"name": "t", "target": {"eval_loss": 1.0}, "variants": [{"mode": tree.mode}]})
    assert spec.run_config(spec.variants[0], 0) == tree
    served = config_from_args(ServerConfig, build_parser().parse_args(["serve"]))
    assert served.optimizer == tree.optimizer and served.optimizer.momentum == 0.9
    assert (served.mode, served.staleness, served.worker_timeout) == (tree.mode, tree.staleness,
                                                                      tree.server.worker_timeout)
    worker = config_from_args(WorkerConfig, build_parser().parse_args(["worker"]), extra={"servers": ["tcp://h:1"]})
    assert (worker.job, worker.faults, worker.wire_dtype) == (tree.job, tree.faults, tree.worker.wire_dtype)


def test_process_configs_share_the_runs_settings_not_copies():
    """A shard's `mode` and a run's `mode` are one declaration (one help, one check), not two."""
    run = {key: s for key, _, s in RUN_LEAVES}
    by_name: dict[str, list[str]] = {}
    for key in run:
        by_name.setdefault(key.rsplit(".", 1)[-1], []).append(key)
    shared = 0
    for cls in (ServerConfig, WorkerConfig):
        for key, _, s in leaves(cls):
            name = key.rsplit(".", 1)[-1]
            if name in ("workers", "servers", "curve_keys"):  # a shard's N, addresses, key files: their own
                continue
            matches = [key] if "." in key else by_name.get(name, [])
            if len(matches) == 1 and matches[0] in run:
                assert s is run[matches[0]], f"{cls.__name__}.{key} is declared apart from the run's {matches[0]}"
                shared += 1
    assert shared >= 20


def test_errors_name_the_key_in_each_place():
    with pytest.raises(ConfigError, match=r"^optimizer\.momentum: only used by optimizer 'sgd'"):
        from_dict(RunConfig, {"optimizer": {"name": "adam", "momentum": 0.5}})
    with pytest.raises(ValueError, match=r"^--momentum: only used by optimizer 'sgd'"):
        config_from_args(RunConfig, build_parser().parse_args(["run", "--optimizer", "adam", "--momentum", "0.5"]))
    with pytest.raises(ConfigError, match=r"variants\[0\]\.optimizer\.momentum"):
        spec_from_dict({"name": "t", "target": {"eval_loss": 1.0},
                        "variants": [{"mode": "sync", "optimizer": {"name": "adam", "momentum": 0.5}}]})
    with pytest.raises(ConfigError, match=r"faults\.transient_stragglers"):
        from_dict(RunConfig, {"faults": {"transient_stragglers": "1.5:2"}})
    # P = 0 is a valid probability everywhere (once valid in one place and refused in another)
    assert from_dict(RunConfig, {"faults": {"transient_stragglers": "0:2"}}).faults.transient_pair() == (0.0, 2.0)
