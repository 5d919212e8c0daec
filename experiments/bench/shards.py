"""A bench's `psrv serve`, for the smoke: the same shard served from a thread of the bench's process.

The full bench starts each shard as a process, as users run it, and measures that. The smoke only
proves each bench still runs (tests/integration/test_bench_smoke.py), and each process it starts costs
an import of torch; a ThreadShard stands in for the process where the bench reads nothing of the
shard's but its address, its exit, its --out summary and its CPU seconds (here: the bench process's).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path


class ThreadShard:
    """`psrv serve ARGS` (config options only; no --bind: 127.0.0.1, a free port) in a thread, with
    Popen's poll, wait and kill."""

    def __init__(self, *args: str, out: Path | None = None):
        import argparse

        from psrv.config import ServerConfig
        from psrv.config.cli_args import add_config_arguments, config_from_args
        from psrv.server.run import Server
        parser = argparse.ArgumentParser(prog="psrv serve")
        add_config_arguments(parser, ServerConfig)  # the config options of `psrv serve`
        ns = parser.parse_args(["--bind", "tcp://127.0.0.1:0", *args])
        self.server = Server(config_from_args(ServerConfig, ns)).start()
        self.address, self.out, self.pid = self.server.address, out, os.getpid()
        self.returncode: int | None = None

    def poll(self) -> int | None:
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                summary = self.server.join(timeout)
            except TimeoutError:
                raise subprocess.TimeoutExpired(["psrv serve"], timeout) from None
            if self.out is not None:
                self.out.write_text(json.dumps(summary))
            self.returncode = 0
        return self.returncode

    def kill(self) -> None:
        self.server.stop()
