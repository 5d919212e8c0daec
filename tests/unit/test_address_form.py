"""The one check of an address's form (psrv/config/address_form.py): what it takes, the one line it says
for what it does not, and each place a user names an address going through it: the config keys `bind` and
`servers`, a transport's bind, the @FILE resolver, and psrv.Worker's `servers=`, PSRV_SERVERS, RANK and
WORLD_SIZE."""
import time

import pytest

from psrv.config import ConfigError, ServerConfig, WorkerConfig
from psrv.config.address_form import (RPC_SCHEMES, ZMQ_SCHEMES, address_problem, check_address,
                                      check_shard_addresses)

SHARD_ADDRESSES = ["tcp://127.0.0.1:5555", "tcp://10.0.0.2:1", "tcp://node-7.cluster.local:65535",
                   "tcp://[::1]:5555", "ipc:///tmp/psrv-0.sock", "inproc://shard-0", "rpc://127.0.0.1:29500/server-3"]
BINDS = ["tcp://127.0.0.1:0", "tcp://0.0.0.0:5555", "tcp://*:5555", "tcp://127.0.0.1:*", "tcp://eth0:65535",
         "tcp://[::1]:0", "ipc:///tmp/psrv-0.sock", "rpc://127.0.0.1:29500"]


@pytest.mark.parametrize("address", SHARD_ADDRESSES)
def test_every_form_a_transport_connects_to_is_taken(address):
    assert address_problem(address) is None
    assert check_address(f"  {address} ", option="--servers") == address


@pytest.mark.parametrize("bind", BINDS)
def test_every_form_a_server_binds_is_taken_port_0_and_star_meaning_a_free_port(bind):
    assert address_problem(bind, bind=True) is None


SHARD_MISTAKES = {  # a shard address -> the one line, after "--servers: "
    "127.0.0.1:5555": "'127.0.0.1:5555' is not an address; write tcp://HOST:PORT (comma-separated, in shard order)",
    "tcp://127.0.0.1:99999": "'tcp://127.0.0.1:99999': port 99999 is out of range; a port is 1..65535",
    "tcp://127.0.0.1:65536": "'tcp://127.0.0.1:65536': port 65536 is out of range; a port is 1..65535",
    "tcp://127.0.0.1:0": "'tcp://127.0.0.1:0': port 0 is out of range; a port is 1..65535",
    "tcp://127.0.0.1:http": "'tcp://127.0.0.1:http': port 'http' is not a number; write tcp://HOST:PORT",
    "tcp://127.0.0.1": "'tcp://127.0.0.1' needs a host and a port; write tcp://HOST:PORT",
    "tcp://:5555": "'tcp://:5555' needs a host and a port",
    "tcp://127.0.0.1:5555/": "'tcp://127.0.0.1:5555/' has a path after its port; write tcp://HOST:PORT",
    "tcp://*:5555": "'tcp://*:5555': host * (any interface) is only for a zmq server's --bind",
    "http://127.0.0.1:5555": "'http://127.0.0.1:5555': http:// is not a scheme psrv takes here; write "
                             "tcp://HOST:PORT or ipc://PATH or rpc://HOST:PORT/server-I",
    "tcp://127.0.0.1: 5555": "'tcp://127.0.0.1: 5555' is not an address",
    "ipc://": "'ipc://' is not an address; write ipc://PATH",
    "rpc://127.0.0.1:29500": "'rpc://127.0.0.1:29500' is not an address; write rpc://HOST:PORT/server-I",
    "rpc://127.0.0.1:29500/shard-0": "is not an address; write rpc://HOST:PORT/server-I",
}


@pytest.mark.parametrize("address", SHARD_MISTAKES)
def test_a_malformed_shard_address_is_one_line_naming_the_option_and_the_form(address):
    with pytest.raises(ValueError) as refused:
        check_shard_addresses(["tcp://127.0.0.1:5555", address], option="--servers")
    said = str(refused.value)
    assert said.startswith("--servers: ") and SHARD_MISTAKES[address] in said and "\n" not in said, said


BIND_MISTAKES = {  # a bind -> what the one line says
    "tcp://127.0.0.1:99999": "'tcp://127.0.0.1:99999': port 99999 is out of range; a port is 0..65535 "
                             "(0: any free port)",
    "tcp://127.0.0.1:-1": "'tcp://127.0.0.1:-1': port '-1' is not a number",
    "127.0.0.1:5555": "'127.0.0.1:5555' is not an address; write tcp://HOST:PORT",
    "rpc://127.0.0.1:0": "'rpc://127.0.0.1:0': port 0 is out of range; a port is 1..65535",
    "rpc://127.0.0.1:29500/server-0": "is not an address; write rpc://HOST:PORT",
}


@pytest.mark.parametrize("bind", BIND_MISTAKES)
def test_a_bind_out_of_range_or_malformed_is_refused(bind):
    assert BIND_MISTAKES[bind] in address_problem(bind, bind=True)


def test_a_transport_is_told_the_forms_it_takes():
    assert "write tcp://HOST:PORT or ipc://PATH (comma" in address_problem("rpc://h:1/server-0", schemes=ZMQ_SCHEMES,
                                                                          listed=True)
    assert "write rpc://HOST:PORT/server-I" in address_problem("tcp://h:1", schemes=RPC_SCHEMES)
    assert address_problem("127.0.0.1:5555", schemes=RPC_SCHEMES) == ("'127.0.0.1:5555' is not an address; "
                                                                      "write rpc://HOST:PORT/server-I")


def test_a_list_skips_blanks_keeps_at_file_entries_for_their_reader_and_names_the_first_bad_one():
    assert check_shard_addresses([" tcp://a:1", "", " @srv-1.addr "]) == ("tcp://a:1", "@srv-1.addr")
    with pytest.raises(ValueError, match=r"^top: '@srv-1.addr' is not an address"):
        check_shard_addresses(["@srv-1.addr"], option="top", files=False)
    with pytest.raises(ValueError, match=r"^x: 'b:2' is not an address"):
        check_shard_addresses(["tcp://a:1", "b:2", "c:3"], option="x")


def test_the_config_keys_bind_and_servers_are_checked_where_the_config_is_made():
    with pytest.raises(ConfigError, match=r"^bind: 'tcp://127.0.0.1:99999': port 99999 is out of range") as bad:
        ServerConfig(bind="tcp://127.0.0.1:99999")
    assert bad.value.key == "bind"
    assert ServerConfig(bind="tcp://127.0.0.1:65535").bind == "tcp://127.0.0.1:65535"
    with pytest.raises(ConfigError, match=r"^servers: '127.0.0.1:5555' is not an address") as bad:
        WorkerConfig(servers=("127.0.0.1:5555",))
    assert bad.value.key == "servers"
    assert WorkerConfig(servers=("@srv-0.addr", "tcp://h:1")).servers == ("@srv-0.addr", "tcp://h:1")


def test_a_transport_refuses_a_bind_zmq_would_cut_to_16_bits_before_anything_binds():
    from psrv.transport import create_server
    with pytest.raises(ValueError, match=r"^bind: 'tcp://127.0.0.1:99999': port 99999 is out of range"):
        create_server("zmq", "tcp://127.0.0.1:99999")
    with pytest.raises(ValueError, match=r"^bind: 'tcp://127.0.0.1:0': tcp:// is not a scheme psrv takes here; "
                                         r"write rpc://HOST:PORT"):
        create_server("rpc", "tcp://127.0.0.1:0")
    server = create_server("zmq", "tcp://127.0.0.1:0")  # the check lets a real bind through
    try:
        assert server.address.startswith("tcp://127.0.0.1:") and not server.address.endswith(":0")
    finally:
        server.close()


def test_an_address_file_is_checked_once_read_and_a_bad_literal_before_any_wait(tmp_path):
    from psrv.transport.addresses import split_addresses
    written = tmp_path / "srv-0.addr"
    written.write_text("127.0.0.1:5555\n")
    with pytest.raises(ValueError, match=rf"^--servers @{written}: '127.0.0.1:5555' is not an address"):
        split_addresses(f"@{written}", wait=5)
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"^--servers: 'localhost:1' is not an address"):
        split_addresses(f"@{tmp_path / 'never.addr'},localhost:1", wait=30)
    assert time.monotonic() - started < 5, "the bad literal waited for the file before it"


def test_psrv_worker_names_its_keyword_or_variable_for_a_bad_address(monkeypatch):
    import torch

    import psrv
    from psrv.client.keywords import servers_of
    with pytest.raises(ValueError, match=r"^psrv.Worker\(servers=...\): '127.0.0.1:5555' is not an address; "
                                         r"write tcp://HOST:PORT"):
        psrv.Worker(torch.nn.Linear(2, 1), ["127.0.0.1:5555"], rank=0, world_size=1)
    monkeypatch.setenv("PSRV_SERVERS", "tcp://127.0.0.1:5555,tcp://127.0.0.1:99999")
    with pytest.raises(ValueError, match=r"^psrv.Worker: PSRV_SERVERS: 'tcp://127.0.0.1:99999': port 99999 is out"):
        servers_of(None, wait=0)
    with pytest.raises(ValueError, match=r"'tcp://h:1': tcp:// is not a scheme psrv takes here; write rpc://"):
        servers_of(["tcp://h:1"], wait=0, transport="rpc")
    assert servers_of("tcp://a:1, tcp://b:2", wait=0) == ["tcp://a:1", "tcp://b:2"]  # one string, as PSRV_SERVERS


@pytest.mark.parametrize("variable, keyword", [("PSRV_SERVERS", "servers="), ("RANK", "rank="),
                                               ("WORLD_SIZE", "world_size=")])
def test_a_missing_variable_names_the_keyword_psrv_worker_really_takes(variable, keyword, monkeypatch):
    import inspect

    import psrv
    from psrv.client.keywords import env
    monkeypatch.delenv(variable, raising=False)
    with pytest.raises(ValueError) as missing:
        env(variable)
    said = str(missing.value)
    assert said.startswith(f"psrv.Worker: pass {keyword} or set {variable} in the environment"), said
    assert keyword[:-1] in inspect.signature(psrv.Worker.__init__).parameters  # a keyword that exists
