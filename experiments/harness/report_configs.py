"""What the report says was run: the job, optimizer, cluster and seed lines and each variant's `psrv run`
command, all from each run's stored config.json (never from the spec's text), and every way the runs
disagree: repeats of a variant that differ in more than the seed, variants that differ in a line shown
as common, runs with no stored config, and runs made with another config than the spec's.
"""
from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from psrv.config import RunConfig
from psrv.config.cli_args import to_argv

from psrv.experiments.harness.collect import spec_repeats
from psrv.experiments.launcher.provenance import OUTPUT_KEYS, describe, differences, recorded_specs, stored_config
from psrv.experiments.harness.spec import ExperimentSpec


@dataclass(frozen=True)
class StoredRun:
    """One finished run and the config it stored; config None (and `problem` saying why) if none reads."""

    variant: str
    repeat: int
    path: Path
    config: RunConfig | None
    problem: str = ""

    @property
    def label(self) -> str:
        return f"`{self.variant}` rep-{self.repeat}"


def stored_runs(out_dir: str | Path, spec: ExperimentSpec) -> list[StoredRun]:
    """Every finished run that collect reads, in spec order, with its stored config."""
    runs = []
    for variant in spec.variants:
        for repeat, path in spec_repeats(out_dir, spec, variant.name):
            try:
                runs.append(StoredRun(variant.name, repeat, path, stored_config(path)))
            except ValueError as exc:
                runs.append(StoredRun(variant.name, repeat, path, None, str(exc)))
    return runs


def _job(cfg: RunConfig) -> str:
    job = cfg.job
    if job.script:  # the script decides its batches and evaluations
        return (f"script `{shlex.join([job.script, *job.script_args])}` (sha256 {job.script_sha256[:12]}), "
                f"{job.steps} steps per worker as PSRV_STEPS where the spec gives them")
    return (f"`{job.name}`, {job.steps} steps per worker, batch {job.batch_size} per worker, "
            + (f"eval every {job.eval_every} steps" if job.eval_every else "eval at start and end"))


def _optimizer(cfg: RunConfig) -> str:
    """The servers' optimizer (the outer one with local steps) and every setting that changes its step."""
    opt, worker = cfg.optimizer, cfg.worker
    parts = [f"{opt.name}, lr {opt.lr:g}" + (f", momentum {opt.momentum:g}" if opt.name == "sgd" else "")
             + (" (Nesterov)" if opt.nesterov else "") + f", weight decay {opt.weight_decay:g}"]
    if opt.lr_schedule != "constant":
        parts.append(f"lr schedule {opt.lr_schedule}")
    if opt.clip_grad_norm:
        parts.append(f"clip grad norm {opt.clip_grad_norm:g}")
    if opt.update_rule != "plain":
        extra = f" (lambda {opt.dc_lambda:g})" if opt.update_rule.startswith("dc-") else \
            f" (period {opt.dn_period or 'the workers'})" if opt.update_rule == "dn" else \
            f" (alpha {opt.cgad_alpha:g}, cutoff {opt.cgad_cutoff or 'none'})" if opt.update_rule == "cgad" else \
            (f" (keep {opt.heloco_keep:g}, shrink {opt.heloco_shrink:g}, reorient {opt.heloco_reorient:g}, kappa "
             f"{opt.heloco_kappa:g}, block {opt.heloco_block or 'the slice'})") if opt.update_rule == "heloco" else ""
        parts.append(f"update rule {opt.update_rule}{extra}")
    if worker.local_updates:
        parts.append(f"{worker.local_steps} local steps per push, inner {worker.inner_optimizer} "
                     f"lr {worker.inner_lr:g}")
        if worker.fragments > 1:  # streaming DiLoCo: one fragment every H/F steps
            parts.append(f"{worker.fragments} fragments")
        if worker.outer_dtype != "float32":
            parts.append(f"outer gradients {worker.outer_dtype}")
    if cfg.allreduce.ddp_comm_hook != "none":  # the all-reduce's wire: DDP's comm hook (mode ddp, zero1)
        parts.append(f"DDP comm hook {cfg.allreduce.ddp_comm_hook}"
                     + (f" rank {cfg.allreduce.powersgd_rank}" if cfg.allreduce.ddp_comm_hook == "powersgd" else ""))
    return "; ".join(parts)


def _cluster(cfg: RunConfig) -> str:
    cl = cfg.cluster
    return f"{cl.servers} server(s), {cl.workers} workers, {cl.device}, {cl.transport}"


def _who(group: list[StoredRun], runs: list[StoredRun]) -> str:
    """The runs of a group: a variant's name when all its runs are in it, else each run."""
    names = []
    for variant in dict.fromkeys(r.variant for r in group):
        mine = [r for r in group if r.variant == variant]
        whole = len(mine) == sum(r.variant == variant and r.config is not None for r in runs)
        names += [f"`{variant}`"] if whole else [r.label for r in mine]
    return ", ".join(names)


def _line(title: str, render: Callable[[RunConfig], str], runs: list[StoredRun]) -> str:
    groups: dict[str, list[StoredRun]] = {}
    for run in runs:
        if run.config is not None:
            groups.setdefault(render(run.config), []).append(run)
    if not groups:
        return f"- {title}: unknown (no finished run has a stored config.json)"
    if len(groups) == 1:
        return f"- {title}: {next(iter(groups))}"
    return f"- {title}: **differs between runs**: " + "; ".join(f"{text} ({_who(group, runs)})"
                                                                for text, group in groups.items())


def disagreements(runs: list[StoredRun], spec: ExperimentSpec) -> list[str]:
    """One line per way the runs disagree with each other (beyond the seed) or with the spec."""
    lines = [f"{r.label}: {r.problem}; its settings are unknown" for r in runs if r.config is None]
    firsts: dict[str, tuple[int, RunConfig]] = {}
    for run in runs:
        if run.config is None:
            continue
        first_repeat, first = firsts.setdefault(run.variant, (run.repeat, run.config))
        diffs = differences(first, run.config, ignore=("seed", *OUTPUT_KEYS))
        if diffs:
            lines.append(f"{run.label} differs from rep-{first_repeat} in more than the seed: {describe(diffs)}")
        wanted = spec.run_config(spec.variant(run.variant), spec.seeds[run.repeat])
        diffs = differences(run.config, wanted, ignore=OUTPUT_KEYS)
        if diffs:
            lines.append(f"{run.label} was run with another config than the spec's: {describe(diffs)} "
                         "(stored -> spec); `psrv experiment` would run it again")
    return lines


def setup_lines(runs: list[StoredRun], spec: ExperimentSpec, problems: list[str]) -> list[str]:
    """The report's job, optimizer, cluster, seeds and configs lines."""
    seeds = sorted({r.config.seed for r in runs if r.config is not None}) or list(spec.seeds)
    configs = ("**the runs disagree: see \"The runs disagree\" below**" if problems else
               f"all finished runs ({len(runs)}) are the spec's (their config_hash is in runs.csv)")
    return [_line("Job", _job, runs), _line("Optimizer", _optimizer, runs), _line("Cluster", _cluster, runs),
            f"- Repeats: {spec.repeats} per variant (seeds {', '.join(map(str, seeds))})",
            f"- Configs: read from each run's stored config.json; {configs}"]


def mixed_folder_lines(out_dir: str | Path, spec_path: str | Path) -> list[str]:
    """A line when the folder also holds another spec file's results (an --out the user chose)."""
    others = [str(p) for p in recorded_specs(out_dir) if p != Path(spec_path).resolve()]
    if not others:
        return []
    return [f"- Folder: **also holds the results of {', '.join(others)}**; this report reads only this spec's "
            "variants, each run checked against this spec's config"]


def disagreement_section(problems: list[str]) -> list[str]:
    if not problems:
        return []
    return ["## The runs disagree", "", "Each line is a run whose stored config.json disagrees with another "
            "run's or with the spec's; the numbers below include it:", "", *(f"- {line}" for line in problems), ""]


def overridden_section(runs: list[StoredRun]) -> list[str]:
    """The runs whose script's psrv.Worker(...) passed a worker setting of its own against config.json (summary.json's
    settings_overridden, psrv/client/run_settings.py): what they ran is not what the setup lines say."""
    lines = []
    for run in runs:
        try:
            overridden = json.loads((run.path / "summary.json").read_text()).get("settings_overridden") or {}
        except (OSError, ValueError):  # collect read it; a summary gone since says nothing here
            continue
        for rank, kept in overridden.items():
            said = ", ".join(f"{name} {o['script']!r} (config.json: {o['run']!r})" for name, o in kept.items())
            lines.append(f"- {run.label}, {rank}: {said}")
    if not lines:
        return []
    return ["## Settings the script overrode", "", "In these runs the script's psrv.Worker(...) passed its own value "
            "of a run setting, which it ran with; the setup lines above give config.json's:", "", *lines, ""]


def command_lines(runs: list[StoredRun], spec: ExperimentSpec) -> list[str]:
    """Each variant's first finished run: `psrv run --config` its stored config.json, and its flags."""
    lines = ["## Commands", "", "Each variant's first finished run, from its stored config.json: "
             "`psrv run --config` repeats it exactly, and the flags (`to_argv`) say how it differs from "
             "the defaults:", "", "```"]
    for variant in spec.variants:
        run = next((r for r in runs if r.variant == variant.name and r.config is not None), None)
        if run is None or run.config is None:
            lines.append(f"# {variant.name}: no finished run with a stored config.json")
            continue
        lines.append(f"# {variant.name} rep-{run.repeat} (seed {run.config.seed}): psrv run --config "
                     f"{shlex.quote(str(run.path / 'config.json'))} --out NEW_DIR")
        cfg, script = run.config, ""
        if cfg.job.script:  # a script's keys have no option of their own: --script takes them, last
            script = " --script " + shlex.join([cfg.job.script, *cfg.job.script_args])
            cfg = cfg.replace(job=cfg.job.replace(script="", script_args=(), script_sha256=""))
        try:
            lines.append(f"psrv run {shlex.join(to_argv(cfg))} --out NEW_DIR{script}")  # never into the run's own
        except ValueError as exc:  # a setting with no command-line option: --config is the only way
            lines.append(f"# ({exc})")
    return [*lines, "```", ""]
