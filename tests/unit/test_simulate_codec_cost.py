"""psrv simulate charges the codecs' CPU time (experiments/simulate/codec_cost.py): measured from the real codecs,
charged on the worker or the shard that does the work, nothing for dense, and 'off' is the bytes alone."""
import pytest

from psrv.cli.main import main
from psrv.config import from_dict
from psrv.experiments.simulate.cluster import Cluster
from psrv.experiments.simulate.codec_cost import CodecCost, codec_cost
from psrv.experiments.simulate.config import SimulationConfig
from psrv.experiments.simulate.network import job_plan
from psrv.experiments.simulate.run import simulate

STEPS, COMPUTE, BANDWIDTH = 6, 0.0001, 1.25e9  # seconds of compute a step; bytes/s on a 10 Gbit/s link
SIGN_BOTH = {"compress": "sign", "compress_pull": "sign", "pull_resync": 0}


def config(codec_cost_mode: str, **worker) -> SimulationConfig:
    """Sync, 2 workers, 1 shard of digits_mlp, constant 0.1 ms compute, no latency: codec-bound with sign."""
    return from_dict(SimulationConfig, {
        "mode": "sync", "job": {"steps": STEPS}, "cluster": {"workers": 2, "servers": 1}, "worker": worker,
        "faults": {"compute_ms": 0.0},
        "simulate": {"model_ms": 1000 * COMPUTE, "latency_ms": 0.0, "codec_cost": codec_cost_mode}})


def expected_wall(push_bytes: float, reply_bytes: float, ms: dict[str, list[float]]) -> float:
    """The end of the last step, worked out by hand for this setting from the charged per-message costs: each
    clock both workers compute, encode and send; the shard's link takes the pushes one after the other and its
    thread decodes each; then it encodes worker 0's reply and worker 1's in turn, each sent when encoded (and
    when the link is free), and each worker decodes its own."""
    enc, dec = ms["worker_push"][0] / 1000, ms["worker_pull"][0] / 1000
    unpack, pack = ms["shard_push"][0] / 1000, ms["shard_pull"][0] / 1000
    tx, rtx = push_bytes / BANDWIDTH, reply_bytes / BANDWIDTH
    ready = [0.0, 0.0]        # each worker's weights in hand
    link_in = link_out = thread = 0.0
    for _ in range(STEPS):
        sent = [r + COMPUTE + enc for r in ready]
        for w in (0, 1):       # the push of the worker that computed first crosses first (a tie: worker 0)
            link_in = max(sent[w], link_in) + tx
            thread = max(link_in, thread) + unpack
        for w in (0, 1):
            thread += pack
            link_out = max(thread, link_out) + rtx
            ready[w] = link_out + dec
    return max(ready)


@pytest.mark.parametrize("mode", ["off", "measured"])
def test_a_codec_bound_run_is_slower_by_what_the_codecs_are_charged(mode):
    s = simulate(config(mode, **SIGN_BOTH))
    ms = s["codec_cost_ms"]
    if mode == "off":
        assert all(v == [0.0] for v in ms.values())
    else:  # the real codecs take time on a 100k-element shard: each operation is charged something
        assert all(v[0] > 0 for v in ms.values())
    assert s["wall_seconds"] == pytest.approx(expected_wall(s["message_bytes"][0], s["reply_bytes"][0], ms),
                                              rel=1e-9)


def test_the_charged_cost_is_the_difference_to_the_bytes_alone():
    off, measured = simulate(config("off", **SIGN_BOTH)), simulate(config("measured", **SIGN_BOTH))
    ms = {k: v[0] / 1000 for k, v in measured["codec_cost_ms"].items()}
    assert ms["shard_push"] < ms["shard_pull"]  # a sign pull's encode and mirror outweigh a push's decode
    # then worker 1, whose reply is encoded second, paces each clock: after its reply, one encode of its push
    # and one decode by the shard (worker 0's push was decoded while it waited), both replies' encodes, a decode
    per_clock = ms["worker_push"] + ms["shard_push"] + 2 * ms["shard_pull"] + ms["worker_pull"]
    assert measured["wall_seconds"] - off["wall_seconds"] == pytest.approx(STEPS * per_clock, rel=0.05)


def test_dense_is_charged_nothing_and_predicted_as_without_the_cost():
    plan = job_plan("digits_mlp", seed=0, shards=2)[0]
    dense = config("measured").worker
    assert codec_cost("measured", dense, plan) == CodecCost.none(2)
    unlike = {"codec_cost": "", "codec_cost_load_average": None, "simulator_seconds": 0}  # the setting, said
    assert simulate(config("measured")) | unlike == simulate(config("off")) | unlike


def test_without_a_cost_the_cluster_is_the_bytes_alone_model():
    """codec None and an all-zero CodecCost give the same run bit for bit (the event loop adds 0.0 exactly)."""
    def run(codec):
        cluster = Cluster(workers=3, shards=2, mode="ssp", staleness=1, backup_workers=0, steps=20, local_steps=1,
                          compute=[[0.01 + 0.001 * ((w + s) % 5) for s in range(20)] for w in range(3)],
                          latency=0.0001, push_transfer=(0.002, 0.003), reply_transfer=(0.004, 0.001),
                          server_seconds=0.0005, sample=3, batch_size=32, codec=codec)
        return cluster.run().rows
    assert run(None) == run(CodecCost.none(2))
    slower = run(CodecCost((0.001, 0.001), (0.002, 0.0), (0.0, 0.003), (0.001, 0.001)))
    assert slower[-1]["wall_time"] > run(None)[-1]["wall_time"]


def test_streaming_diloco_charges_its_outer_dtype_and_its_fragment_pulls():
    plan = job_plan("digits_mlp", seed=0, shards=2)[0]
    streaming = {"local_steps": 8, "fragments": 4}
    assert codec_cost("measured", config("off", **streaming).worker, plan) == CodecCost.none(2)  # float32, dense
    int8 = codec_cost("measured", config("off", outer_dtype="int8", **streaming).worker, plan)
    assert min(int8.worker_push + int8.shard_push) > 0 and int8.worker_pull == int8.shard_pull == (0.0, 0.0)
    pulls = codec_cost("measured", config("off", outer_dtype="int8", compress_pull="fp4", **streaming).worker, plan)
    assert min(pulls.worker_pull + pulls.shard_pull) > 0


def test_a_bad_codec_cost_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--codec-cost", "sometimes", "--out", str(tmp_path)])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--codec-cost: invalid choice: 'sometimes'" in last and "measured" in last
    with pytest.raises(ValueError, match="codec_cost"):
        from_dict(SimulationConfig, {"simulate": {"codec_cost": "sometimes"}})
    with pytest.raises(ValueError, match="codec_cost must be one of measured, off"):
        codec_cost("sometimes", config("off").worker, job_plan("digits_mlp", seed=0, shards=1)[0])
