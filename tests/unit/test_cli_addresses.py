"""A malformed address on the command line is one line, `psrv CMD: error: ...`, exit 2, and nothing
started: no socket bound or connected, no file written, no wait. Before, `--servers 127.0.0.1:5555` was a
25-line ZMQError traceback, and `--bind tcp://127.0.0.1:99999` served on port 34463 (99999's low 16 bits)."""
import json
import signal
import time

import pytest

from psrv.cli import main


@pytest.fixture(autouse=True)
def signal_handlers_kept():
    """`psrv worker` sets its own SIGINT and SIGTERM handlers; this process gets its own back."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


MISTAKES = {  # what is typed -> what the one line says
    "worker": (["worker", "--servers", "127.0.0.1:5555"],
               "--servers: '127.0.0.1:5555' is not an address; write tcp://HOST:PORT (comma-separated, in shard "
               "order)"),
    "worker, the second shard": (["worker", "--servers", "tcp://127.0.0.1:5555,tcp://127.0.0.1:99999"],
                                 "--servers: 'tcp://127.0.0.1:99999': port 99999 is out of range; a port is 1..65535"),
    "top": (["top", "--servers", "127.0.0.1:5555", "--once"],
            "--servers: '127.0.0.1:5555' is not an address; write tcp://HOST:PORT (comma-separated, in shard order)"),
    "admin": (["admin", "stats", "--servers", "localhost:5555"],
              "--servers: 'localhost:5555' is not an address; write tcp://HOST:PORT"),
    "admin, an rpc address": (["admin", "stats", "--servers", "rpc://h:29500/server-0"],
                              "--servers: 'rpc://h:29500/server-0': rpc:// is not a scheme psrv takes here; write "
                              "tcp://HOST:PORT or ipc://PATH"),
    "serve": (["serve", "--bind", "tcp://127.0.0.1:99999", "--workers", "1"],
              "--bind: 'tcp://127.0.0.1:99999': port 99999 is out of range; a port is 0..65535 (0: any free port)"),
    "serve, no scheme": (["serve", "--bind", "127.0.0.1:5555", "--workers", "1"],
                         "--bind: '127.0.0.1:5555' is not an address; write tcp://HOST:PORT"),
    "serve, rpc": (["serve", "--transport", "rpc", "--rpc-master", "127.0.0.1:99999", "--workers", "1"],
                   "--rpc-master: '127.0.0.1:99999' is not HOST:PORT (a port 1..65535)"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_malformed_address_is_one_line_exit_2_and_starts_nothing(mistake, capsys, tmp_path):
    argv, says = MISTAKES[mistake]
    command = argv[0]
    written = tmp_path / "written"  # what each command would write once it had started
    files = {"worker": ["--out", str(written), "--progress-file", str(written)],
             "serve": ["--ready-file", str(written), "--out", str(written)]}.get(command, [])
    started = time.monotonic()
    assert main([*argv, *files]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"psrv {command}: error: {says}"), err
    assert not written.exists(), "the command started before its address was checked"
    assert time.monotonic() - started < 10, "refused late: something waited or connected first"


@pytest.mark.timeout(60)
def test_a_config_file_bind_out_of_range_is_refused_as_the_option_it_sets(capsys, tmp_path):
    config = tmp_path / "server.json"
    config.write_text(json.dumps({"bind": "tcp://0.0.0.0:70000", "workers": 1}))
    assert main(["serve", "--config", str(config), "--ready-file", str(tmp_path / "ready")]) == 2
    err = capsys.readouterr().err
    assert err == ("psrv serve: error: --bind: 'tcp://0.0.0.0:70000': port 70000 is out of range; a port is "
                   "0..65535 (0: any free port)\n"), err
    assert not (tmp_path / "ready").exists()


@pytest.mark.timeout(60)
def test_a_worker_config_file_address_is_named_as_the_file_s_key(capsys, tmp_path):
    config = tmp_path / "worker.json"
    config.write_text(json.dumps({"servers": ["127.0.0.1:5555"]}))
    assert main(["worker", "--config", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"psrv worker: error: --config {config}: servers: '127.0.0.1:5555' is not an address"), err
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_worker_top_and_admin_refuse_before_importing_torch():
    """Said in well under the 2 s torch's import takes: the check needs only the config tree."""
    import subprocess
    import sys

    from tests.helpers import ROOT
    code = ("import sys; from psrv.cli.main import main; "
            "codes = [main([*c.split(), '--servers', '127.0.0.1:5555']) for c in ('worker', 'top', 'admin stats')]; "
            "sys.exit(0 if codes == [2, 2, 2] and 'torch' not in sys.modules else 1)")
    done = subprocess.run([sys.executable, "-P", "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("is not an address; write tcp://HOST:PORT") == 3, done.stderr
