"""Which way a held-out metric improves, by its name, without torch: the jobs, a spec's target and a
script's evaluations (psrv.Worker.log_eval) read it from here."""
from __future__ import annotations

LOWER_IS_BETTER = ("loss", "perplexity", "bits_per_byte", "error", "mse", "mae")


def lower_is_better_by_name(metric: str) -> bool:
    """The default direction of a metric: lower for loss-like names, higher for the rest."""
    return metric in LOWER_IS_BETTER or metric.endswith("loss") or metric.endswith("error")


def primary_metric(names) -> str | None:
    """The metric a script's evaluations are judged by: accuracy where reported (as for a classifier job),
    else loss, else the first name given; None for none."""
    names = list(names)
    return next((n for n in ("accuracy", "loss") if n in names), names[0] if names else None)
