"""`psrv serve | worker | run | experiment`: parse, build a config, call. Nothing else lives here."""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from psrv.config import (MODES, OPTIMIZERS, RUN_MODES, TRANSPORTS, WIRE_DTYPES, FaultConfig, OptimConfig,
                         ServerConfig, WorkerConfig)

EPILOG = "Docs: README.md (quick start), docs/architecture.md, docs/experiments.md."


def _server_args(p: argparse.ArgumentParser, *, modes=MODES) -> None:
    g = p.add_argument_group("consistency and optimizer (held by the servers)")
    g.add_argument("--mode", choices=modes, default="ssp", help="sync (BSP), async (ASP) or ssp (default: %(default)s)")
    g.add_argument("--staleness", type=int, default=2, help="SSP bound s: no worker runs more than s clocks "
                   "ahead of the slowest (default: %(default)s)")
    g.add_argument("--backup-workers", type=int, default=0, help="sync: apply a clock once N-b gradients are in")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd", help="server-side optimizer (default: %(default)s)")
    g.add_argument("--lr", type=float, default=0.05, help="learning rate (default: %(default)s)")
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default: %(default)s)")
    g.add_argument("--nesterov", action="store_true", help="SGD with Nesterov momentum")
    g.add_argument("--weight-decay", type=float, default=0.0, help="weight decay (default: %(default)s)")
    g.add_argument("--worker-timeout", type=float, default=10.0,
                   help="seconds of silence before a worker leaves the active set (default: %(default)s)")


def _worker_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("training job")
    g.add_argument("--job", default="digits_mlp", help="digits_mlp, mnist1d_mlp, synthetic_mlp or "
                   "package.module:factory (default: %(default)s)")
    g.add_argument("--steps", type=int, default=300, help="steps per worker (default: %(default)s)")
    g.add_argument("--batch-size", type=int, default=32, help="per-worker batch (default: %(default)s)")
    g.add_argument("--seed", type=int, default=0, help="seeds the model, the data order and the faults")
    g.add_argument("--eval-every", type=int, default=0, help="rank 0 evaluates every K steps (0: start and end)")
    g.add_argument("--wire-dtype", choices=WIRE_DTYPES, default="float32", help="send gradients as this dtype "
                   "(bfloat16/float16 halve the push; the servers apply them in float32; default: %(default)s)")
    g.add_argument("--no-overlap", dest="overlap", action="store_false", help="with several shards, push only "
                   "after backward ends (default: each shard's slice goes out as soon as backward finishes it)")
    f = p.add_argument_group("emulated disturbances (deterministic, seeded)")
    f.add_argument("--compute-ms", type=float, default=0.0, help="extra emulated compute per step")
    f.add_argument("--straggler", default="", metavar="RANK:FACTOR", help="a persistently slow worker")
    f.add_argument("--transient-stragglers", default="", metavar="P:FACTOR",
                   help="each step is FACTOR x slower with probability P")
    f.add_argument("--net-delay-ms", type=float, default=0.0, help="user-space delay before each send")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="cpu or cuda:K (default: %(default)s)")
    p.add_argument("--transport", choices=TRANSPORTS, default="zmq", help="default: %(default)s")
    p.add_argument("--log-level", default="INFO", help="logging level (default: %(default)s)")


def _metrics_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port "
                   "(0: a free port, written beside --out as .metrics)")
    p.add_argument("--metrics-linger", type=float, default=0.0,
                   help="keep /metrics up this many seconds after the end, for a last scrape")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="address /metrics listens on; 0.0.0.0 lets other hosts scrape (default: %(default)s)")


def _reliability_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("reliability and security (docs/reliability.md, docs/security.md)")
    g.add_argument("--checkpoint-dir", default="", metavar="DIR", help="write this shard's checkpoint here "
                   "(atomically) every --checkpoint-every seconds, on CHECKPOINT, on SIGTERM and at exit")
    g.add_argument("--checkpoint-every", type=float, default=0.0, metavar="SECONDS",
                   help="seconds between checkpoints; 0: only at exit and on CHECKPOINT (default: %(default)s)")
    g.add_argument("--resume", action="store_true", help="restore the shard from --checkpoint-dir first")
    g.add_argument("--curve-keys", default="", metavar="DIR", help="CURVE encryption, and admit only the clients "
                   "whose public key is in DIR (made by psrv keygen); enables CHECKPOINT and SHUTDOWN")
    g.add_argument("--max-message-bytes", type=int, default=1 << 31, help="drop (and disconnect) any bigger "
                   "message before it is read (default: %(default)s)")
    g.add_argument("--nonfinite", choices=("reject", "skip"), default="reject", help="a gradient with NaN/Inf "
                   "is answered with ERROR (reject) or acknowledged and not applied (skip); both are counted "
                   "(default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="psrv", description="Parameter-server training with sync, async "
                                     "and SSP consistency, and a harness that compares them with DDP.",
                                     epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("serve", help="run one server shard", description="Serve one shard of the parameters. "
                       "Exits 0 once all --workers have left. Example: psrv serve --bind tcp://0.0.0.0:5555 "
                       "--shard 0 --num-shards 2 --workers 4 --mode ssp --staleness 2")
    s.add_argument("--bind", default="tcp://127.0.0.1:5555", help="address to listen on; port 0 picks a free "
                   "port (default: %(default)s; bind 0.0.0.0 only on a trusted network)")
    s.add_argument("--rpc-master", metavar="HOST:PORT", help="--transport rpc: the rendezvous of the job's RPC "
                   "world, hosted by shard 0 (replaces --bind); workers then use --servers "
                   "rpc://HOST:PORT/server-0,...")
    s.add_argument("--shard", type=int, default=0, help="this shard's index (default: %(default)s)")
    s.add_argument("--num-shards", type=int, default=1, help="number of shards in all (default: %(default)s)")
    s.add_argument("--workers", type=int, default=1, help="number of workers N (default: %(default)s)")
    _server_args(s)
    _common(s)
    _metrics_args(s)
    s.add_argument("--out", type=Path, help="write the shard's statistics (JSON) here at exit")
    s.add_argument("--ready-file", type=Path, help="write the bound address here once listening")
    _reliability_args(s)

    w = sub.add_parser("worker", help="run one worker", description="Train one worker against the servers. "
                       "Example: psrv worker --servers tcp://10.0.0.1:5555,tcp://10.0.0.2:5555 --rank 0 "
                       "--world-size 4 --job digits_mlp --steps 300")
    w.add_argument("--servers", required=True, help="comma-separated shard addresses, in shard order; @FILE "
                   "waits for FILE (a server's --ready-file) and reads the address from it")
    w.add_argument("--rank", type=int, default=0, help="this worker's rank (default: %(default)s)")
    w.add_argument("--world-size", type=int, default=1, help="number of workers (default: %(default)s)")
    _worker_args(w)
    _common(w)
    w.add_argument("--mode", default="", help="label for this worker's metrics (the servers hold the mode)")
    _metrics_args(w)
    w.add_argument("--out", type=Path, help="write this worker's record (JSON) here")
    w.add_argument("--params-out", type=Path, help="save the final flat parameter vector here (torch.save)")
    w.add_argument("--progress-file", type=Path, help="keep the number of finished steps in this file")
    w.add_argument("--curve-keys", default="", metavar="DIR", help="connect with CURVE as worker-RANK "
                   "(DIR holds server.key and worker-RANK.key_secret; see psrv keygen)")

    k = sub.add_parser("keygen", help="make CURVE key pairs for servers, workers and admin",
                       description="Write DIR/server.key(_secret), DIR/worker-K.key(_secret) for K < --workers "
                       "and DIR/admin.key(_secret). Servers admit the clients whose .key is in DIR. "
                       "Example: psrv keygen keys --workers 4")
    k.add_argument("dir", type=Path, help="directory for the keys (created, mode 0700)")
    k.add_argument("--workers", type=int, default=1, help="worker key pairs to make (default: %(default)s)")
    k.add_argument("--log-level", default="WARNING", help="logging level (default: %(default)s)")

    d = sub.add_parser("admin", help="send STATS, CHECKPOINT or SHUTDOWN to running servers",
                       description="CHECKPOINT and SHUTDOWN need servers started with --curve-keys. "
                       "Example: psrv admin checkpoint --servers tcp://10.0.0.1:5555 --curve-keys keys")
    d.add_argument("action", choices=("stats", "checkpoint", "shutdown"))
    d.add_argument("--servers", required=True, help="comma-separated shard addresses")
    d.add_argument("--curve-keys", default="", metavar="DIR", help="connect with CURVE as admin (DIR/admin.key_secret)")
    d.add_argument("--log-level", default="WARNING", help="logging level (default: %(default)s)")

    r = sub.add_parser("run", help="run a whole local cluster on 127.0.0.1",
                       description="Start --servers shards and --workers workers on 127.0.0.1, train to the "
                       "end, print a summary and write DIR/summary.json, steps.csv and evals.csv. "
                       "Example: psrv run --mode sync --workers 4 --steps 200")
    r.add_argument("--servers", type=int, default=2, help="server shards (default: %(default)s)")
    r.add_argument("--workers", type=int, default=2, help="workers (default: %(default)s)")
    _server_args(r, modes=RUN_MODES)
    _worker_args(r)
    _common(r)
    r.add_argument("--metrics", action="store_true", help="every process serves /metrics; writes DIR/targets.json")
    r.add_argument("--metrics-linger", type=float, default=0.0,
                   help="with --metrics: keep /metrics up this many seconds after the end")
    r.add_argument("--out", type=Path, default=Path("runs/latest"), help="output directory (default: %(default)s)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")

    e = sub.add_parser("experiment", help="compare modes on one job as a TOML spec says",
                       description="Run every variant and repeat of SPEC, then write summary.csv, plots "
                       "and report.md. Finished runs are skipped, so an interrupted experiment resumes. "
                       "Example: psrv experiment experiments/specs/modes.toml --out runs/modes")
    e.add_argument("spec", type=Path, help="experiment spec (TOML), e.g. experiments/specs/modes.toml")
    e.add_argument("--out", type=Path, default=None, help="output directory (default: runs/<spec name>)")
    e.add_argument("--log-level", default="WARNING", help="logging level (default: %(default)s)")

    t = sub.add_parser("top", help="live per-shard view of running servers",
                       description="Poll the shards with STATS and show version, active workers, clocks, "
                       "staleness and updates/s. Example: psrv top --servers tcp://10.0.0.1:5555,tcp://10.0.0.2:5555")
    t.add_argument("--servers", required=True, help="comma-separated shard addresses, in shard order")
    t.add_argument("--interval", type=float, default=1.0, help="seconds between polls (default: %(default)s)")
    t.add_argument("--once", action="store_true", help="print one table (two polls, --interval apart) and exit")
    t.add_argument("--timeout", type=float, default=2.0,
                   help="seconds to wait for a shard's answer (default: %(default)s)")
    t.add_argument("--log-level", default="WARNING", help="logging level (default: %(default)s)")
    return parser


def optim_config(a: argparse.Namespace) -> OptimConfig:
    return OptimConfig(name=a.optimizer, lr=a.lr, momentum=a.momentum if a.optimizer == "sgd" else 0.0,
                       nesterov=a.nesterov, weight_decay=a.weight_decay)


def fault_config(a: argparse.Namespace) -> FaultConfig:
    return FaultConfig(compute_ms=a.compute_ms, straggler=a.straggler,
                       transient_stragglers=a.transient_stragglers, net_delay_ms=a.net_delay_ms)


def _serve(a: argparse.Namespace) -> int:
    from psrv.server.run import serve
    if (a.transport == "rpc") != bool(a.rpc_master):
        raise ValueError("--transport rpc and --rpc-master HOST:PORT go together (shard 0 hosts the rendezvous)")
    bind = f"rpc://{a.rpc_master}" if a.rpc_master else a.bind
    cfg = ServerConfig(shard=a.shard, num_shards=a.num_shards, workers=a.workers, bind=bind, mode=a.mode,
                       staleness=a.staleness, backup_workers=a.backup_workers, optim=optim_config(a),
                       device=a.device, transport=a.transport, worker_timeout=a.worker_timeout,
                       checkpoint_dir=a.checkpoint_dir, checkpoint_every=a.checkpoint_every, resume=a.resume,
                       curve_keys=a.curve_keys, max_message_bytes=a.max_message_bytes, nonfinite=a.nonfinite)
    summary = serve(cfg, metrics_port=a.metrics_port, metrics_file=_metrics_file(a), metrics_host=a.metrics_host,
                    metrics_linger=a.metrics_linger, ready_file=a.ready_file)
    if a.out:
        _write_json(a.out, summary)
    return 0


def server_addresses(text: str, *, wait: float) -> tuple[str, ...]:
    """Shard addresses from --servers. An entry @FILE is read from FILE, a server's --ready-file, once
    it exists: a worker can start (and import torch) while its servers are still starting."""
    out = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        if item.startswith("@"):
            path, deadline = Path(item[1:]), time.monotonic() + wait
            while not (path.exists() and path.read_text().strip()):
                if time.monotonic() > deadline:
                    raise ValueError(f"server address file {path} did not appear within {wait:.0f}s")
                time.sleep(0.02)
            item = path.read_text().strip()
        out.append(item)
    return tuple(out)


def _worker(a: argparse.Namespace) -> int:
    import torch
    from workers.loop import train
    cfg = WorkerConfig(servers=server_addresses(a.servers, wait=120.0), rank=a.rank,
                       world_size=a.world_size, job=a.job, steps=a.steps, batch_size=a.batch_size, seed=a.seed,
                       device=a.device, transport=a.transport, eval_every=a.eval_every, faults=fault_config(a),
                       curve_keys=a.curve_keys, wire_dtype=a.wire_dtype, overlap=a.overlap)
    progress = None
    if a.progress_file:
        progress = lambda step: step % 10 == 0 and a.progress_file.write_text(str(step))  # noqa: E731
    metrics = None
    if a.metrics_port is not None:
        from psrv.metrics import WorkerMetrics
        from psrv.server.run import start_metrics
        metrics = start_metrics(WorkerMetrics, a.metrics_port, _metrics_file(a), host=a.metrics_host,
                                worker=a.rank, mode=a.mode)
    record = train(cfg, progress=progress, metrics=metrics)
    if metrics is not None and a.metrics_linger > 0:
        time.sleep(a.metrics_linger)
    params = record.pop("final_params")
    if a.params_out:
        a.params_out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(params, a.params_out)
    if a.out:
        _write_json(a.out, record)
    return 0


def _run(a: argparse.Namespace) -> int:
    from experiments.launch import RunFailed, run_local, run_options_from_args
    from experiments.summary import format_summary
    try:
        summary = run_local(run_options_from_args(a), progress=not a.no_progress)
    except RunFailed as exc:
        print(f"psrv run failed: {exc}", file=sys.stderr)
        return 1
    print(format_summary(summary))
    print(f"\nwrote {a.out}/summary.json, steps.csv, evals.csv")
    return 0


def _experiment(a: argparse.Namespace) -> int:
    from experiments.runner import run_experiment
    return run_experiment(a.spec, out=a.out)


def _top(a: argparse.Namespace) -> int:
    from psrv.top import top
    return top([s.strip() for s in a.servers.split(",") if s.strip()], interval=a.interval, once=a.once,
               timeout=a.timeout)


def _keygen(a: argparse.Namespace) -> int:
    from psrv.transport.curve import keygen
    made = keygen(a.dir, workers=a.workers)
    print(f"wrote {len(made)} key files to {a.dir}; give each worker host server.key and its worker-K pair")
    return 0


def _admin(a: argparse.Namespace) -> int:
    from psrv.client import admin_request
    from psrv.protocol import MsgType
    for address in (s.strip() for s in a.servers.split(",") if s.strip()):
        answer = admin_request(address, MsgType[a.action.upper()], curve_keys=a.curve_keys)
        print(json.dumps({"server": address, **answer}))
    return 0


def _metrics_file(a: argparse.Namespace) -> Path | None:
    """Where a process announces its bound /metrics port: beside its --out file."""
    return a.out.with_suffix(".metrics") if a.out else None


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    role = {"serve": "server", "worker": f"worker {getattr(args, 'rank', '')}".strip()}.get(args.command, args.command)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format=f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s")
    try:
        return {"serve": _serve, "worker": _worker, "run": _run, "experiment": _experiment,
                "top": _top, "keygen": _keygen, "admin": _admin}[args.command](args)
    except ValueError as exc:  # bad input: say what to change, no traceback
        print(f"psrv {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        client = sys.modules.get("psrv.client")  # imported (with torch) only by the commands that talk to servers
        if isinstance(exc, TimeoutError) or (client is not None and isinstance(exc, client.PSError)):
            print(f"psrv {args.command}: {exc}", file=sys.stderr)  # a server refused us or never answered
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
