"""`psrv keygen`: CURVE key pairs for servers, workers and admin."""
from __future__ import annotations

import argparse
from pathlib import Path

from psrv.cli.common import log_level


def add(sub) -> None:
    k = sub.add_parser("keygen", help="make CURVE key pairs for servers, workers and admin",
                       description="Write DIR/server.key(_secret), DIR/worker-K.key(_secret) for K < --workers "
                       "and DIR/admin.key(_secret). Servers admit the clients whose .key is in DIR. "
                       "Example: psrv keygen keys --workers 4")
    k.add_argument("dir", type=Path, help="directory for the keys (created, mode 0700)")
    k.add_argument("--workers", type=int, default=1, help="worker key pairs to make (default: %(default)s)")
    log_level(k, "WARNING")


def command(a: argparse.Namespace) -> int:
    from psrv.transport.curve import keygen
    made = keygen(a.dir, workers=a.workers)
    print(f"wrote {len(made)} key files to {a.dir}; give each worker host server.key and its worker-K pair")
    return 0
