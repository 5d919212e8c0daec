"""`psrv serve | worker | run | experiment`: parse, build a config, call. Nothing else lives here."""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from pathlib import Path

from psrv.config import RunConfig, ServerConfig, WorkerConfig
from psrv.config.cli_args import PREFIX, add_config_arguments, config_from_args, given, read_config_file
from psrv.experiments.simulate.config import NOT_SIMULATED, SimulationConfig
from psrv.atomic import write_json

EPILOG = "Docs: README.md (quick start), docs/architecture.md, docs/experiments.md."


def _config_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--config", type=Path, metavar="FILE", help=f"start from this {what} (JSON, as a run "
                   "directory's config.json holds it); the options given on the command line override it")


def _log_level(p: argparse.ArgumentParser, default: str = "INFO") -> None:
    p.add_argument("--log-level", default=default, help="logging level (default: %(default)s)")


def _metrics_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port "
                   "(0: a free port, written beside --out as .metrics)")
    p.add_argument("--metrics-linger", type=float, default=0.0,
                   help="keep /metrics up this many seconds after the end, for a last scrape")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="address /metrics listens on; 0.0.0.0 lets other hosts scrape (default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="psrv", description="Parameter-server training with sync, async "
                                     "and SSP consistency, and a harness that compares them with DDP.",
                                     epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("serve", help="run one server shard", description="Serve one shard of the parameters. "
                       "Exits 0 once all --workers have left. Example: psrv serve --bind tcp://0.0.0.0:5555 "
                       "--shard 0 --num-shards 2 --workers 4 --mode ssp --staleness 2")
    s.add_argument("--rpc-master", metavar="HOST:PORT", help="--transport rpc: the rendezvous of the job's RPC "
                   "world, hosted by shard 0 (replaces --bind); workers then use --servers "
                   "rpc://HOST:PORT/server-0,...")
    _config_arg(s, "shard's config")
    add_config_arguments(s, ServerConfig)
    _log_level(s)
    _metrics_args(s)
    s.add_argument("--out", type=Path, help="write the shard's statistics (JSON) here at exit")
    s.add_argument("--ready-file", type=Path, help="write the bound address here once listening")

    w = sub.add_parser("worker", help="run one worker", description="Train one worker against the servers. "
                       "Example: psrv worker --servers tcp://10.0.0.1:5555,tcp://10.0.0.2:5555 --rank 0 "
                       "--world-size 4 --job digits_mlp --steps 300")
    w.add_argument("--servers", help="comma-separated shard addresses, in shard order; @FILE "
                   "waits for FILE (a server's --ready-file) and reads the address from it")
    _config_arg(w, "worker's config")
    add_config_arguments(w, WorkerConfig)
    _log_level(w)
    w.add_argument("--mode", default="", help="label for this worker's metrics (the servers hold the mode)")
    _metrics_args(w)
    w.add_argument("--out", type=Path, help="write this worker's record (JSON) here")
    w.add_argument("--params-out", type=Path, help="save the final flat parameter vector here (torch.save)")
    w.add_argument("--state-out", type=Path, help="save the final model.state_dict() here: parameters and "
                   "this worker's buffers (torch.save)")
    w.add_argument("--progress-file", type=Path, help="keep the number of finished steps in this file")

    k = sub.add_parser("keygen", help="make CURVE key pairs for servers, workers and admin",
                       description="Write DIR/server.key(_secret), DIR/worker-K.key(_secret) for K < --workers "
                       "and DIR/admin.key(_secret). Servers admit the clients whose .key is in DIR. "
                       "Example: psrv keygen keys --workers 4")
    k.add_argument("dir", type=Path, help="directory for the keys (created, mode 0700)")
    k.add_argument("--workers", type=int, default=1, help="worker key pairs to make (default: %(default)s)")
    _log_level(k, "WARNING")

    d = sub.add_parser("admin", help="send STATS, CHECKPOINT or SHUTDOWN to running servers",
                       description="CHECKPOINT and SHUTDOWN need servers started with --curve-keys. "
                       "Example: psrv admin checkpoint --servers tcp://10.0.0.1:5555 --curve-keys keys")
    d.add_argument("action", choices=("stats", "checkpoint", "shutdown"))
    d.add_argument("--servers", required=True, help="comma-separated shard addresses")
    d.add_argument("--curve-keys", default="", metavar="DIR", help="connect with CURVE as admin (DIR/admin.key_secret)")
    _log_level(d, "WARNING")

    r = sub.add_parser("run", help="run a whole local cluster on 127.0.0.1",
                       description="Start --servers shards and --workers workers on 127.0.0.1, train to the "
                       "end, print a summary and write DIR/summary.json, steps.csv and evals.csv. "
                       "Example: psrv run --mode sync --workers 4 --steps 200. Your own loop instead of a "
                       "job: psrv run --mode sync --workers 2 --script train.py --epochs 3")
    _config_arg(r, "run's config")
    add_config_arguments(r, RunConfig)
    _log_level(r)
    r.add_argument("--metrics", action="store_true", help="every process serves /metrics; writes DIR/targets.json")
    r.add_argument("--metrics-linger", type=float, default=0.0,
                   help="with --metrics: keep /metrics up this many seconds after the end")
    r.add_argument("--out", type=Path, default=Path("runs/latest"), help="output directory (default: %(default)s)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--script", nargs=argparse.REMAINDER, help="FILE.py [ARGS...]: each worker runs your own loop "
                   "on psrv.Worker, python FILE.py ARGS, with RANK, WORLD_SIZE and PSRV_SERVERS set; its record "
                   "(DIR/worker-R.json) feeds steps.csv and summary.json (pass step(loss=..., batch_size=...) to "
                   "log them). Everything after FILE.py is the script's: put psrv's options first. --steps, if "
                   "given, reaches the script as PSRV_STEPS; the job, seed, fault and worker options and "
                   "--mode ddp (torchrun's) are refused")

    e = sub.add_parser("experiment", help="compare modes on one job as a TOML spec says",
                       description="Run every variant and repeat of SPEC, then write summary.csv, plots "
                       "and report.md. A finished run whose stored config is the one SPEC asks for is skipped, "
                       "so an interrupted experiment resumes; one whose config changed is run again (the old "
                       "run kept aside as rep-K.replaced-HASH). "
                       "Example: psrv experiment experiments/specs/modes.toml (writes runs/modes)")
    e.add_argument("spec", type=Path, help="experiment spec (TOML), e.g. experiments/specs/modes.toml")
    e.add_argument("--out", type=Path, default=None, help="output directory (default: runs/<SPEC file name "
                   "without .toml>; a folder holding another spec file's results is refused unless given here)")
    e.add_argument("--tensorboard", type=Path, default=None, metavar="DIR",
                   help="also write TensorBoard event files under DIR/<spec name>/<variant>/seed-<seed> (the "
                   "spec's key `tensorboard` says the same; this overrides it); a finished run gets its files "
                   "without being run again")
    _log_level(e, "WARNING")

    m = sub.add_parser("simulate", help="simulate a run of N workers and S shards (discrete events)",
                       description="Simulate `psrv run` with psrv's own consistency controllers and update rules "
                       "driven by modelled compute and network time; write DIR/summary.json (simulated: true), "
                       "steps.csv (the sampled workers), evals.csv and plots. --level learning also trains the "
                       "job's model on real gradients applied in the simulated order. --calibrate runs the real "
                       "run too and compares (docs/simulator.md). Example: psrv simulate --mode ssp --staleness 2 "
                       "--workers 1024 --servers 4 --steps 1000 --compute-ms 20 --compute lognormal")
    _config_arg(m, "run's config")
    add_config_arguments(m, SimulationConfig, skip=NOT_SIMULATED)
    _log_level(m, "WARNING")
    m.add_argument("--out", type=Path, default=Path("runs/simulated"), help="output directory (default: %(default)s)")
    m.add_argument("--spec", type=Path, metavar="FILE", help="simulate every variant of a simulation spec at each of "
                   "its worker counts (e.g. experiments/specs/simulate_ssp_backup.toml; its keys are the run's, a "
                   "[simulate] table among them) and write DIR/summary.csv, report.md and plots; the other options "
                   "are refused with it")
    m.add_argument("--calibrate", action="store_true", help="first run the same setting for real (psrv run, in "
                   "DIR/real), take the job's compute and the message time from it, simulate it at the learning level "
                   "(DIR/simulated) and print how far apart they are (DIR/calibration.json)")

    t = sub.add_parser("top", help="live per-shard view of running servers",
                       description="Poll the shards with STATS and show version, active workers, clocks, "
                       "staleness and updates/s. Example: psrv top --servers tcp://10.0.0.1:5555,tcp://10.0.0.2:5555")
    t.add_argument("--servers", required=True, help="comma-separated shard addresses, in shard order")
    t.add_argument("--interval", type=float, default=1.0, help="seconds between polls (default: %(default)s)")
    t.add_argument("--once", action="store_true", help="print one table (two polls, --interval apart) and exit")
    t.add_argument("--timeout", type=float, default=2.0,
                   help="seconds to wait for a shard's answer (default: %(default)s)")
    _log_level(t, "WARNING")
    return parser


def _base(a: argparse.Namespace) -> dict:
    return read_config_file(a.config) if a.config else {}


def _unused_staleness(a: argparse.Namespace, mode: str) -> None:
    """--staleness typed with a mode that has no bound: a mistake (a config file's default one is not)."""
    if "staleness" in given(a) and mode != "ssp":
        raise ValueError(f"--staleness: only used with --mode ssp (mode is {mode!r}); remove it")


def _serve(a: argparse.Namespace) -> int:
    from psrv.device import check_device
    from psrv.process import stop_on_signals, tune_malloc
    from psrv.server.run import serve
    extra = {"bind": f"rpc://{a.rpc_master}"} if a.rpc_master else {}
    cfg = config_from_args(ServerConfig, a, base=_base(a), extra=extra)
    if (cfg.transport == "rpc") != cfg.bind.startswith("rpc://"):
        raise ValueError("--transport rpc and --rpc-master HOST:PORT go together (shard 0 hosts the rendezvous)")
    _unused_staleness(a, cfg.mode)
    check_device(cfg.device)
    tune_malloc()
    # SIGTERM ends the loop cleanly (the shard writes its final checkpoint), as systemd, k8s and psrv run expect
    summary = serve(cfg, metrics_port=a.metrics_port, metrics_file=_metrics_file(a), metrics_host=a.metrics_host,
                    metrics_linger=a.metrics_linger, ready_file=a.ready_file,
                    on_ready=lambda server: stop_on_signals(server.stop, (signal.SIGTERM, signal.SIGINT)))
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
    from psrv.process import exit_code, interrupt_on_signals
    interrupt_on_signals()  # SIGTERM takes Ctrl-C's path: train() leaves the shards and keeps its rows
    try:
        return _train_worker(a)
    except KeyboardInterrupt as exc:  # before train() reached the shards: nothing to leave or write
        print(f"psrv worker: interrupted ({str(exc) or 'SIGINT'}) before training began", file=sys.stderr)
        return exit_code(exc)


def _train_worker(a: argparse.Namespace) -> int:
    from psrv.process import exit_code, tune_malloc
    base = _base(a)
    servers = a.servers if a.servers is not None else ",".join(base.get("servers", []))
    if not servers:
        raise ValueError("--servers: name at least one shard address (tcp://host:port), or give --config")
    listed = tuple(s.strip() for s in servers.split(",") if s.strip())
    cfg = config_from_args(WorkerConfig, a, base=base, extra={"servers": listed})
    from psrv.device import check_device
    from psrv.workers.jobs import job_factory
    check_device(cfg.device)
    job_factory(cfg.job.name)  # imports a user's job module (from the current folder) before any server is met
    cfg = cfg.replace(servers=server_addresses(servers, wait=120.0))  # then wait for @FILE addresses
    tune_malloc()
    import torch
    from psrv.workers.loop import TrainingInterrupted, train
    progress = None
    if a.progress_file:
        progress = lambda step: step % 10 == 0 and a.progress_file.write_text(str(step))  # noqa: E731
    metrics = None
    if a.metrics_port is not None:
        from psrv.metrics import WorkerMetrics
        from psrv.metrics import start_metrics
        metrics = start_metrics(WorkerMetrics, a.metrics_port, _metrics_file(a), host=a.metrics_host,
                                worker=cfg.rank, mode=a.mode)
    try:
        record = train(cfg, progress=progress, metrics=metrics)
    except TrainingInterrupted as exc:  # it said so in one line and left; keep its rows, not its weights
        for key in ("final_params", "final_state"):
            exc.record.pop(key)
        if a.out:
            _write_json(a.out, exc.record)
        return exit_code(exc.interrupt)
    if metrics is not None and a.metrics_linger > 0:
        time.sleep(a.metrics_linger)
    params, state = record.pop("final_params"), record.pop("final_state")
    if a.params_out:
        a.params_out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(params, a.params_out)
    if a.state_out:
        a.state_out.parent.mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().cpu().clone() for k, v in state.items()}, a.state_out)
    if a.out:
        _write_json(a.out, record)
    return 0


def _run(a: argparse.Namespace) -> int:
    from psrv.experiments.launch import RunFailed, RunInterrupted, run_local
    from psrv.experiments.summary import format_summary
    cfg = config_from_args(RunConfig, a, base=_base(a))
    _unused_staleness(a, cfg.mode)
    script = None
    if a.script is not None:
        from psrv.experiments.script import script_from_args
        script = script_from_args(a.script, cfg, typed=_dotted(given(a)))
    from psrv.process import exit_code, interrupt_on_signals, tune_malloc
    tune_malloc()  # this process only launches; the processes it starts tune themselves
    interrupt_on_signals()  # SIGTERM as Ctrl-C: stop the processes in order, keep what ran
    try:
        summary = run_local(cfg, out=a.out, metrics=a.metrics, metrics_linger=a.metrics_linger,
                            progress=not a.no_progress, script=script,
                            say=lambda line: print(line, file=sys.stderr))  # an earlier run's files removed
    except RunFailed as exc:
        print(f"psrv run failed: {exc}", file=sys.stderr)
        return 1
    except RunInterrupted as exc:
        print(f"interrupted: wrote the {exc.summary['steps_done']} steps that ran to {a.out} (incomplete)",
              file=sys.stderr)
        return exit_code(exc.interrupt)
    except KeyboardInterrupt as exc:  # before any process started: nothing to stop or write
        print("psrv run: interrupted before the run started", file=sys.stderr)
        return exit_code(exc)
    print(format_summary(summary))
    print(f"\nwrote {a.out}/summary.json, steps.csv, evals.csv, config.json")
    if cfg.tensorboard:
        from psrv.experiments.tracking import write_run_events
        print(f"wrote TensorBoard events to {write_run_events(cfg, a.out)}")
    return 0


def _dotted(tree: dict, prefix: str = "") -> set[str]:
    """The dotted keys of a nested dict (the options given, as `given` nests them)."""
    return {k for key, v in tree.items()
            for k in (_dotted(v, f"{prefix}{key}.") if isinstance(v, dict) else {f"{prefix}{key}"})}


def _experiment(a: argparse.Namespace) -> int:
    from psrv.experiments.runner import run_experiment
    from psrv.process import interrupt_on_signals
    interrupt_on_signals()  # SIGTERM as Ctrl-C: the run in progress stops in order and keeps what ran
    return run_experiment(a.spec, out=a.out, tensorboard=a.tensorboard)


def _simulate(a: argparse.Namespace) -> int:
    if a.spec is not None:
        if given(a) or a.config or a.calibrate:
            raise ValueError("--spec: the spec holds the whole setting; give only --out with it")
        from psrv.experiments.simulate.sweep import run_spec
        rows = run_spec(a.spec, out=a.out)
        print(f"simulated {len(rows)} runs; wrote {a.out}/summary.csv, report.md, plots")
        return 0
    cfg = config_from_args(SimulationConfig, a, base=_base(a))
    _unused_staleness(a, cfg.mode)
    import torch
    torch.set_num_threads(1)  # one simulated worker's step at a time: tiny tensors, and no spinning threads
    if a.calibrate:
        from psrv.experiments.simulate.calibrate import calibrate, format_calibration
        print(format_calibration(calibrate(cfg, out=a.out)))
        print(f"\nwrote {a.out}/calibration.json, {a.out}/real, {a.out}/simulated")
        return 0
    from psrv.experiments.simulate.run import simulate
    from psrv.experiments.summary import format_summary
    summary = simulate(cfg, out=a.out)
    print(format_summary(summary))
    print(f"wait_fraction  {summary['wait_fraction']:.4g}\nsimulated in   {summary['simulator_seconds']:.3g}s")
    print(f"\nwrote {a.out}/summary.json, steps.csv, evals.csv, config.json, plots (all simulated)")
    return 0


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
    write_json(path, data)


def _role(a: argparse.Namespace) -> str:
    """'server K' or 'worker R' for the log lines of one process; the command's name otherwise."""
    key = {"serve": ("server", "shard"), "worker": ("worker", "rank")}.get(a.command)
    if key is None:
        return a.command
    index = vars(a).get(f"{PREFIX}{key[1]}")
    if index is None and a.config:
        try:
            index = read_config_file(a.config).get(key[1])
        except ValueError:  # said once more, as an error, when the config is built
            pass
    return f"{key[0]} {index if index is not None else 0}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    role = _role(args)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format=f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s")
    try:
        return {"serve": _serve, "worker": _worker, "run": _run, "experiment": _experiment,
                "top": _top, "simulate": _simulate, "keygen": _keygen, "admin": _admin}[args.command](args)
    except ValueError as exc:  # bad input: say what to change, no traceback
        logging.getLogger("psrv").debug("the error's traceback:", exc_info=True)  # shown with --log-level DEBUG
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
