"""--kill-server, --kill-worker, --checkpoint-every and --restart-workers (spec keys kill.server, kill.worker,
checkpoints.every, restarts.workers): their form and what a run must have for them, refused in one line naming the
option."""
from __future__ import annotations

import pytest

from psrv.cli import build_parser
from psrv.config import ConfigError, RunConfig, from_dict
from psrv.config.cli_args import config_from_args
from psrv.config.sections import parse_kill


def test_the_form_is_index_colon_step():
    assert parse_kill("1:100", first="SHARD") == (1, 100)
    assert parse_kill("", first="SHARD") is None
    for bad in ("1", "a:b", "1:2:3", "1.5:10"):
        with pytest.raises(ValueError, match=r"must look like SHARD:STEP"):
            parse_kill(bad, first="SHARD")
    for bad in ("-1:10", "0:0"):
        with pytest.raises(ValueError, match=r"SHARD must be >= 0 and STEP >= 1"):
            parse_kill(bad, first="SHARD")


@pytest.mark.parametrize(("data", "message"), [
    ({"kill": {"server": "2:10"}}, r"^kill\.server: shard must be in 0\.\.1 \(cluster\.servers = 2\); got 2"),
    ({"kill": {"server": "0:10"}, "mode": "ddp"}, r"^kill\.server: mode 'ddp' has no servers"),
    ({"kill": {"worker": "0:10"}}, r"^kill\.worker: rank must be in 1\.\.1 \(rank 0 writes the final weights"),
    ({"kill": {"worker": "2:10"}}, r"^kill\.worker: rank must be in 1\.\.1"),
    ({"kill": {"worker": "1:10"}, "mode": "ddp"}, r"^kill\.worker: mode 'ddp' cannot lose a rank"),
    ({"checkpoints": {"every": 1.0}, "mode": "fsdp"}, r"^checkpoints\.every: checkpoints shards; mode 'fsdp'"),
    ({"checkpoints": {"every": 1.0}, "cluster": {"transport": "rpc"}}, r"^checkpoints\.every: .*transport 'zmq'"),
    ({"checkpoints": {"every": -1.0}}, r"^checkpoints\.every: must be >= 0"),
    ({"restarts": {"workers": 1}, "mode": "ddp"}, r"^restarts\.workers: mode 'ddp' cannot take a rank back"),
    ({"restarts": {"workers": 1}, "cluster": {"transport": "rpc"}}, r"^restarts\.workers: .*transport 'zmq'"),
    ({"restarts": {"workers": -1}}, r"^restarts\.workers: must be >= 0"),
])
def test_a_spec_is_refused_naming_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(RunConfig, data)


def test_the_command_line_reads_the_same_settings_and_names_its_flags():
    args = build_parser().parse_args(["run", "--kill-server", "1:50", "--kill-worker", "1:20", "--checkpoint-every", "2"])
    cfg = config_from_args(RunConfig, args)
    assert (cfg.kill.server, cfg.kill.worker, cfg.checkpoints.every) == ("1:50", "1:20", 2.0)
    with pytest.raises(ValueError, match=r"^--kill-server: shard must be in 0\.\.1"):
        config_from_args(RunConfig, build_parser().parse_args(["run", "--kill-server", "5:50"]))


def test_rank_0_may_be_killed_only_when_it_comes_back():
    cfg = from_dict(RunConfig, {"kill": {"worker": "0:10"}, "restarts": {"workers": 2}})
    assert (cfg.kill.worker, cfg.restarts.workers) == ("0:10", 2)
    args = build_parser().parse_args(["run", "--kill-worker", "1:20", "--restart-workers", "3"])
    assert config_from_args(RunConfig, args).restarts.workers == 3
