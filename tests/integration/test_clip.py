"""--clip-grad-norm: sync (the server clips the clock's averaged gradient) and DDP (the all-reduced one)
equal clip_grad_norm_ on the global batch's gradient; async's worker clips its own gradient by its
norm over every shard; 0 is off, the old behaviour; sync with more than one shard is refused."""
from __future__ import annotations

import pytest
import torch

from psrv.cli import build_parser
from psrv.config import OptimConfig, RunConfig, ServerConfig
from psrv.config.base import config_hash
from psrv.config.cli_args import config_from_args, to_argv
from psrv.client.keywords import clip_of
from tests.helpers import psrv_argv, psrv_run, run_in_session
from tests.integration.test_sync_reference import BATCH, LR, MOMENTUM, STEPS, big_batch_sgd, run_config
from tests.threaded_run import run_in_threads

CLIP = 0.5  # below the global batch's gradient norm on 19 of the 20 steps with 2 workers
SGD = ("--steps", str(STEPS), "--batch-size", str(BATCH), "--optimizer", "sgd", "--lr", str(LR),
       "--momentum", str(MOMENTUM))


def clipped_reference(workers: int, clip: float) -> torch.Tensor:
    norms: list[float] = []
    want = big_batch_sgd(workers=workers, clip=clip, norms=norms)
    assert sum(n > clip for n in norms) >= 0.6 * STEPS, norms                  # the clip really bit
    assert (want - big_batch_sgd(workers=workers)).abs().max() > 1e-3          # and changed the result
    return want


@pytest.mark.timeout(240)
def test_sync_and_ddp_clip_the_global_batch_gradient(tmp_path):
    # Through `psrv run` and its processes: DDP's workers are a process group, and this sync run is the
    # one that checks the equivalence with test_sync_reference's reference through the launcher.
    want = clipped_reference(2, CLIP)
    for mode, extra in (("sync", ("--servers", "1")), ("ddp", ())):
        psrv_run(tmp_path / mode, "--mode", mode, "--workers", "2", *extra, *SGD, "--clip-grad-norm", str(CLIP),
                 timeout=100)
        got = torch.load(tmp_path / mode / "params.pt")
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5, msg=lambda m: f"{mode}: {m}")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("clip", [0.8, 0.0])
def test_async_worker_clips_by_the_norm_over_every_shard(clip):
    # one worker, two shards: a per-shard norm would clip each half by itself and miss the reference.
    # The run `psrv run` makes of these options, in threads (the worker's clip is not about processes).
    (record,), _ = run_in_threads(run_config("--mode", "async", "--workers", "1", "--servers", "2", *SGD,
                                             "--clip-grad-norm", str(clip)))
    want = clipped_reference(1, clip) if clip else big_batch_sgd(workers=1)
    torch.testing.assert_close(record["final_params"], want, rtol=0, atol=1e-5)
    # clipping needs the whole gradient, so it turns the early sends off; off, they stay on
    assert (record["early_sends"] > 0) == (clip == 0), record["early_sends"]


def test_clip_zero_or_none_is_the_config_without_a_clip():
    parse = build_parser().parse_args
    plain = config_from_args(RunConfig, parse(["run", "--mode", "sync"]))
    zero = config_from_args(RunConfig, parse(["run", "--mode", "sync", "--clip-grad-norm", "0"]))
    none = RunConfig(mode="sync", optimizer=OptimConfig(clip_grad_norm=None))
    assert plain == zero == none and config_hash(plain) == config_hash(zero) == config_hash(none)
    assert "--clip-grad-norm" not in to_argv(zero) and plain.optimizer.clip_grad_norm == 0.0
    assert plain.worker_config(0, servers=("tcp://h:1",)).clip_grad_norm == 0.0


def test_sync_with_two_shards_and_a_clip_is_refused_in_one_line(tmp_path):
    proc = run_in_session(psrv_argv("run", "--out", str(tmp_path), "--mode", "sync", "--servers", "2",
                                    "--clip-grad-norm", "1"), timeout=60)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout
    assert "--clip-grad-norm" in lines[0] and "cluster.servers" in lines[0] and "sync" in lines[0], lines[0]
    with pytest.raises(ValueError, match=r"^--clip-grad-norm: .*num_shards = 1 \(got 2"):
        config_from_args(ServerConfig, build_parser().parse_args(
            ["serve", "--mode", "sync", "--num-shards", "2", "--clip-grad-norm", "1"]))
    for mode in ("async", "ssp"):  # there the workers clip: any number of shards
        assert RunConfig(mode=mode, optimizer=OptimConfig(clip_grad_norm=1.0)).cluster.servers == 2


def test_a_worker_and_its_servers_agree_on_the_clip():
    async_, sync = [{"mode": "async", "clip_grad_norm": 0.0}], [{"mode": "sync", "clip_grad_norm": 0.0}]
    assert clip_of(0.5, async_, "async") == 0.5                       # async: the worker's own
    assert clip_of(None, [{"clip_grad_norm": 0.7}], "ssp") == 0.7     # or the servers'
    assert clip_of(0.7, [{"clip_grad_norm": 0.7}] * 2, "sync") == 0.7
    with pytest.raises(ValueError, match=r"^clip_grad_norm=0.5, but the servers .* 0 \(in sync the servers clip\)"):
        clip_of(0.5, sync, "sync")                                     # sync's servers would not clip
    with pytest.raises(ValueError, match="give both the same value"):
        clip_of(0.5, [{"clip_grad_norm": 0.7}], "async")
    with pytest.raises(ValueError, match="different norms"):
        clip_of(0.0, [{"clip_grad_norm": 0.7}, {"clip_grad_norm": 0.5}], "async")
