"""psrv.Worker and PSClient take the worker settings whole (psrv/client/settings.py): a WorkerSettings, with
keywords named after its fields laid over it, each checked once by the config tree in its one-line error naming
the keyword, before any connection; a keyword that is no setting is a TypeError with the nearest name. Real shards
served from threads on 127.0.0.1 where a worker must meet one."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from psrv.config import ConfigError
from psrv.config.sections import WorkerSettings
from psrv.partition import PartitionPlan
from psrv.server.run import Server
from psrv.client import Worker
from psrv.client.psclient import PSClient
from tests.conformance import job as tiny
from tests.conformance.failures import config

NOWHERE = ["tcp://127.0.0.1:9"]  # refused before a connection is tried


@pytest.mark.parametrize("keywords, says", [
    ({"timeout": 0}, "timeout: must be >= 0.1; got 0"),
    ({"compress": "top5"}, "compress: must be one of topk:RATIO"),
    ({"compress": "float16", "wire_dtype": "bfloat16"}, "wire_dtype: is 'bfloat16', and compress 'float16' casts to "
                                                         "float16: give one of them"),
    ({"momentum_masking": True}, "momentum_masking: masks momentum correction's velocity"),
    ({"local_steps": 0}, "local_steps: must be >= 1"),
    ({"outer_dtype": "int8"}, "outer_dtype: quantises the pseudo-gradients of local steps; needs local_steps > 1"),
])
def test_a_bad_setting_is_refused_in_the_config_trees_line_naming_the_keyword(keywords, says):
    with pytest.raises(ConfigError) as refused:
        Worker(torch.nn.Linear(2, 1), NOWHERE, rank=0, world_size=1, **keywords)
    assert str(refused.value).startswith(says) and "\n" not in str(refused.value)


def test_a_keyword_that_is_no_setting_is_a_type_error_with_the_nearest_name():
    with pytest.raises(TypeError, match=r"^psrv.Worker\(\) got an unexpected keyword argument 'compres' \(did you "
                                        r"mean 'compress'\?\)$"):
        Worker(torch.nn.Linear(2, 1), NOWHERE, rank=0, world_size=1, compres="sign")
    with pytest.raises(TypeError, match=r"^PSClient\(\) got an unexpected keyword argument 'local_steps'$"):
        PSClient(NOWHERE, PartitionPlan.from_module(torch.nn.Linear(2, 1), 1), worker=0, world_size=1, local_steps=4)
    with pytest.raises(TypeError, match=r"takes a psrv.config WorkerSettings; got dict"):
        Worker(torch.nn.Linear(2, 1), NOWHERE, rank=0, world_size=1, settings={"compress": "sign"})


@pytest.fixture
def shard():
    cfg = config("async")
    cfg = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, workers=1))
    server = Server(cfg.server_config(0, bind="tcp://127.0.0.1:0")).start()
    yield [server.address]
    server.stop()


@pytest.mark.timeout(60)
def test_settings_go_whole_and_a_keyword_wins_over_them(shard):
    settings = WorkerSettings(compress="topk:0.1", compress_min_numel=7, request_timeout=20.0, local_steps=4)
    with Worker(tiny.model(0), shard, rank=0, world_size=1, settings=settings, compress_warmup=0,
                timeout=25.0) as ps:
        assert ps.settings == dataclasses.replace(settings, compress_warmup=0, request_timeout=25.0)
        assert ps.local_steps == 4  # the settings' local steps, on without a keyword
        assert ps.compression()["compress"] == "topk:0.1"
        client = ps._client.settings
        assert (client.compress, client.compress_min_numel, client.compress_warmup, client.request_timeout) == (
            "topk:0.1", 7, 0, 25.0)
    assert settings.compress_warmup == 50  # the caller's settings are not changed


@pytest.mark.timeout(60)
def test_local_steps_none_turns_the_settings_local_steps_off(shard):
    with Worker(tiny.model(0), shard, rank=0, world_size=1, settings=WorkerSettings(local_steps=4),
                local_steps=None, timeout=25.0) as ps:
        assert ps.local_steps is None and not ps.settings.local_updates
