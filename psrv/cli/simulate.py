"""`psrv simulate`: a run of N workers and S shards on modelled time (psrv.experiments.simulate)."""
from __future__ import annotations

import argparse
from pathlib import Path

from psrv.cli.common import base_config, config_arg, log_level, unused_staleness
from psrv.config.cli_args import add_config_arguments, config_from_args, given
from psrv.experiments.simulate.config import NOT_SIMULATED, SimulationConfig


def add(sub) -> None:
    m = sub.add_parser("simulate", help="simulate a run of N workers and S shards (discrete events)",
                       description="Simulate `psrv run` with psrv's own consistency controllers and update rules "
                       "driven by modelled compute and network time and the codecs' CPU time (--codec-cost); write "
                       "DIR/summary.json (simulated: true), "
                       "steps.csv (the sampled workers), evals.csv and plots. --level learning also trains the "
                       "job's model on real gradients applied in the simulated order. --calibrate runs the real "
                       "run too and compares (docs/simulator.md). Example: psrv simulate --mode ssp --staleness 2 "
                       "--workers 1024 --servers 4 --steps 1000 --compute-ms 20 --compute lognormal")
    config_arg(m, "run's config")
    add_config_arguments(m, SimulationConfig, skip=NOT_SIMULATED)
    log_level(m, "WARNING")
    m.add_argument("--out", type=Path, default=Path("runs/simulated"), help="output directory (default: %(default)s)")
    m.add_argument("--spec", type=Path, metavar="FILE", help="simulate every variant of a simulation spec at each of "
                   "its worker counts (e.g. experiments/specs/simulate_ssp_backup.toml; its keys are the run's, a "
                   "[simulate] table among them) and write DIR/summary.csv, report.md and plots; the other options "
                   "are refused with it")
    m.add_argument("--calibrate", action="store_true", help="first run the same setting for real (psrv run, in "
                   "DIR/real), take the job's compute and the message time from it, simulate it at the learning level "
                   "(DIR/simulated) and print how far apart they are (DIR/calibration.json)")
    m.add_argument("--against", type=Path, metavar="RUN_DIR", help="simulate a real run made already (its "
                   "config.json; a run on emulated hosts gives its bandwidth to every link), each step's compute one "
                   "of its own steps, the latency --latency-ms, and print the steady samples/s of both: the "
                   "simulator's byte and codec-cost model against a network-bound run (DIR/against.json); a run with "
                   "--nemesis kills is simulated with its schedule, a killed worker down as long as its restarts took "
                   "by the run's logs (or --fail-down). Of the other "
                   "options only --latency-ms, --server-ms, --codec-cost, --forward-fraction, --fail-down, --goodput "
                   "and --out go with it")


def command(a: argparse.Namespace) -> int:
    from psrv.process import tune_malloc
    tune_malloc()  # the allocator psrv serve and psrv worker run with: the codecs are timed under it
    if a.against is not None:
        return _against(a)
    if a.spec is not None:
        if given(a) or a.config or a.calibrate:
            raise ValueError("--spec: the spec holds the whole setting; give only --out with it")
        from psrv.experiments.simulate.sweep import run_spec
        rows = run_spec(a.spec, out=a.out)
        print(f"simulated {len(rows)} runs; wrote {a.out}/summary.csv, report.md, plots")
        return 0
    cfg = config_from_args(SimulationConfig, a, base=base_config(a))
    unused_staleness(a, cfg.mode)
    if cfg.job.script:  # a script's config.json: no job to build (--against reads its records instead)
        from psrv.experiments.simulate.run import script_refusal
        raise ValueError(script_refusal(cfg.job.script))
    import torch
    torch.set_num_threads(1)  # one simulated worker's step at a time: tiny tensors, and no spinning threads
    if a.calibrate:
        from psrv.experiments.simulate.calibrate import calibrate, format_calibration
        print(format_calibration(calibrate(cfg, out=a.out)))
        print(f"\nwrote {a.out}/calibration.json, {a.out}/real, {a.out}/simulated")
        return 0
    from psrv.experiments.simulate.run import simulate
    from psrv.experiments.launcher.summary import format_summary
    summary = simulate(cfg, out=a.out)
    print(format_summary(summary))
    if "kills" in summary:  # --nemesis: what the kills did, as a real run's summary says it
        kills = summary["kills"]
        restarted = sum(k["restarted"] for k in kills)
        which = ", ".join(f"rank {k['rank']} at {k['t']:g}s" for k in kills) or "none"
        print(f"kills          {len(kills)} ({which}); "
              f"{restarted} restarted, {len(kills) - restarted} left behind; samples lost {summary['lost_samples']}, "
              f"never done {summary['skipped_samples']}")
    print(f"wait_fraction  {summary['wait_fraction']:.4g}\nsimulated in   {summary['simulator_seconds']:.3g}s")
    from psrv.experiments.simulate.codec_cost import format_codec_cost
    print(format_codec_cost(summary["codec_cost"], summary["codec_cost_ms"], summary["codec_cost_load_average"]))
    print(f"\nwrote {a.out}/summary.json, steps.csv, evals.csv, config.json, plots (all simulated)")
    return 0


# the simulator's own settings --against takes beside the run's config
AGAINST = ("latency_ms", "server_ms", "codec_cost", "forward_fraction", "fail_down", "goodput")


def _against(a: argparse.Namespace) -> int:
    extra = {k for k in given(a).get("simulate", {}) if k not in AGAINST}
    if a.spec or a.config or a.calibrate or extra or set(given(a)) - {"simulate"}:
        raise ValueError("--against: the run's config.json holds the setting; give only --latency-ms, "
                         "--server-ms, --codec-cost, --forward-fraction, --fail-down, --goodput and --out with it")
    import torch
    torch.set_num_threads(1)
    from psrv.experiments.simulate.against import against, format_against
    result = against(a.against, out=a.out, **given(a).get("simulate", {}))
    print(format_against(result))
    print(f"\nwrote {a.out}/against.json and the simulated run")
    return 0
