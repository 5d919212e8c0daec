"""`psrv top`: a live per-shard view of running servers, polled with STATS messages.

    psrv top --servers tcp://10.0.0.1:5555,tcp://10.0.0.2:5555 --interval 1
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from psrv.cli.common import log_level
from psrv.config.address_form import ZMQ_SCHEMES, check_shard_addresses

COLUMNS = ("shard", "address", "mode", "version", "active", "clock min/max", "staleness mean/max",
           "updates/s", "pushes", "wait s")
CLEAR = "\x1b[H\x1b[2J"


@dataclass
class Poll:
    """One shard's STATS answer (`stats` is ShardService.summary()), or why there is none."""
    address: str
    at: float
    stats: dict | None = None
    error: str = ""


class StatsPoller:
    """Sends STATS to every shard and collects the answers; a shard that does not answer
    within `timeout` seconds is reported, and its queued request dropped, never waited on."""

    def __init__(self, addresses: Sequence[str], *, timeout: float = 2.0, transport: str = "zmq"):
        if not addresses:
            raise ValueError("give at least one server address, e.g. --servers tcp://127.0.0.1:5555")
        self.addresses = list(addresses)
        self.timeout = timeout
        self._seq = itertools.count(1)
        from psrv.transport import create_client  # here: the protocol and transports import torch, which
        self._net = create_client(transport, self.addresses)  # no other command's start should pay for

    def poll(self) -> list[Poll]:
        from psrv.protocol import Message, MsgType, ProtocolError, decode, encode
        seq = next(self._seq)
        for shard in range(len(self.addresses)):
            self._net.send(shard, encode(Message(MsgType.STATS, seq=seq)))
        polls: dict[int, Poll] = {}
        deadline = time.monotonic() + self.timeout
        while len(polls) < len(self.addresses):
            left = deadline - time.monotonic()
            item = self._net.recv(max(0.0, left)) if left > 0 else None
            if item is None:
                break
            shard, frames = item
            try:
                msg = decode(frames)
            except ProtocolError as exc:
                polls[shard] = Poll(self.addresses[shard], time.monotonic(), error=f"bad reply: {exc}")
                continue
            if msg.seq != seq:  # a late answer to an earlier poll
                continue
            if msg.type == MsgType.STATS:
                polls[shard] = Poll(self.addresses[shard], time.monotonic(), stats=dict(msg.fields))
            else:
                polls[shard] = Poll(self.addresses[shard], time.monotonic(),
                                    error=f"{msg.type.name}: {msg.fields.get('message', '')}")
        for shard, address in enumerate(self.addresses):
            if shard not in polls:
                self._net.reconnect(shard)  # drop the unanswered request rather than queue more
                polls[shard] = Poll(address, time.monotonic(),
                                    error=f"no answer within {self.timeout:g}s (is the server running?)")
        return [polls[s] for s in range(len(self.addresses))]

    def close(self) -> None:
        self._net.close()


def _mean(hist: dict) -> float:
    n = sum(hist.values())
    return sum(int(k) * v for k, v in hist.items()) / n if n else 0.0


def rows(current: list[Poll], previous: list[Poll] | None = None) -> list[tuple[str, ...]]:
    """One row of COLUMNS per shard; updates/s comes from the change since `previous`."""
    out = []
    for i, p in enumerate(current):
        if p.stats is None:
            out.append((str(i), p.address, "-", "-", "-", "-", "-", "-", "-", p.error))
            continue
        s = p.stats
        clocks = list(s.get("clocks", {}).values())
        hist = s.get("staleness_histogram", {})
        rate = "-"
        before = previous[i] if previous and i < len(previous) else None
        if before is not None and before.stats is not None and p.at > before.at:
            rate = f"{(s['updates_applied'] - before.stats['updates_applied']) / (p.at - before.at):.1f}"
        out.append((str(s.get("shard", i)), p.address, str(s.get("mode", "?")), str(s.get("version", 0)),
                    f"{len(s.get('active', []))}/{s.get('workers', '?')}",
                    f"{min(clocks)}/{max(clocks)}" if clocks else "-",
                    f"{_mean(hist):.2f}/{max((int(k) for k in hist), default=0)}",
                    rate, str(s.get("pushes", 0)), f"{s.get('wait_seconds', 0.0):.1f}"))
    return out


def format_table(table: list[tuple[str, ...]]) -> str:
    """COLUMNS and `table` as aligned plain text."""
    widths = [max(len(c), *(len(r[j]) for r in table)) for j, c in enumerate(COLUMNS)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
                     for cells in [COLUMNS, *table])


def _rich_table(table: list[tuple[str, ...]], title: str):
    from rich.table import Table
    t = Table(title=title)
    for c in COLUMNS:
        t.add_column(c, justify="left" if c in ("address", "mode") else "right")
    for r in table:
        t.add_row(*r, style="red" if r[2] == "-" else None)
    return t


def _have_rich() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def top(addresses: Sequence[str], *, interval: float = 1.0, once: bool = False, timeout: float = 2.0,
        transport: str = "zmq", out: TextIO = sys.stdout, plain: bool | None = None) -> int:
    """Poll the shards every `interval` seconds and redraw the table; Ctrl-C ends it.

    `once`: poll twice, `interval` apart (for updates/s), print one table and return; 1 if a shard
    did not answer. `plain` forces plain text (default: rich when installed and `out` is a terminal).
    """
    if interval <= 0:
        raise ValueError(f"--interval must be positive; got {interval}")
    if plain is None:
        plain = not (_have_rich() and out.isatty())
    poller = StatsPoller(addresses, timeout=timeout, transport=transport)
    try:
        if once:
            return _once(poller, interval, out)
        return _live(poller, interval, out, plain)
    except KeyboardInterrupt:
        return 0
    finally:
        poller.close()


def _once(poller: StatsPoller, interval: float, out: TextIO) -> int:
    first = poller.poll()
    current = first
    if any(p.stats is not None for p in first):
        time.sleep(interval)
        current = poller.poll()
    print(format_table(rows(current, first)), file=out)
    missing = [f"shard {i} at {p.address}: {p.error}" for i, p in enumerate(current) if p.stats is None]
    for line in missing:
        print(f"psrv top: {line}", file=sys.stderr)
    return 1 if missing else 0


def _title(n: int) -> str:
    return f"psrv top: {n} shard(s), {time.strftime('%H:%M:%S')} (Ctrl-C quits)"


def _live(poller: StatsPoller, interval: float, out: TextIO, plain: bool) -> int:
    previous = None
    if plain:
        while True:
            current = poller.poll()
            out.write(CLEAR + _title(len(current)) + "\n\n" + format_table(rows(current, previous)) + "\n")
            out.flush()
            previous = current
            time.sleep(interval)
    from rich.console import Console
    from rich.live import Live
    with Live(console=Console(file=out), auto_refresh=False) as live:
        while True:
            current = poller.poll()
            live.update(_rich_table(rows(current, previous), _title(len(current))), refresh=True)
            previous = current
            time.sleep(interval)


def add(sub) -> None:
    t = sub.add_parser("top", help="live per-shard view of running servers",
                       description="Poll the shards with STATS and show version, active workers, clocks, "
                       "staleness and updates/s. Example: psrv top --servers tcp://10.0.0.1:5555,tcp://10.0.0.2:5555")
    t.add_argument("--servers", required=True, help="comma-separated shard addresses, tcp://HOST:PORT, "
                   "in shard order")
    t.add_argument("--interval", type=float, default=1.0, help="seconds between polls (default: %(default)s)")
    t.add_argument("--once", action="store_true", help="print one table (two polls, --interval apart) and exit")
    t.add_argument("--timeout", type=float, default=2.0,
                   help="seconds to wait for a shard's answer (default: %(default)s)")
    log_level(t, "WARNING")


def command(a: argparse.Namespace) -> int:
    addresses = check_shard_addresses(a.servers.split(","), option="--servers", schemes=ZMQ_SCHEMES, files=False)
    return top(list(addresses), interval=a.interval, once=a.once, timeout=a.timeout)
