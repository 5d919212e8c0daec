"""A script's run is reused only while the code it ran is the code here now: the script imports a helper
module of its own, and under async a second one; a variant compresses its pushes by the spec's setting
alone (the script passes no keyword). Editing the async-only module reruns the async run alone, with a line
naming the file, and the sync, ddp and compressed runs are skipped. Real `psrv experiment`, real processes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import psrv_argv, run_in_session

TRAIN = """\
import os
import torch
import psrv
from sine_data import batch          # every mode's data
if os.environ["PSRV_MODE"] == "async":
    import async_extra                # this mode's only

torch.manual_seed(int(os.environ["PSRV_SEED"]))
model = torch.nn.Sequential(torch.nn.Linear(8, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
with psrv.make_worker(model) as ps:
    while ps.steps < int(os.environ["PSRV_STEPS"]):
        x, y = batch(ps.steps)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        ps.step(loss=loss, batch_size=len(x))
"""
DATA = """\
import torch
NOISE = 0.1
def batch(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(16, 8, generator=g)
    return x, x.sum(1, keepdim=True) + NOISE * torch.randn(16, 1, generator=g)
"""
SPEC = """\
name = "reuse"
seeds = [0]
[job]
script = "train.py"
steps = 4
[cluster]
workers = 1
servers = 1
[target]
eval_loss = 0.1
[[variants]]
mode = "sync"
[[variants]]
mode = "async"
[[variants]]
mode = "ddp"
[[variants]]
name = "sync-topk"
mode = "sync"
worker = { compress = "topk:0.25", compress_warmup = 0 }
"""
VARIANTS = ("sync", "async", "ddp", "sync-topk")


@pytest.mark.timeout(240)
def test_an_edited_helper_module_reruns_only_the_runs_that_imported_it(tmp_path: Path) -> None:
    for name, text in (("train.py", TRAIN), ("sine_data.py", DATA), ("async_extra.py", "SCALE = 1\n"),
                       ("spec.toml", SPEC)):
        (tmp_path / name).write_text(text)
    first = run_in_session(psrv_argv("experiment", "spec.toml", "--out", "out"), timeout=150, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-3000:]
    files = {v: json.loads((tmp_path / "out" / v / "rep-0" / "summary.json").read_text())["inputs"]["files"]
             for v in VARIANTS}
    names = {v: sorted(Path(f).name for f in files[v]) for v in VARIANTS}
    assert names == {"sync": ["sine_data.py", "train.py"], "async": ["async_extra.py", "sine_data.py", "train.py"],
                     "ddp": ["sine_data.py", "train.py"], "sync-topk": ["sine_data.py", "train.py"]}
    topk = json.loads((tmp_path / "out" / "sync-topk" / "rep-0" / "summary.json").read_text())
    assert topk["compress"] == "topk:0.25" and topk["compression_ratio"] > 1.5  # the spec's codec, not the script's

    (tmp_path / "async_extra.py").write_text("SCALE = 2\n")
    second = run_in_session(psrv_argv("experiment", "spec.toml", "--out", "out"), timeout=90, cwd=tmp_path)
    assert second.returncode == 0, second.stdout[-3000:]
    assert "rerunning async rep-0: async_extra.py changed since it ran; the old run is kept in " in second.stdout
    for variant in ("sync", "ddp", "sync-topk"):
        assert f"skipped {variant} rep-0 (seed 0): already finished with this config" in second.stdout
    assert [line for line in second.stdout.splitlines() if line.startswith("finished ")] == \
        [f"finished async rep-0 in out/async/rep-0"]
