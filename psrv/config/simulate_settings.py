"""`psrv simulate`'s own section of the config tree (docs/simulator.md): the simulator's models, re-exported by
psrv/config/sections.py."""
from __future__ import annotations

from dataclasses import dataclass

from psrv.config.base import ConfigError, Section, setting

SIM_LEVELS = ("timing", "learning")
COMPUTE_DISTS = ("constant", "lognormal", "steps.csv")
CODEC_COSTS = ("measured", "off")  # experiments/simulate/codec_cost.py


@dataclass(frozen=True, kw_only=True)
class SimulateSettings(Section):
    """psrv simulate: the discrete-event simulator's models (experiments/simulate, docs/simulator.md)."""

    level: str = setting("timing", "timing: throughput, waits, staleness and clock gaps only; learning: also "
                         "the job's real gradients, applied in the simulated order", choices=SIM_LEVELS)
    compute: str = setting("constant", "a step's compute time before stragglers: constant (model_ms + compute_ms), "
                           "lognormal (that times exp(sigma*Z), Z standard normal) or steps.csv (the steps of "
                           "the real run --compute-csv names, its own stragglers taken out: a rank it had replays "
                           "its own in order, any other draws from all; that run's compute_ms must be this one's)",
                           choices=COMPUTE_DISTS)
    model_ms: float = setting(1.0, "the job's own compute per step, ms, to which --compute-ms is added",
                              minimum=0.0)
    sigma: float = setting(0.5, "lognormal's sigma", minimum=0.0, flag="lognormal-sigma")
    compute_csv: str = setting("", "a real run's steps.csv (its config.json beside it), for --compute steps.csv",
                               metavar="FILE")
    latency_ms: float = setting(0.1, "one-way latency of every message, ms", minimum=0.0)
    bandwidth_gbps: float = setting(10.0, "bandwidth of every link, Gbit/s: a worker's own, and each server's, "
                                    "shared by all its workers' messages", minimum=0.0, above=True)
    server_ms: float = setting(0.0, "a shard's time to handle one push (one at a time), ms", minimum=0.0)
    region_latency_ms: float = setting(20.0, "with --regions and --region-every K > 0: one-way latency between a "
                                       "region and the global shards, ms", minimum=0.0)
    region_bandwidth_gbps: float = setting(1.0, "with --regions and --region-every K > 0: bandwidth between a region "
                                           "and the global shards, Gbit/s (each global shard's link shared by the "
                                           "regions' syncs)", minimum=0.0, above=True)
    codec_cost: str = setting("measured", "the codecs' CPU time (compressed pushes and pulls, streaming DiLoCo's "
                              "outer dtype): measured (each encode and decode timed once on this machine with the "
                              "real codecs at the shard's size, charged to the worker or shard that does it, in "
                              "turn) or off (the bytes alone)", choices=CODEC_COSTS)
    forward_fraction: float = setting(1 / 3, "with overlap (several shards), the share of a step's compute "
                                      "before backward starts; backward then finishes the shards' slices, last "
                                      "layers first, in proportion to their parameters, and each is encoded and "
                                      "sent as it is finished (backward computes two gradients per layer to "
                                      "forward's one: synthetic_mlp measures 0.33-0.35)", minimum=0.0, maximum=1.0)
    sample_workers: int = setting(8, "the first K workers' every step goes into steps.csv", minimum=1,
                                  metavar="K")
    fail_mtbf: float = setting(0.0, "each worker fails after an exponential time of this mean, in simulated seconds "
                               "(drawn per worker from the seed), loses the steps since its last answered push, "
                               "and rejoins --fail-down seconds later with the shards' current weights; 0: no "
                               "failures (timing level only)", minimum=0.0, metavar="SECONDS")
    fail_down: float = setting(1.0, "seconds a failed worker (--fail-mtbf) is down before it rejoins, or a killed one "
                               "(--nemesis) before its new life says HELLO", minimum=0.0,
                               metavar="SECONDS")
    shard_fail_mtbf: float = setting(0.0, "each shard's primary fails after an exponential time of this mean, in "
                                     "simulated seconds from its last takeover (drawn per shard from the seed), and "
                                     "a backup takes it over --shard-fail-down seconds later with every acknowledged "
                                     "push (psrv's failover: nothing lost; what its thread was doing is done again, "
                                     "what reaches it meanwhile waits); 0: no shard failures", minimum=0.0,
                                     metavar="SECONDS")
    shard_fail_down: float = setting(0.5, "seconds from a shard's failure (--shard-fail-mtbf) to its backup's "
                                     "takeover: psrv's failover takes F/2, 0.5 s at the default --failure-bound of 1 s",
                                     minimum=0.0, metavar="SECONDS")
    goodput: bool = setting(False, "simulate the same run again without failures and stragglers, and report goodput: "
                            "useful samples/s over that clean run's")

    def validate(self) -> None:
        super().validate()
        if self.shard_fail_down != 0.5 and not self.shard_fail_mtbf:
            raise ConfigError("shard_fail_down", "is how long a failed shard waits for its backup's takeover, and "
                              "there is no --shard-fail-mtbf: remove it")
        if (self.compute == "steps.csv") != bool(self.compute_csv):
            raise ConfigError("compute_csv", "goes with compute 'steps.csv', and it needs one")
