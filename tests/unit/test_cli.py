"""Pins the CLI surface: a new, renamed or removed option fails here until it is meant (and documented)."""
import argparse

import pytest

from psrv.cli import build_parser

SURFACE = {
    "serve": ((), ("--backup-of", "--backup-workers", "--bind", "--bulk", "--cgad-alpha", "--cgad-cutoff",
              "--checkpoint-dir", "--checkpoint-every", "--clip-grad-norm", "--config", "--curve-keys",
              "--dc-lambda", "--device", "--dn-period", "--failure-bound", "--first-rank", "--freeze-step",
              "--heloco-block", "--heloco-kappa", "--heloco-keep", "--heloco-reorient", "--heloco-shrink",
              "--join-timeout", "--log-level", "--lr", "--lr-decay-steps", "--lr-end-factor", "--lr-gamma",
              "--lr-schedule", "--lr-step-size", "--max-message-bytes", "--metrics-host", "--metrics-linger",
              "--metrics-port", "--mode", "--momentum", "--nesterov", "--nonfinite", "--num-shards", "--optimizer",
              "--out", "--quorum", "--quorum-grace", "--quorum-grace-adaptive", "--quorum-max-age", "--quorum-wait", "--ready-file",
              "--region", "--resume", "--rpc-backups", "--rpc-master", "--shard", "--shared-memory", "--staleness",
              "--threads", "--transport", "--update-rule", "--upstream", "--upstream-every", "--upstream-world",
              "--warmup-steps", "--weight-decay", "--witness", "--worker-timeout", "--workers", "--world-size")),
    "worker": ((), ("--batch-size", "--bulk", "--clip-grad-norm", "--compress", "--compress-min-numel",
                    "--compress-pull", "--compress-warmup", "--compute-ms", "--config", "--curve-keys", "--device",
                    "--error-feedback-decay", "--eval-every", "--fragments", "--inner-lr", "--inner-optimizer", "--job", "--local-steps",
                    "--log-level", "--metrics-host", "--metrics-linger", "--metrics-port", "--mode",
                    "--momentum-masking", "--net-delay-ms", "--no-error-feedback", "--no-momentum-correction",
                    "--no-overlap", "--no-pull-error-feedback", "--out", "--outer-dtype", "--params-out",
                    "--progress-file", "--pull-extrapolate", "--pull-in-place", "--pull-resync", "--push-chunk-mb", "--rank", "--request-timeout", "--seed",
                    "--servers",
                    "--shared-memory", "--sign-scale", "--state-out", "--steps", "--straggler",
                    "--threads", "--transient-stragglers", "--transport", "--wire-dtype", "--world-size")),
    "keygen": (("dir",), ("--log-level", "--workers")),
    "admin": (("action",), ("--curve-keys", "--log-level", "--servers")),
    "run": ((), ("--backup-workers", "--bandwidth", "--batch-size", "--bulk", "--cgad-alpha", "--cgad-cutoff",
              "--checkpoint-every", "--clip-grad-norm", "--compress", "--compress-min-numel", "--compress-pull",
              "--compress-warmup", "--compute-ms", "--config", "--dc-lambda", "--ddp-comm-hook", "--device",
              "--dn-period", "--dry-run", "--error-feedback-decay", "--eval-every", "--failure-bound", "--fragments",
              "--freeze-step", "--global-lr", "--global-momentum", "--goodput-baseline", "--heloco-block",
              "--heloco-kappa", "--heloco-keep", "--heloco-reorient", "--heloco-shrink", "--image", "--inner-lr",
              "--inner-optimizer", "--job", "--join-timeout", "--kill-server", "--kill-worker", "--launcher",
              "--local-steps", "--log-level", "--lr", "--lr-decay-steps", "--lr-end-factor", "--lr-gamma",
              "--lr-schedule", "--lr-step-size", "--max-message-bytes", "--metrics", "--metrics-linger", "--mlflow",
              "--mode", "--momentum", "--momentum-masking", "--namespace", "--nemesis", "--nemesis-disk-mb",
              "--nesterov", "--net-delay-ms", "--no-error-feedback", "--no-momentum-correction", "--no-overlap",
              "--no-progress", "--no-pull-error-feedback", "--nonfinite", "--optimizer", "--out", "--outer-dtype",
              "--powersgd-rank", "--pull-extrapolate", "--pull-in-place", "--pull-resync", "--push-chunk-mb", "--pvc",
              "--quorum",
              "--quorum-grace",
              "--quorum-grace-adaptive", "--quorum-max-age", "--quorum-wait", "--region-every", "--regions", "--replicas",
              "--request-timeout", "--restart-workers", "--scheduler", "--script", "--seed", "--servers",
              "--shared-memory", "--sign-scale", "--staleness", "--stall-timeout", "--steps", "--straggler",
              "--tensorboard", "--transient-stragglers", "--transport", "--update-rule", "--wait-barrier",
              "--warmup-steps", "--weight-decay", "--wire-dtype", "--worker-timeout", "--workers")),
    "experiment": (("spec",), ("--dry-run", "--image", "--log-level", "--mlflow", "--namespace", "--out", "--profile",
                               "--pvc", "--scheduler",
                               "--tensorboard")),
    "top": ((), ("--interval", "--log-level", "--once", "--servers", "--timeout")),
    "check": (("run",), ("--log-level",)),
    "simulate": ((), ("--against", "--backup-workers", "--bandwidth-gbps", "--batch-size", "--calibrate",
                   "--cgad-alpha", "--cgad-cutoff", "--clip-grad-norm", "--codec-cost", "--compress",
                   "--compress-min-numel", "--compress-pull", "--compute", "--compute-csv", "--compute-ms",
                   "--config", "--dc-lambda", "--dn-period", "--eval-every", "--fail-down", "--fail-mtbf",
                   "--forward-fraction", "--fragments", "--freeze-step", "--goodput", "--heloco-block",
                   "--heloco-kappa", "--heloco-keep", "--heloco-reorient", "--heloco-shrink", "--inner-lr",
                   "--inner-optimizer", "--job", "--latency-ms", "--level", "--local-steps", "--log-level",
                   "--lognormal-sigma", "--lr", "--lr-decay-steps", "--lr-end-factor", "--lr-gamma", "--lr-schedule",
                   "--lr-step-size", "--mode", "--model-ms", "--momentum", "--nemesis", "--nesterov", "--no-overlap",
                   "--no-pull-error-feedback", "--optimizer", "--out", "--outer-dtype", "--pull-resync", "--quorum",
                   "--quorum-grace", "--quorum-grace-adaptive", "--quorum-max-age", "--quorum-wait", "--region-bandwidth-gbps",
                   "--region-every", "--region-latency-ms", "--regions", "--restart-workers", "--sample-workers",
                   "--seed", "--server-ms", "--servers", "--shard-fail-down", "--shard-fail-mtbf", "--spec",
                   "--staleness", "--steps", "--straggler", "--transient-stragglers", "--update-rule",
                   "--warmup-steps", "--weight-decay", "--wire-dtype", "--worker-timeout", "--workers")),
}


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_the_subcommands_are_exactly_these():
    assert set(subcommands()) == set(SURFACE)


@pytest.mark.parametrize("name", sorted(SURFACE))
def test_each_subcommand_takes_exactly_these_arguments(name):
    sp = subcommands()[name]
    positional = tuple(a.dest for a in sp._actions if not a.option_strings)
    options = tuple(sorted(o for a in sp._actions for o in a.option_strings if o.startswith("--") and o != "--help"))
    assert (positional, options) == SURFACE[name]


@pytest.mark.parametrize("name", sorted(SURFACE))
def test_every_option_has_help_text(name):
    sp = subcommands()[name]
    missing = [a.option_strings for a in sp._actions if a.option_strings and not a.help]
    assert not missing


def test_defaults_run_the_embedded_default():
    from psrv.config import RunConfig
    from psrv.config.cli_args import config_from_args
    cfg = config_from_args(RunConfig, build_parser().parse_args(["run"]))
    assert (cfg.cluster.servers, cfg.cluster.workers, cfg.mode, cfg.staleness, cfg.job.name) == \
        (2, 2, "ssp", 2, "digits_mlp")


def test_server_addresses_wait_for_ready_files_and_fail_clearly(tmp_path):
    import threading

    from psrv.transport.addresses import split_addresses as server_addresses
    ready = tmp_path / "server-1.addr"
    threading.Timer(0.2, lambda: ready.write_text("tcp://127.0.0.1:5556\n")).start()
    assert server_addresses(f"tcp://127.0.0.1:5555, @{ready}", wait=10) == ("tcp://127.0.0.1:5555",
                                                                              "tcp://127.0.0.1:5556")
    with pytest.raises(ValueError, match="did not appear within"):
        server_addresses(f"@{tmp_path / 'never.addr'}", wait=0.1)
