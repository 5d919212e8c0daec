"""A run's worker settings reach its script: `psrv run --compress ... --local-steps ... --script FILE.py` runs
the script's plain psrv.Worker(model) with them (PSRV_CONFIG), measured on the wire; a keyword the script
passes itself wins, and the run says so (settings_overridden) rather than differ silently from config.json."""
import json
import queue
import threading
from pathlib import Path

import pytest
import torch

import psrv
from psrv.config import RunConfig, ServerConfig
from psrv.config.base import from_dict, to_dict
from psrv.server.run import serve
from tests.helpers import psrv_run

SCRIPT = Path(__file__).with_name("settings_loop.py")  # its own SGD as the inner optimizer; KEY=VALUE keywords


@pytest.mark.timeout(120)
def test_a_scripts_plain_worker_compresses_and_takes_local_steps_from_the_run(tmp_path):
    out = tmp_path / "run"
    s = psrv_run(out, "--mode", "sync", "--servers", "1", "--workers", "2", "--steps", "8",
                 "--compress", "topk:0.05", "--compress-warmup", "0", "--local-steps", "2", "--script", str(SCRIPT))
    assert (s["compress"], s["local_steps"], s["settings_overridden"]) == ("topk:0.05", 2, {})
    assert s["pushes"] == 2 * 4 and s["inner_steps"] == 2 * 8 and s["updates_applied"] == 4  # a push per 2 steps
    assert s["compression_ratio"] > 5                                   # top-k 5%: the wire well under dense
    worker = json.loads((out / "worker-0.json").read_text())
    assert worker["bytes_pushed"] * 5 < worker["dense_push_bytes"]
    assert (worker["error_feedback"], worker["settings_overridden"]) == (True, {})


@pytest.mark.timeout(120)
def test_a_keyword_the_script_passes_wins_and_the_run_says_so(tmp_path):
    out = tmp_path / "run"
    s = psrv_run(out, "--mode", "sync", "--servers", "1", "--workers", "1", "--steps", "4",
                 "--compress", "topk:0.05", "--script", str(SCRIPT), "compress=int8")
    assert s["compress"] == "int8" and 3 < s["compression_ratio"] < 4.5  # int8's ratio, not top-k's
    assert s["settings_overridden"] == {"rank 0": {"compress": {"run": "topk:0.05", "script": "int8"}}}
    assert json.loads((out / "config.json").read_text())["worker"]["compress"] == "topk:0.05"  # the config as given
    assert "the script's own compress='int8', not the run's config (compress='topk:0.05')" in \
        (out / "worker-0.log").read_text()


@pytest.mark.timeout(60)
def test_psrv_worker_takes_what_the_call_leaves_out_and_names_what_it_overrides(tmp_path, monkeypatch):
    cfg = from_dict(RunConfig, {"mode": "async", "cluster": {"servers": 1, "workers": 1},
                                "worker": {"compress": "topk:0.05", "compress_pull": "int8"}})
    (tmp_path / "config.json").write_text(json.dumps(to_dict(cfg)))
    for name in ("PSRV_RECORD", "PSRV_PROGRESS", "PSRV_PARAMS_OUT", "PSRV_METRICS_PORT", "PSRV_SERVERS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PSRV_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("PSRV_MODE", "async")
    ready = queue.Queue()
    shard = threading.Thread(target=serve, args=(ServerConfig(workers=1, mode="async", bind="tcp://127.0.0.1:0",
                                                              worker_timeout=30.0),),
                             kwargs={"on_ready": ready.put}, daemon=True)
    shard.start()
    server = ready.get(timeout=30)
    model = torch.nn.Linear(64, 32)
    with psrv.Worker(model, [server.address], rank=0, world_size=1, compress="int8", overlap=True) as ps:
        model(torch.randn(4, 64)).sum().backward()
        ps.step()
        assert (ps.compression()["compress"], ps.compression()["compress_pull"]) == ("int8", "int8")
        assert ps.settings_overridden == {"compress": {"run": "topk:0.05", "script": "int8"}}  # overlap: the same
    shard.join(timeout=30)
    assert not shard.is_alive()
