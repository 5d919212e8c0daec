"""The raw-transport baseline: a pyzmq ROUTER that echoes every message back, zero-copy.

This is the yardstick psrv's wire is measured against, so it uses pyzmq directly and nothing of psrv.
It gets the same malloc settings psrv's processes use (psrv.process.tune_malloc):
with glibc's defaults every received big message faults in fresh pages, and an untuned echo of
64 MB was slower than psrv's whole PUSH_PULL, which measures the allocator rather than the wire.
Run as a process: python -m psrv.experiments.bench.raw_zmq ENDPOINT READY_FILE
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import zmq

from psrv.process import tune_malloc


def echo_server(endpoint: str, ready: Path) -> None:
    tune_malloc()
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint.replace(":0", ":*") if endpoint.endswith(":0") else endpoint)
    ready.write_text(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    while True:
        frames = sock.recv_multipart(copy=False)
        if len(frames) == 2 and frames[1].bytes == b"stop":
            break
        sock.send_multipart(frames, copy=False)
    sock.close(linger=0)


class EchoClient:
    def __init__(self, address: str):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.connect(address)

    def round_trip(self, payload) -> float:
        t0 = time.perf_counter()
        self.sock.send(payload, copy=False)
        self.sock.recv(copy=False)
        return time.perf_counter() - t0

    def stop(self) -> None:
        self.sock.send(b"stop")
        self.sock.close(linger=0)


if __name__ == "__main__":
    echo_server(sys.argv[1], Path(sys.argv[2]))
