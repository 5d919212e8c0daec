"""`make gpu-check`'s training runs: samples/s of GPU workers (several processes sharing one GPU) with the
parameters on a CPU server, on a server on GPU0 and in DDP; and placement.toml's GPU0 rows against its CPU
server's. Every figure is a ratio against a run of the same invocation.

`gpu` is the device the GPU rows use ("cuda:0"); a rehearsal on a machine without CUDA passes "cpu", which
proves the runs start, finish and are read, and measures nothing about GPUs.
"""
from __future__ import annotations

import time
from pathlib import Path

from psrv.config import RunConfig, from_dict
from psrv.device import check_device
from psrv.client.collective import device_and_backend

import psrv.experiments
from psrv.experiments.launcher.cluster import Cluster, RunFailed
from psrv.experiments.launcher.launch import rank0_argv, run_local, server_argv, worker_argv, write_config
from psrv.experiments.launcher.preflight import preflight
from psrv.experiments.harness.spec import load_spec
from psrv.experiments.launcher.summary import build_summary
from psrv.experiments.harness.traffic import TrafficSampler, busiest

PLACEMENT = Path(psrv.experiments.__file__).parent / "specs" / "placement.toml"
SERVERS = ("cpu", "gpu0")  # where a PS run's shard lives: the host, or the workers' GPU


def run_split(cfg: RunConfig, *, out: Path, server_device: str, timeout: float) -> dict:
    """Run `cfg` with its shards on `server_device` and its workers on cfg.cluster.device, and return its summary:
    the seeds' first architecture (a CPU server for GPU workers), which `psrv run` cannot start (its --device
    places both). Plain: no replicas, kills, metrics or emulated hosts."""
    preflight(cfg)
    check_device(server_device)
    out.mkdir(parents=True, exist_ok=True)
    write_config(out / "config.json", cfg)
    cluster = Cluster(out, processes=cfg.cluster.servers + cfg.cluster.workers)
    try:
        servers, addresses = [], []
        for shard in range(cfg.cluster.servers):
            ready = out / f"server-{shard}.addr"
            config = cfg.server_config(shard, bind="tcp://127.0.0.1:0").replace(device=server_device)
            path = write_config(out / f"config-server-{shard}.json", config)
            cluster.start(f"server-{shard}", server_argv(str(path), str(out), shard, ["--ready-file", str(ready)]))
            servers.append(f"server-{shard}")
            addresses.append(f"@{ready}")  # read by the worker once the shard has written it
        workers = []
        for rank in range(cfg.cluster.workers):
            path = write_config(out / f"config-worker-{rank}.json", cfg.worker_config(rank, servers=tuple(addresses)))
            argv = worker_argv(str(path), str(out), rank, cfg.mode, [])
            cluster.start(f"worker-{rank}", argv + (rank0_argv(str(out)) if rank == 0 else []))
            workers.append(f"worker-{rank}")
        cluster.wait(workers, timeout=timeout)
        cluster.wait(servers, timeout=60)
    finally:
        cluster.stop()
    return build_summary(cfg, out)


def config(job: str, *, mode: str, workers: int, device: str, steps: int, batch_size: int) -> RunConfig:
    """One run of the samples/s comparison: 1 shard, SGD (lr 0.01, momentum 0.9), evaluated at start and end."""
    return from_dict(RunConfig, {"mode": mode, "cluster": {"servers": 1, "workers": workers, "device": device},
                                 "job": {"name": job, "steps": steps, "batch_size": batch_size, "eval_every": 0},
                                 "optimizer": {"lr": 0.01, "momentum": 0.9}})


def samples(jobs: list[str], worker_counts: list[int], *, gpu: str, modes: list[str], steps: int, batch_size: int,
            work: Path, deadline: float, said: list[str]) -> list[dict]:
    """Rows `gpu_e2e`: per job and worker count, DDP first (its backend as psrv picks it: nccl where every rank
    has a GPU of its own, else gloo on the GPU's tensors), then each mode with a CPU server and with the server
    on `gpu`, its samples/s over DDP's; a DDP row per worker count beyond the first, over the first's. A run
    that fails or would start past `deadline` is a line in `said`, not a row."""
    family = "cpu" if gpu == "cpu" else "cuda"  # DDP's ranks take cuda:<local rank % GPUs>, all cuda:0 here
    rows, first_ddp = [], {}
    for job in jobs:
        for workers in worker_counts:
            tag = f"{job.rsplit(':', 1)[-1]} x{workers}"
            backend = device_and_backend(family, "auto", 0, workers)[1]
            ddp = _one(config(job, mode="ddp", workers=workers, device=family, steps=steps, batch_size=batch_size),
                       work / f"{tag}-ddp".replace(" ", ""), None, deadline, f"{tag} ddp ({backend})", said)
            if ddp is None:
                continue
            first_ddp.setdefault(job, (workers, ddp, backend))
            w0, base0, backend0 = first_ddp[job]
            if w0 != workers:
                rows.append({**_row(job, workers, "ddp", ddp, steps, batch_size), "server": None, "backend": backend,
                             "baseline": f"ddp x{w0} ({backend0})", "baseline_samples_per_second": base0["samples_per_second"],
                             "ratio": ddp["samples_per_second"] / base0["samples_per_second"]})
            for mode in modes:
                for server in SERVERS:
                    where = "cpu" if server == "cpu" else gpu
                    summary = _one(config(job, mode=mode, workers=workers, device=gpu, steps=steps,
                                          batch_size=batch_size), work / f"{tag}-{mode}-{server}".replace(" ", ""),
                                   "cpu" if server == "cpu" else None, deadline, f"{tag} {mode} {server} server", said)
                    if summary is not None:
                        rows.append({**_row(job, workers, mode, summary, steps, batch_size), "server": server,
                                     "server_device": where,
                                     "worker_device": gpu, "backend": "zmq", "baseline": f"ddp x{workers} ({backend})",
                                     "baseline_samples_per_second": ddp["samples_per_second"],
                                     "ratio": summary["samples_per_second"] / ddp["samples_per_second"],
                                     "payload_bytes": summary.get("payload_bytes")})
    return rows


def _row(job: str, workers: int, mode: str, summary: dict, steps: int, batch_size: int) -> dict:
    return {"bench": "gpu_e2e", "job": job, "workers": workers, "mode": mode, "steps": steps, "batch_size": batch_size,
            "parameters": summary.get("parameters"), "samples_per_second": summary["samples_per_second"],
            "wall_seconds": summary["wall_seconds"]}


def _one(cfg: RunConfig, out: Path, server_device: str | None, deadline: float, label: str,
         said: list[str]) -> dict | None:
    """One run's summary: psrv run's (server_device None: shards on cfg's device, or DDP), else run_split's (a
    rehearsal's cpu server for cpu workers too, so that it runs). None, with a line in `said`, if it failed or
    `deadline` is too near to start it (20 s)."""
    left = deadline - time.monotonic()
    if left < 20:
        said.append(f"SKIPPED run {label}: the time budget is spent ({max(left, 0):.0f} s left of this part's share)")
        return None
    try:
        if server_device is None:
            return run_local(cfg, out=out, progress=False, timeout=left)
        return run_split(cfg, out=out, server_device=server_device, timeout=left)
    except (RunFailed, RuntimeError, ValueError) as exc:
        said.append(f"FAILED run {label}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__} "
                    f"(logs in {out})")
        return None


def placement(worker_counts: list[int], *, gpu: str, work: Path, deadline: float, said: list[str],
              steps: int | None = None) -> list[dict]:
    """Rows `gpu_placement`: placement.toml's gpu0-server-Nw (its first seed) against cpu-1server-Nw of the same
    invocation: samples/s and ms per step, and the busiest process's bytes per step where `ss` is there.
    `gpu` replaces the spec's cuda:0 (a rehearsal's "cpu"); `steps`, the spec's steps (a rehearsal's few)."""
    spec = load_spec(PLACEMENT)
    seed, rows = spec.seeds[0], []
    for workers in worker_counts:
        runs = {}
        for name in (f"cpu-1server-{workers}w", f"gpu0-server-{workers}w"):
            cfg = spec.run_config(spec.variant(name), seed)
            cfg = cfg.replace(cluster=cfg.cluster.replace(device="cpu" if name.startswith("cpu") else gpu))
            if steps is not None:
                cfg = cfg.replace(job=cfg.job.replace(steps=steps))
            out = work / "placement" / name
            out.mkdir(parents=True, exist_ok=True)
            with TrafficSampler(out):  # each process's TCP bytes, as `psrv experiment` samples them
                summary = _one(cfg, out, None, deadline, f"placement {name}", said)
            if summary is None:
                break
            runs[name] = (summary, busiest(out), cfg.job.steps)
        if len(runs) < 2:
            continue
        (base, base_busy, n), (mine, busy, _) = runs.values()
        rows.append({"bench": "gpu_placement", "variant": f"gpu0-server-{workers}w", "device": gpu,
                     "baseline": f"cpu-1server-{workers}w", "workers": workers, "steps": n, "seed": seed,
                     "samples_per_second": mine["samples_per_second"],
                     "baseline_samples_per_second": base["samples_per_second"],
                     "ms_per_step": mine["wall_seconds"] / n * 1e3, "baseline_ms_per_step": base["wall_seconds"] / n * 1e3,
                     "busiest": busy, "baseline_busiest": base_busy,
                     "ratio": mine["samples_per_second"] / base["samples_per_second"]})
    return rows
