"""`psrv admin`: STATS, CHECKPOINT or SHUTDOWN sent to running servers."""
from __future__ import annotations

import argparse
import json

from psrv.cli.common import log_level
from psrv.config.address_form import ZMQ_SCHEMES, check_shard_addresses


def add(sub) -> None:
    d = sub.add_parser("admin", help="send STATS, CHECKPOINT or SHUTDOWN to running servers",
                       description="CHECKPOINT and SHUTDOWN need servers started with --curve-keys. "
                       "Example: psrv admin checkpoint --servers tcp://10.0.0.1:5555 --curve-keys keys")
    d.add_argument("action", choices=("stats", "checkpoint", "shutdown"))
    d.add_argument("--servers", required=True, help="comma-separated shard addresses, tcp://HOST:PORT")
    d.add_argument("--curve-keys", default="", metavar="DIR", help="connect with CURVE as admin (DIR/admin.key_secret)")
    log_level(d, "WARNING")


def command(a: argparse.Namespace) -> int:
    addresses = check_shard_addresses(a.servers.split(","), option="--servers", schemes=ZMQ_SCHEMES, files=False)
    if not addresses:
        raise ValueError("--servers: name at least one shard address (tcp://HOST:PORT)")
    from psrv.client.admin import admin_request  # with torch: after the check
    from psrv.protocol import MsgType
    for address in addresses:
        answer = admin_request(address, MsgType[a.action.upper()], curve_keys=a.curve_keys)
        print(json.dumps({"server": address, **answer}))
    return 0
