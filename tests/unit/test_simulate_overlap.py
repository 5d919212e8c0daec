"""psrv simulate models overlap (experiments/simulate/overlap.py): with several shards a worker encodes and sends
each slice as soon as backward has finished it, the encodes on its own thread between the parts of backward; off
(or one shard), every slice is encoded and sent after the whole compute, as before."""
import json

import pytest

from psrv.config import from_dict
from psrv.experiments.simulate.cluster import Cluster
from psrv.experiments.simulate.codec_cost import CodecCost
from psrv.experiments.simulate.config import SimulationConfig
from psrv.experiments.simulate.network import job_plan
from psrv.experiments.simulate.overlap import compute_holds_encodes, overlaps, ready_order
from psrv.experiments.simulate.run import simulate

STEPS, COMPUTE = 5, 0.020
TX, RTX = (0.001, 0.002, 0.0015, 0.0005), (0.0007, 0.0011, 0.0003, 0.0009)  # a slice's and a reply's seconds on a link
COST = CodecCost(worker_push=(0.004, 0.006, 0.003, 0.005), worker_pull=(0.0010, 0.0005, 0.0008, 0.0006),
                 shard_push=(0.0010, 0.0020, 0.0005, 0.0015), shard_pull=(0.0030, 0.0010, 0.0020, 0.0025))
READY = [(2, 0.6), (3, 0.6), (0, 1.0), (1, 1.0)]  # synthetic_mlp's order: its two big layers' halves


def cluster(ready, *, compute=COMPUTE, holds=False) -> Cluster:
    return Cluster(workers=2, shards=4, mode="sync", staleness=0, backup_workers=0, steps=STEPS, local_steps=1,
                   compute=[[compute] * STEPS for _ in range(2)], latency=0.0, push_transfer=TX, reply_transfer=RTX,
                   server_seconds=0.0, sample=2, batch_size=32, codec=COST, ready=ready, compute_holds_encodes=holds)


def by_hand(ready, *, overlap: bool) -> list[float]:
    """Each worker's last step's end, worked out for sync, 2 workers and 4 shards with no latency: the worker
    whose compute began first sends first (a tie: worker 0); each slice is encoded on the worker's thread at
    its point in backward (all after the compute without overlap), then crosses the worker's link and the
    shard's, one at a time, and the shard decodes it. The second push of a clock to a shard releases both
    replies: the shard encodes worker 0's then worker 1's, each leaves on its link when encoded, and the worker
    decodes it once its step() has been called (after its compute, and with overlap its encodes)."""
    enc, dec, unpack, pack = COST.worker_push, COST.worker_pull, COST.shard_push, COST.shard_pull
    begin = [0.0, 0.0]
    in_free, out_free, busy = [0.0] * 4, [0.0] * 4, [0.0] * 4
    for _ in range(STEPS):
        end = [0.0, 0.0]
        for w in sorted((0, 1), key=lambda w: (begin[w], w)):
            end[w] = begin[w] + COMPUTE + (sum(enc) if overlap else 0.0)  # when step() is called
            thread = link = begin[w]
            done = 0.0
            for s, f in ready:
                thread += (f - done) * COMPUTE + enc[s]
                done = f
                start = max(thread, link)
                link = start + TX[s]
                in_free[s] = max(start, in_free[s]) + TX[s]
                busy[s] = max(in_free[s], busy[s]) + unpack[s]
                if w == max((0, 1), key=lambda v: (begin[v], v)):  # the clock's second push: both replies
                    for r in (0, 1):
                        busy[s] += pack[s]
                        out_free[s] = max(busy[s], out_free[s]) + RTX[s]
                        end[r] = max(out_free[s], end[r]) + dec[s]
        begin = end
    return begin


def test_overlap_off_is_the_model_before_encodes_and_sends_after_the_whole_compute():
    last = cluster(None).run().end
    assert sorted(last) == pytest.approx(sorted(by_hand([(s, 1.0) for s in range(4)], overlap=False)), rel=1e-12)


def test_with_overlap_each_slice_goes_out_when_backward_has_finished_it():
    rec = cluster(READY).run()
    assert sorted(rec.end) == pytest.approx(sorted(by_hand(READY, overlap=True)), rel=1e-12)
    assert [r["compute_seconds"] for r in rec.rows] == pytest.approx([COMPUTE + sum(COST.worker_push)] * 2 * STEPS)


def test_a_real_runs_compute_that_holds_its_encodes_is_not_charged_them_twice():
    holding = cluster(READY, compute=COMPUTE + sum(COST.worker_push), holds=True).run()
    assert sorted(holding.end) == pytest.approx(sorted(cluster(READY).run().end), rel=1e-9)


def test_the_ready_order_follows_backward_over_the_plan():
    """synthetic_mlp: 0.weight, 0.bias (4096), 2.weight, 2.bias (1024), 4.weight (10240), 4.bias (10); four
    shards of 2100995 (or 2100994) elements: shards 2 and 3 end inside 2.weight's backward, 0 and 1 in 0.weight's."""
    plan = job_plan("synthetic_mlp", seed=0, shards=4)[0]
    after_layer_2 = (4194304 + 1024 + 10240 + 10) / plan.total
    f = 0.25
    order = ready_order(plan, f)
    assert [s for s, _ in order] == [2, 3, 0, 1]
    assert [r for _, r in order] == pytest.approx([f + (1 - f) * after_layer_2] * 2 + [1.0, 1.0])
    assert [s for s, _ in ready_order(job_plan("synthetic_mlp", seed=0, shards=1)[0], f)] == [0]


def config(servers: int, workers: int = 2, **worker) -> SimulationConfig:
    return from_dict(SimulationConfig, {
        "mode": "sync", "job": {"name": "digits_cnn", "steps": STEPS}, "cluster": {"workers": workers, "servers": servers},
        "worker": worker, "simulate": {"model_ms": 5.0, "latency_ms": 0.05, "codec_cost": "off",
                                       "bandwidth_gbps": 0.2}})


def test_one_shard_or_overlap_off_simulates_as_before():
    unlike = {"simulator_seconds": 0}
    assert not overlaps(config(1)) and overlaps(config(2)) and not overlaps(config(2, overlap=False))
    assert simulate(config(1)) | unlike == simulate(config(1, overlap=False)) | unlike
    # one worker, bound by its own link: shard 1's slice crosses it while backward finishes shard 0's
    assert simulate(config(2, 1))["wall_seconds"] < simulate(config(2, 1, overlap=False))["wall_seconds"]


def test_a_runs_records_say_whether_its_compute_holds_the_encodes(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"cluster": {"servers": 4}}))
    steps = tmp_path / "steps.csv"
    assert not compute_holds_encodes(steps)  # no worker records
    for rank, early in ((0, 24), (1, 24)):
        (tmp_path / f"worker-{rank}.json").write_text(json.dumps({"pushes": 6, "early_sends": early}))
    assert compute_holds_encodes(steps)
    (tmp_path / "worker-1.json").write_text(json.dumps({"pushes": 6, "early_sends": 0}))
    assert not compute_holds_encodes(steps)


def _run_folder(folder, *, early_sends: int | None):
    """A finished 2-shard run's folder as psrv run writes it: sign both ways on digits_cnn, every step's
    compute 10 ms, and (unless None) worker records counting `early_sends` each for 4 pushes."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "mode": "sync", "seed": 0, "job": {"name": "digits_cnn", "steps": 4, "batch_size": 32},
        "cluster": {"servers": 2, "workers": 2}, "worker": {"compress": "sign", "compress_pull": "sign"}}))
    rows = ["wall_time,worker,step,loss,staleness,compute_seconds,communication_seconds,wait_seconds,batch_size,pushed"]
    rows += [f"{0.02 * (s + 1):.6f},{w},{s},1.0,0,0.01,0.01,0.0,32,True" for s in range(4) for w in (0, 1)]
    (folder / "steps.csv").write_text("\n".join(rows) + "\n")
    for rank in (0, 1) if early_sends is not None else ():
        (folder / f"worker-{rank}.json").write_text(json.dumps({"pushes": 4, "early_sends": early_sends}))
    return folder


def test_against_a_run_whose_compute_holds_its_encodes_keeps_that_compute(tmp_path, capsys):
    """--against: a run whose workers sent every slice during backward is simulated with its own step compute
    (the encodes taken out and put back in place); one without such records is charged the encodes on top."""
    from psrv.cli.main import main
    computes = {}
    for name, early in (("held", 8), ("not-held", None)):
        out = tmp_path / f"sim-{name}"
        assert main(["simulate", "--against", str(_run_folder(tmp_path / name, early_sends=early)),
                     "--forward-fraction", "0.5", "--out", str(out)]) == 0
        computes[name] = [float(r.split(",")[5]) for r in (out / "steps.csv").read_text().splitlines()[1:]]
    encodes = sum(json.loads((tmp_path / "sim-held" / "against.json").read_text())["codec_cost_ms"]["worker_push"])
    assert encodes > 0
    assert computes["held"] == pytest.approx([0.01] * 8, rel=1e-9)
    assert computes["not-held"] == pytest.approx([0.01 + encodes / 1000] * 8, rel=1e-9)
    assert "steady samples/s" in capsys.readouterr().out
