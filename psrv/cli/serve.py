"""`psrv serve`: one shard of the parameters, in this process."""
from __future__ import annotations

import argparse
import logging
import os
import signal
from pathlib import Path

from psrv.atomic import write_json
from psrv.cli.common import base_config, config_arg, log_level, metrics_args, metrics_file, unused_staleness
from psrv.config import ServerConfig
from psrv.config.address_form import RPC_SCHEMES, address_problem
from psrv.config.cli_args import add_config_arguments, config_from_args


FENCED = 3  # the exit status of a primary another replica took the shard over from (docs/reliability.md)


def add(sub) -> None:
    s = sub.add_parser("serve", help="run one server shard", description="Serve one shard of the parameters. "
                       "Exits 0 once all --workers have left. Example: psrv serve --bind tcp://0.0.0.0:5555 "
                       "--shard 0 --num-shards 2 --workers 4 --mode ssp --staleness 2")
    s.add_argument("--rpc-master", metavar="HOST:PORT", help="--transport rpc: the rendezvous of the job's RPC "
                   "world, hosted by shard 0 (replaces --bind); workers then use --servers "
                   "rpc://HOST:PORT/server-0,...")
    config_arg(s, "shard's config")
    add_config_arguments(s, ServerConfig)
    log_level(s)
    metrics_args(s)
    s.add_argument("--out", type=Path, help="write the shard's statistics (JSON) here at exit")
    s.add_argument("--ready-file", type=Path, help="write the bound address here once listening")


def command(a: argparse.Namespace) -> int:
    extra = {"bind": _rpc_bind(a.rpc_master)} if a.rpc_master else {}
    cfg = config_from_args(ServerConfig, a, base=base_config(a), extra=extra)
    if (cfg.transport == "rpc") != cfg.bind.startswith("rpc://"):
        raise ValueError("--transport rpc and --rpc-master HOST:PORT go together (shard 0 hosts the rendezvous)")
    unused_staleness(a, cfg.mode)
    # torch only now: a mistake in the options above is refused without the seconds its import takes
    from psrv.device import check_device
    from psrv.history import History
    from psrv.process import freeze_imports, stop_on_signals, tune_malloc, use_threads
    from psrv.server.faults import InjectedFaults
    from psrv.server.run import serve
    freeze_imports()
    check_device(cfg.device)
    tune_malloc()
    threads = use_threads(cfg.threads, say=False)  # said once bound: a port in use stays a one-line refusal
    faults = os.environ.get("PSRV_FAULTS")  # a nemesis's injected faults (psrv run's DIR/faults)

    def ready(server) -> None:
        logging.getLogger("psrv.process").info("torch threads %d (%s)", *threads)
        # SIGTERM ends the loop cleanly (the shard writes its final checkpoint), as systemd, k8s and psrv run expect
        stop_on_signals(server.stop, (signal.SIGTERM, signal.SIGINT))
    summary = serve(cfg, metrics_port=a.metrics_port, metrics_file=metrics_file(a), metrics_host=a.metrics_host,
                    metrics_linger=a.metrics_linger, ready_file=a.ready_file, on_ready=ready,
                    history=History.from_env(f"region-{cfg.region}-shard-{cfg.shard}" if cfg.upstream else f"shard-{cfg.shard}"),
                    faults=InjectedFaults(Path(faults) / f"{os.getpid()}.json") if faults else None)
    if a.out:
        write_json(a.out, summary)
    return FENCED if summary.get("fenced") else 0  # another replica took this shard over (its log says which)


def _rpc_bind(master: str) -> str:
    """--rpc-master HOST:PORT as the shard's bind, rpc://HOST:PORT; ValueError, in one line, for another form
    (the bind's own check would name --bind, which the user did not type)."""
    bind = f"rpc://{master.strip()}"
    if address_problem(bind, bind=True, schemes=RPC_SCHEMES):
        raise ValueError(f"--rpc-master: {master!r} is not HOST:PORT (a port 1..65535), the rendezvous that "
                         "shard 0 hosts")
    return bind
