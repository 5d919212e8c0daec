"""A simulated run's config: a run's (psrv/config, RunConfig) and the simulator's own section."""
from __future__ import annotations

from dataclasses import dataclass

from psrv.config import ConfigError, RunConfig
from psrv.config.base import default_of, leaves, section
from psrv.config.nemesis import Fixed, kinds_of, parse_schedule
from psrv.config.sections import SimulateSettings

# The settings of a run the simulator models (a key, or a section ending in '.'); the others (where
# tensors live, the transport, timeouts, error feedback's effect on learning, the all-reduce baselines) it does not:
# `psrv simulate` has no option for them and refuses them set in a --config file.
SIMULATED = ("mode", "staleness", "backup_workers", "quorum", "quorum_max_age", "quorum_grace",
             "quorum_grace_adaptive", "quorum_wait", "seed", "cluster.servers",
             "cluster.workers", "job.", "optimizer.", "worker.local_steps", "worker.overlap", "worker.wire_dtype", "worker.compress", "worker.compress_min_numel",
             "worker.compress_pull", "worker.pull_error_feedback", "worker.pull_resync", "worker.fragments",
             "worker.outer_dtype", "worker.inner_optimizer", "worker.inner_lr", "faults.compute_ms",
             "faults.straggler", "faults.transient_stragglers", "hierarchy.regions", "hierarchy.region_every",
             "nemesis.schedule", "restarts.workers", "server.worker_timeout", "simulate.")


def is_simulated(key: str) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in SIMULATED)


@dataclass(frozen=True, kw_only=True)
class SimulationConfig(RunConfig):
    """A run as `psrv run` takes it, and how it is simulated."""

    simulate: SimulateSettings = section(SimulateSettings)

    def validate(self) -> None:
        super().validate()
        for key, f, _ in leaves(type(self)):
            value = self
            for part in key.split("."):
                value = getattr(value, part)
            if not is_simulated(key) and value != default_of(f):
                raise ConfigError(key, "is not simulated (docs/simulator.md says what is); remove it")
        if not isinstance(self.worker.local_steps, int):
            raise ConfigError("worker.local_steps", "dynamic local steps are not simulated; give a number")
        if self.is_allreduce:
            raise ConfigError("mode", f"the simulator runs the parameter server's modes (sync, async, ssp); "
                              f"got {self.mode!r}")
        if self.simulate.level == "learning" and self.optimizer.name == "onebit_adam":
            raise ConfigError("simulate.level", "learning with onebit_adam (workers' momenta, compressed) is not "
                              "simulated; use level 'timing'")
        w = self.worker
        if self.simulate.level == "learning" and (w.compress or w.compress_pull or w.wire_dtype != "float32"):
            raise ConfigError("simulate.level", "learning with compressed pushes or pulls (their loss of precision) "
                              "is not simulated; use level 'timing', where they set the bytes")
        if self.simulate.level == "learning" and self.simulate.fail_mtbf:
            raise ConfigError("simulate.fail_mtbf", "failures at the learning level (a lost round's gradients) are not "
                              "simulated; use level 'timing'")
        _regions(self)
        _kills(self)
        if self.simulate.level == "learning" and self.worker.local_updates:
            raise ConfigError("simulate.level", "learning with local steps (an inner optimizer per worker) is not "
                              "simulated; use level 'timing' or local_steps 1")


def _kills(cfg: SimulationConfig) -> None:
    """psrv run's nemesis, kills of workers only (experiments/simulate/kills.py), and what goes with it."""
    sim, schedule = cfg.simulate, cfg.nemesis.schedule
    if not schedule:
        for key, value, default, what in (
                ("restarts.workers", cfg.restarts.workers, 0, "restarts the workers --nemesis kills"),
                ("server.worker_timeout", cfg.server.worker_timeout, default_of(_field("server.worker_timeout")),
                 "is when the shards let a killed worker go"),
                ("simulate.fail_down", sim.fail_down, 1.0, "is how long a failed or killed worker stays down")):
            if value != default and not (key == "simulate.fail_down" and sim.fail_mtbf):
                raise ConfigError(key, f"{what}, and there is no --nemesis schedule"
                                       f"{'' if key != 'simulate.fail_down' else ' nor --fail-mtbf'}: remove it")
        return
    clauses = parse_schedule(schedule)
    other = sorted(kinds_of(schedule) - {"kill"})
    targets = sorted({str(t) for c in clauses for t in c.targets if t.role != "worker"})
    if other or targets:
        raise ConfigError("nemesis.schedule", f"the simulator kills workers only (kill worker:R or worker:*); "
                                              f"{', '.join(other + targets)} is not simulated")
    at_step = [c for c in clauses if isinstance(c, Fixed) and c.at.step is not None]
    if at_step:
        raise ConfigError("nemesis.schedule", f"a kill at step {at_step[0].at.step} of worker 0's is not simulated; "
                                              "give its time in seconds ('at 30s')")
    for given, key, what in ((sim.level == "learning", "simulate.level", "at the learning level"),
                             (sim.fail_mtbf, "simulate.fail_mtbf", "beside --fail-mtbf's failures"),
                             (cfg.worker.fragments > 1, "worker.fragments", "with streaming DiLoCo's fragments")):
        if given:
            raise ConfigError(key, f"kills (--nemesis) {what} are not simulated: remove one")


def _field(key: str):
    return next(f for k, f, _ in leaves(RunConfig) if k == key)


NOT_SIMULATED = tuple(key for key, _, _ in leaves(SimulationConfig) if not is_simulated(key))


def _regions(cfg: SimulationConfig) -> None:
    """Regional shards are simulated at the timing level, without failures (experiments/simulate/regions.py); their
    goodput is end to end only (the span while every rank ran is not kept across the regions)."""
    sim = cfg.simulate
    if not cfg.hierarchy.tiered:
        for key, default in (("region_latency_ms", 20.0), ("region_bandwidth_gbps", 1.0)):
            if getattr(sim, key) != default:
                raise ConfigError(f"simulate.{key}", "is the link between regions and the global shards: give "
                                                     "--regions R (R > 1) and --region-every K > 0 too")
        return
    for given, key, what in ((sim.level == "learning", "simulate.level", "learning (level 'timing' only)"),
                             (sim.fail_mtbf, "simulate.fail_mtbf", "failures"),
                             (sim.shard_fail_mtbf, "simulate.shard_fail_mtbf", "shard failures"),
                             (cfg.nemesis.schedule, "nemesis.schedule", "kills")):
        if given:
            raise ConfigError(key, f"{what} with regional shards (--regions, --region-every > 0) is not simulated: "
                                   "remove one")
