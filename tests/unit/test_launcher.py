"""What lets one launcher process start every rank of a psrv.Worker script (torchrun): shard addresses as
@FILE in PSRV_SERVERS, record paths as {rank} templates, and `--launcher`'s refusals, each in one line."""
import threading
import time

import pytest
import torch

import psrv
from psrv.cli import main
from psrv.experiments.launcher.script import Script
from psrv.experiments.launcher.torchrun import check_launcher, torchrun_argv
from psrv.client.keywords import servers_of
from psrv.client.steplog import StepLog

SCRIPT = "tests/integration/script_loop.py"


def test_psrv_servers_at_file_waits_for_the_ready_file_and_keeps_shard_order(tmp_path, monkeypatch):
    ready = tmp_path / "server-1.addr"
    monkeypatch.setenv("PSRV_SERVERS", f"tcp://127.0.0.1:5555, @{ready}")
    threading.Timer(0.2, lambda: ready.write_text("tcp://127.0.0.1:5556\n")).start()
    assert servers_of(None, wait=10) == ["tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556"]
    assert servers_of([f"@{ready}"], wait=0) == ["tcp://127.0.0.1:5556"]  # servers= takes the form too


def test_a_ready_file_that_never_appears_is_one_clear_error_within_the_workers_timeout(tmp_path, monkeypatch):
    missing = tmp_path / "never.addr"
    monkeypatch.setenv("PSRV_SERVERS", f"@{missing}")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    started = time.monotonic()
    with pytest.raises(ValueError, match=f"server address file {missing} did not appear within 0.3s"):
        psrv.Worker(torch.nn.Linear(2, 1), timeout=0.3)
    assert time.monotonic() - started < 5
    monkeypatch.setenv("PSRV_SERVERS", " , ")
    with pytest.raises(ValueError, match="PSRV_SERVERS names no shard address"):
        psrv.Worker(torch.nn.Linear(2, 1))


def test_rank_in_a_record_path_is_the_workers_own(tmp_path, monkeypatch):
    monkeypatch.setenv("PSRV_RECORD", str(tmp_path / "worker-{rank}.json"))
    monkeypatch.setenv("PSRV_PROGRESS", str(tmp_path / "worker-{rank}.progress"))
    monkeypatch.setenv("PSRV_PARAMS_OUT", str(tmp_path / "params.pt"))
    for rank in (0, 3):
        log = StepLog.from_env(rank=rank)
        log.describe(rank=rank)
        log.row(step=0, loss=0.5, compute_seconds=0.1, communication_seconds=0.0, wait_seconds=0.0, batch_size=4)
        log.save(log.record(), params=torch.ones(2) if rank == 0 else None)
    for rank in (0, 3):
        assert (tmp_path / f"worker-{rank}.progress").read_text() == "1"
        assert f'"rank": {rank}' in (tmp_path / f"worker-{rank}.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.pt", "worker-0.json", "worker-0.progress",
                                                          "worker-3.json", "worker-3.progress"]


def test_torchrun_starts_every_rank_of_the_script_with_its_arguments(tmp_path):
    from psrv.config import RunConfig
    cfg = RunConfig().replace(cluster=RunConfig().cluster.replace(workers=3))
    argv = torchrun_argv(cfg, tmp_path, Script(tmp_path / "train.py", ("--epochs", "2")), port=12345)
    assert argv[argv.index("-m") + 1] == "torch.distributed.run"
    assert argv[argv.index("--nproc-per-node") + 1] == "3" and argv[argv.index("--master-port") + 1] == "12345"
    assert argv[-3:] == [str(tmp_path / "train.py"), "--epochs", "2"]  # the script last, its arguments after it


@pytest.mark.parametrize("args", [("--launcher", "torchrun"), ("--launcher", "torchrun", "--mode", "ddp")],
                         ids=["no-script", "ddp"])
def test_torchrun_without_a_script_is_refused_in_one_line_before_anything_starts(args, capsys, tmp_path):
    assert main(["run", "--out", str(tmp_path / "run"), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("psrv run: error: --launcher torchrun: starts a --script's "
                                                    "workers"), err
    assert not (tmp_path / "run").exists()                                      # nothing started


def test_torchrun_on_emulated_hosts_is_refused_in_one_line_before_anything_starts(capsys, tmp_path):
    """--bandwidth puts each rank on a host of its own; torchrun starts them all as one process on one."""
    assert main(["run", "--out", str(tmp_path / "run"), "--launcher", "torchrun", "--bandwidth", "200mbit",
                 "--script", SCRIPT, "1", "x"]) == 2
    err = capsys.readouterr().err
    assert err == ("psrv run: error: --launcher torchrun: starts every rank as one process, on one host, and "
                   "--bandwidth 200mbit puts each rank on an emulated host of its own; use --launcher psrv\n"), err
    assert not (tmp_path / "run").exists()                                      # nothing started


def test_an_unknown_launcher_is_refused_naming_the_ones_there_are(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--launcher", "mpirun", "--script", SCRIPT, "1", "x"])
    assert exit_.value.code == 2
    assert "argument --launcher: invalid choice: 'mpirun' (choose from 'psrv', 'torchrun')" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--launcher: unknown launcher 'mpirun'; choose one of psrv, torchrun"):
        check_launcher("mpirun", Script(tmp_path / "train.py"))  # run_local's own check, for library callers
