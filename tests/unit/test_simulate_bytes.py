"""psrv simulate's network model weighs each push and reply as the real system sends it: the codecs' parts
(against their documented layouts and the real encoders), the compressed pulls' average with their dense
resyncs, streaming DiLoCo's fragment pushes and compressed fragment pulls; and a bandwidth-bound run speeds up by the bytes it saves."""
import math

import pytest
import torch

from psrv.codecs import make
from psrv.codecs.push import PushEncoder
from psrv.config import from_dict
from psrv.config.sections import SimulateSettings
from psrv.experiments.simulate.config import SimulationConfig
from psrv.experiments.simulate.network import NetworkModel, job_plan
from psrv.experiments.simulate.run import simulate

HEADER = 512  # a message's msgpack header (its codec fields, dense ranges) is under this
SHARDS = 2


@pytest.fixture(scope="module")
def plan():
    return job_plan("digits_mlp", seed=0, shards=SHARDS)[0]


def network(plan, **worker) -> NetworkModel:
    cfg = from_dict(SimulationConfig, {"worker": worker, "cluster": {"servers": SHARDS}})
    return NetworkModel.of(SimulateSettings(), plan, cfg.worker)


def layout(codec: str, n: int) -> int:
    """A codec's payload bytes for n elements, as psrv/codecs documents it (a float32 scale per 1024)."""
    scales = 4 * math.ceil(n / 1024)
    if codec.startswith(("topk", "randomk")):
        return 8 * math.ceil(float(codec.split(":")[1]) * n)   # int32 index + float32 value
    return {"sign": math.ceil(n / 8) + scales, "int8": n + scales, "fp4": math.ceil(n / 2) + scales,
            "float32": 4 * n, "bfloat16": 2 * n, "float16": 2 * n}[codec]


@pytest.mark.parametrize("codec", ["topk:0.01", "randomk:0.05", "sign", "int8", "fp4", "bfloat16", "fp16"])
def test_push_and_pull_bytes_are_the_codecs_layout(plan, codec):
    push_key = {"wire_dtype": codec} if codec == "bfloat16" else {"compress": codec}  # fp16: the compress alias
    net = network(plan, compress_min_numel=0, compress_pull=codec, pull_resync=0, **push_key)
    for s, (lo, hi) in enumerate(plan.ranges):
        payload = layout("float16" if codec == "fp16" else codec, hi - lo)
        assert 0 < net.push_bytes[s] - payload < HEADER
        assert 0 < net.reply_bytes[s] - payload < HEADER


@pytest.mark.parametrize("codec", ["topk:0.01", "sign", "int8"])
def test_push_bytes_are_the_real_encoders_parts_with_small_tensors_dense(plan, codec):
    net = network(plan, compress=codec)  # compress_min_numel's default: the biases travel dense
    encoder = PushEncoder(make(codec), plan, error_feedback=False, min_numel=1024)
    grad = torch.randn(plan.total)
    dense = 0
    for s in range(SHARDS):
        _, parts = encoder.encode(grad, s)
        dense += "dense" in parts
        assert 0 < net.push_bytes[s] - sum(p.nbytes for p in parts.values()) < HEADER
    assert dense  # the biases are in some shard: the check covers the dense part


def test_a_compressed_pull_is_dense_once_every_resync_pulls(plan):
    dense, compressed = network(plan).reply_bytes, network(plan, compress_pull="sign", pull_resync=0).reply_bytes
    every4 = network(plan, compress_pull="sign", pull_resync=4).reply_bytes
    assert network(plan, compress_pull="sign", pull_resync=1).reply_bytes == pytest.approx(dense)
    assert every4 == pytest.approx([(d + 3 * c) / 4 for d, c in zip(dense, compressed)])
    assert network(plan, compress="sign").reply_bytes == dense   # a compressed push leaves the pull dense


def test_streaming_diloco_pushes_one_fragment_of_the_model_each_push(plan):
    whole = network(plan, local_steps=8)
    quarter = network(plan, local_steps=8, fragments=4)
    int8 = network(plan, local_steps=8, fragments=4, outer_dtype="int8")
    body = 4 * plan.total  # float32
    assert sum(whole.push_bytes) == pytest.approx(body, abs=SHARDS * HEADER)
    assert sum(quarter.push_bytes) == pytest.approx(body / 4, abs=SHARDS * HEADER)
    assert sum(quarter.reply_bytes) == pytest.approx(body / 4, abs=SHARDS * HEADER)
    assert sum(int8.push_bytes) == pytest.approx(plan.total / 4, abs=SHARDS * HEADER + 4 * 4 * SHARDS)


@pytest.mark.parametrize("codec", ["sign", "int8", "topk:0.01"])
def test_a_fragments_compressed_pull_is_its_codecs_layout_over_the_fragments_piece(plan, codec):
    """A fragment pull from a shard sends the codec over that fragment's piece there; the reply is the
    average over the F fragments, with one dense in pull_resync of each fragment's pulls."""
    from psrv.client.fragments import Fragments
    pieces = [[b - a for a, b in bounds] for bounds in Fragments(plan, 4).bounds]  # per fragment, per shard
    streaming = {"local_steps": 8, "fragments": 4, "compress_pull": codec, "compress_min_numel": 0}
    net = network(plan, pull_resync=0, **streaming)
    for s in range(SHARDS):
        assert net.reply_bytes[s] == pytest.approx(sum(layout(codec, p[s]) for p in pieces) / 4, abs=HEADER)
    dense = network(plan, local_steps=8, fragments=4).reply_bytes
    every4 = network(plan, pull_resync=4, **streaming).reply_bytes
    assert every4 == pytest.approx([(d + 3 * c) / 4 for d, c in zip(dense, net.reply_bytes)])
    assert sum(net.reply_bytes) < sum(dense) / 3


def run(**worker) -> dict:
    """A sync run bound by a 1 Mbit/s network: 0.1 ms of compute a step, no latency, the bytes alone (no codec cost:
    tests/unit/test_simulate_codec_cost.py)."""
    return simulate(from_dict(SimulationConfig, {
        "mode": "sync", "job": {"steps": 40}, "cluster": {"workers": 2, "servers": 1}, "worker": worker,
        "faults": {"compute_ms": 0.0},
        "simulate": {"bandwidth_gbps": 0.001, "latency_ms": 0.0, "model_ms": 0.1, "server_ms": 0.0,
                                   "codec_cost": "off"}}))


def test_a_bandwidth_bound_run_speeds_up_by_the_bytes_it_saves():
    dense, sign = run(), run(compress="sign", compress_pull="sign")
    saved = (sum(dense["message_bytes"]) + sum(dense["reply_bytes"])) / (sum(sign["message_bytes"]) + sum(sign["reply_bytes"]))
    assert saved > 5
    assert sign["samples_per_second"] / dense["samples_per_second"] == pytest.approx(saved, rel=0.1)


def test_fragments_push_every_h_over_f_steps():
    s = run(local_steps=8, fragments=4)
    assert s["pushes"] == 2 * 40 // 2


def test_learning_with_compression_is_refused():
    with pytest.raises(ValueError, match="simulate.level"):
        from_dict(SimulationConfig, {"worker": {"compress": "sign"}, "simulate": {"level": "learning"}})
