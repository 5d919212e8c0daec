"""`psrv experiment SPEC --out DIR`: every variant and repeat as a `psrv run`, resumable, then collect and report."""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from tqdm import tqdm

from psrv.code_inputs import versions
from psrv.config.caveats import quality_caveats
from psrv.experiments.harness.collect import SKIPPED_FILE, collect, is_finished, run_dir, spec_repeats
from psrv.experiments.launcher.launch import RunFailed, run_local
from psrv.experiments.launcher.preflight import preflight
from psrv.experiments.launcher.progress import progress_bar
from psrv.experiments.launcher.provenance import claim, default_out, keep_aside, kept_runs, why_changed
from psrv.experiments.harness.report import write_report
from psrv.experiments.launcher.schedulers import check_scheduler
from psrv.experiments.launcher.rundir import EXPERIMENT_LOCK, RUN_LOCK, OwnedFolder, holder, refusal
from psrv.experiments.launcher.script import Script
from psrv.experiments.harness.spec import load_spec
from psrv.experiments.harness.tracking import run_name, write_events
from psrv.experiments.harness.tracking_mlflow import check_uri, log_runs
from psrv.experiments.harness.traffic import TrafficSampler
from psrv.process import exit_code

log = logging.getLogger("psrv.experiment")


def _say(text: str) -> None:
    tqdm.write(text, file=sys.stderr)


def run_experiment(spec_path: str | Path, *, out: str | Path | None = None,
                   tensorboard: str | Path | None = None, mlflow: str | None = None, scheduler: str = "local",
                   profile: str | None = None) -> int:
    """Run (or resume) the experiment SPEC into `out`; 0 if every run finished, 1 if any failed.

    Runs go to DIR/<variant>/rep-<k>. A finished run whose stored config is the one the spec now asks for is
    skipped, so an interrupted experiment resumes; one whose config changed is run again, the old run kept
    aside. The default DIR is runs/<spec file stem>; a folder of another spec file's results is refused
    unless `out` is given. One bar covers all runs (on a terminal; elsewhere a plain line every tenth or minute:
    experiments/launcher/progress.py); status lines go to stderr via tqdm.write.

    `tensorboard` (or the spec's key of that name): every finished run's TensorBoard events go to
    TB/<spec name>/<variant>/seed-<seed>, a run finished earlier included (it is not run again for them).
    `mlflow` (or the spec's key): a tracking URI; every finished run is logged there once, as the MLflow run
    <variant>/seed-<seed> of the experiment <spec name>, with the report and plots as the run `report`
    (experiments/harness/tracking_mlflow.py); MLflow's client is checked before the first run starts.

    `profile` runs the spec as its [profiles.PROFILE] table says (experiments/harness/spec.py `with_profile`), into
    runs/<stem>-PROFILE by default.

    `scheduler` starts every run's processes (experiments/launcher/schedulers.py); it is not part of a run's config,
    so a run finished under another scheduler is reused.
    """
    spec = load_spec(spec_path, profile)
    for variant in spec.variants:
        check_scheduler(scheduler, bandwidth=variant.config.network.bandwidth)
    if tensorboard is not None:  # the command line's folder over the spec's, in what every run stores
        spec = spec.with_settings(tensorboard=str(tensorboard))
    if mlflow is not None:
        spec = spec.with_settings(mlflow=mlflow)
    for uri in sorted({variant.config.mlflow for variant in spec.variants} - {""}):
        check_uri(uri)  # an absent client or a URI MLflow refuses, said before anything trains
    skipped = _absent_devices(spec, spec_path)
    chosen = out is not None
    out = Path(out) if chosen else default_out(spec_path, profile)
    if (out / RUN_LOCK).exists() or (out / "config.json").exists():
        raise ValueError(f"{out} is a `psrv run`'s folder, not an experiment's; pass --out with another folder")
    with OwnedFolder(out, what="psrv experiment", lock=EXPERIMENT_LOCK, announce=False) as owned:
        note = claim(out, spec_path, chosen=chosen)  # a folder holds one spec file's results, unless chosen
        owned.announce()  # one experiment at a time in DIR: a second is refused, naming this one
        return _run_experiment(spec, spec_path, out=out, note=note, skipped=skipped, scheduler=scheduler)


def _run_experiment(spec, spec_path, *, out: Path, note: str | None, skipped: dict[str, str],
                    scheduler: str = "local") -> int:
    if note:
        _say(note)
    for variant in spec.variants:  # where a quality grid measured the remedy off its claim (the runs go ahead)
        for line in quality_caveats(variant.config):
            _say(f"warning: variant {variant.name}: {line}")
    for variant in spec.variants:  # the report names each skipped variant and why
        (out / variant.name).mkdir(parents=True, exist_ok=True)
        (out / variant.name / SKIPPED_FILE).unlink(missing_ok=True)
        if variant.name in skipped:
            (out / variant.name / SKIPPED_FILE).write_text(skipped[variant.name] + "\n")
            _say(f"skipped variant {variant.name}: {skipped[variant.name]}")
    todo = [t for t in _plan(spec, out) if t[0].name not in skipped]
    failed: list[str] = []
    started = time.monotonic()
    with progress_bar(total=sum(t[-1] for t in todo), desc="", dynamic_ncols=True, file=sys.stderr) as bar:
        for variant, seed, repeat, path, steps in todo:  # steps: one run's, all workers together
            label = f"{variant.name} rep-{repeat}"
            bar.set_description(label)
            base = bar.n

            def advance(done: int, base: int = base, steps: int = steps) -> None:
                if base + min(done, steps) > bar.n:
                    bar.update(base + min(done, steps) - bar.n)
            try:
                if not _one_run(spec, variant, seed, path, label=label, on_progress=advance, scheduler=scheduler):
                    failed.append(label)
            except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM where the entry point makes it one
                bar.close()
                _say(f"interrupted during {label}: what ran is in {path}, marked incomplete; rerun the same "
                     "command to resume (finished runs with an unchanged config are skipped)")
                return exit_code(getattr(exc, "interrupt", exc))
            advance(steps)
    log.info("ran %d runs in %.1fs", len(todo), time.monotonic() - started)
    collect(out, spec)
    _write_events(spec, out)
    report = write_report(out, spec, spec_path=spec_path, versions=versions())
    _log_mlflow(spec, out)
    if failed:
        _say(f"{len(failed)} of {len(todo)} runs failed: {', '.join(failed)}; rerun the same command "
             "to retry them (finished runs with an unchanged config are skipped)")
    print(f"report: {report}")  # the CLI's final message
    return 1 if failed else 0


def _absent_devices(spec, spec_path) -> dict[str, str]:
    """Check every run's device and job before the first run starts. A variant whose device is not on this
    machine (cuda:0 without CUDA) is skipped: {name: why}. Any other mistake, or every variant on an absent
    device, is a ValueError."""
    skipped = {}
    for variant in spec.variants:
        try:
            preflight(variant.config)
        except ValueError as exc:
            try:
                preflight(variant.config.replace(cluster=variant.config.cluster.replace(device="cpu")))
            except ValueError:
                raise ValueError(f"{spec_path}: variant {variant.name}: {exc}") from None
            if variant.config.cluster.device == "cpu":
                raise ValueError(f"{spec_path}: variant {variant.name}: {exc}") from None
            skipped[variant.name] = f"its device is not on this machine ({exc})"
    if skipped and len(skipped) == len(spec.variants):
        raise ValueError(f"{spec_path}: no variant can run here: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    return skipped


def _plan(spec, out: Path) -> list[tuple]:
    """(variant, seed, repeat, run dir, steps of all workers) of each run to do, in order. A finished run
    with the config the spec asks for is skipped; one with another config is kept aside, and a run kept
    aside earlier with the asked-for config is put back instead of running it again."""
    todo = []
    for variant, seed, repeat in spec.runs():
        path, cfg = run_dir(out, variant.name, repeat), spec.run_config(variant, seed)
        label = f"{variant.name} rep-{repeat}"
        who = holder(path)
        if who is not None:  # a run in progress there (a `psrv run --out` of its own): neither reused nor redone
            raise refusal(path, who)
        finished = is_finished(path)
        why = why_changed(path, cfg) if finished else None
        if finished and why is None:
            _say(f"skipped {label} (seed {seed}): already finished with this config in {path}")
            continue
        earlier = next((p for p in kept_runs(path, cfg) if is_finished(p)), None)
        aside = keep_aside(path) if finished or (earlier is not None and path.exists()) else None
        if earlier is not None:
            earlier.rename(path)
            _say(f"restored {label} (seed {seed}) from {earlier}: it ran with this config before"
                 + (f"; the run it replaces is kept in {aside}" if aside else ""))
            continue
        if aside is not None:
            _say(f"rerunning {label}: {why}; the old run is kept in {aside}")
        todo.append((variant, seed, repeat, path, cfg.job.steps * cfg.cluster.workers))
    return todo


def _one_run(spec, variant, seed: int, path: Path, *, label: str, on_progress, scheduler: str = "local") -> bool:
    """One `psrv run` into `path`; a failure is reported and recorded in path/error.txt, never raised. The
    folder is the run's (experiments/launcher/rundir.py) from before the traffic sampler starts until error.txt is
    written: a folder another run took since the plan was made stops the experiment (FolderInUse)."""
    cfg = spec.run_config(variant, seed)
    with OwnedFolder(path, what="psrv experiment") as folder:
        (path / "error.txt").unlink(missing_ok=True)
        try:
            with TrafficSampler(path):  # each process's TCP bytes, for the busiest one's traffic per step
                script = Script.of(cfg, steps_given=spec.steps_given(variant)) if cfg.job.script else None
                run_local(cfg, out=path, progress=False, on_progress=on_progress, say=_say, owner=folder,
                          script=script, scheduler=scheduler)
        except (RunFailed, RuntimeError, ValueError) as exc:  # RuntimeError: a process left no record
            (path / "error.txt").write_text(f"{exc}\n")
            _say(f"FAILED {label}: {exc}\n(recorded in {path / 'error.txt'}; going on with the next run)")
            return False
    _say(f"finished {label} in {path}")
    return True


def _write_events(spec, out: Path) -> None:
    """TensorBoard events of every finished run of a variant whose config names a folder for them."""
    for variant in spec.variants:
        root = variant.config.tensorboard
        for repeat, path in spec_repeats(out, spec, variant.name) if root else ():
            logdir = Path(root) / spec.name / run_name(variant.name, spec.seeds[repeat])
            write_events(path, logdir)
            log.info("wrote TensorBoard events of %s rep-%d to %s", variant.name, repeat, logdir)


def _log_mlflow(spec, out: Path) -> None:
    """Every finished run of a variant whose config names an MLflow store, and the report, logged there once."""
    stores: dict[str, list[tuple[str, int, Path]]] = {}
    for variant in spec.variants:
        for repeat, path in spec_repeats(out, spec, variant.name) if variant.config.mlflow else ():
            stores.setdefault(variant.config.mlflow, []).append((variant.name, spec.seeds[repeat], path))
    for uri, runs in stores.items():
        _say(log_runs(uri, spec.name, runs, report=out))
