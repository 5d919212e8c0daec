"""The multi-host shape: `psrv serve` x2 and `psrv worker` x2 started by hand, as on real machines."""
import contextlib
import json

import pytest

from psrv.cli import build_parser
from psrv.config import ServerConfig
from psrv.config.cli_args import config_from_args
from psrv.server.run import Server


@pytest.mark.timeout(150)
def test_servers_and_workers_started_by_hand_train_to_the_end(procs, tmp_path):
    common = ["--num-shards", "2", "--workers", "2", "--mode", "ssp", "--staleness", "1"]
    servers = [procs.server(f"server-{i}", "--shard", str(i), *common, "--out", str(tmp_path / f"s{i}.json"))
               for i in range(2)]
    addresses = ",".join(addr for _, addr in servers)
    workers = [procs.start(f"worker-{r}", "worker", "--servers", addresses, "--rank", str(r), "--world-size", "2",
                           "--steps", "60", "--out", str(tmp_path / f"w{r}.json")) for r in range(2)]
    for p in workers + [s for s, _ in servers]:
        assert procs.wait(p, timeout=120) == 0, procs.log(p.name)
    w0, w1 = (json.loads((tmp_path / f"w{r}.json").read_text()) for r in range(2))
    assert w0["pushes"] == w1["pushes"] == 60
    assert w0["final_loss"] < w0["initial_loss"]
    for i in range(2):
        shard = json.loads((tmp_path / f"s{i}.json").read_text())
        assert shard["updates_applied"] == 120 and shard["max_clock_gap"] <= 1
        assert shard["active"] == []


@pytest.mark.timeout(60)
def test_worker_with_wrong_server_order_is_refused_with_a_clear_error(procs, tmp_path):
    # the refusal is the `psrv worker` process's; its two shards are psrv.Servers served from threads of
    # this process, with `psrv serve`'s own options (two imports of torch fewer than as processes)
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(Server(config_from_args(ServerConfig, build_parser().parse_args(
            ["serve", "--bind", "tcp://127.0.0.1:0", "--shard", str(i), "--num-shards", "2", "--workers", "1",
             "--log-level", "WARNING"]))).start()) for i in range(2)]
        swapped = f"{servers[1].address},{servers[0].address}"
        w = procs.start("worker", "worker", "--servers", swapped, "--steps", "5")
        assert procs.wait(w, timeout=60) != 0
    assert "check --servers order" in procs.log("worker")
