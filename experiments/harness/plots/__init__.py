"""The report's plots (PNG, matplotlib Agg), one module per kind: learning curves on fair axes
(progress), the per-worker timeline, staleness and clock gap, throughput and the time breakdown."""
from __future__ import annotations

from pathlib import Path

from psrv.experiments.harness.collect import VariantSummary
from psrv.experiments.harness.plots.breakdown import plot_breakdown, plot_throughput
from psrv.experiments.harness.plots.figure import load
from psrv.experiments.harness.plots.progress import plot_metric
from psrv.experiments.harness.plots.staleness import plot_distributions, plot_over_time
from psrv.experiments.harness.plots.timeline import plot_timeline
from psrv.experiments.harness.plots.traffic import plot_traffic
from psrv.experiments.harness.spec import ExperimentSpec

__all__ = ["write_plots"]


def write_plots(out_dir: str | Path, spec: ExperimentSpec,
                summaries: list[VariantSummary]) -> list[tuple[str, str]]:
    """Write DIR/plots/*.png; returns (caption, path relative to DIR) of each one written."""
    out = Path(out_dir)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    for old in (out / "plots").glob("*.png"):  # a plot this report does not draw must not linger
        old.unlink()
    data = load(out, spec)
    # the primary metric: the target's where it names one (perplexity, ...), else accuracy
    shown = spec.target.metric or "accuracy"
    third = spec.target.value if spec.target.metric else spec.target.eval_accuracy
    plots = [("Held-out and training loss against samples seen, updates applied and wall time",
              "plots/loss_curves.png"),
             (f"Held-out {shown} against samples seen, updates applied and wall time",
              f"plots/{shown}_curves.png"),
             ("Throughput", "plots/throughput.png"),
             ("Where a worker step's time goes", "plots/time_breakdown.png")]
    paths = {rel: out / rel for _, rel in plots}
    plot_metric(paths["plots/loss_curves.png"], data, y="eval_loss", ylabel="loss",
                target=spec.target.eval_loss, train_loss=True)
    plot_metric(paths[f"plots/{shown}_curves.png"], data, y=f"eval_{shown}", ylabel=shown, target=third,
                train_loss=False)
    if plot_timeline(out / "plots/worker_timeline.png", data):
        plots.insert(2, ("Per-worker step timeline", "plots/worker_timeline.png"))
    plot_throughput(paths["plots/throughput.png"], summaries)
    plot_breakdown(paths["plots/time_breakdown.png"], data)
    if plot_distributions(out / "plots/staleness.png", data):
        plots.append(("Staleness and clock gap (async, ssp and quorum variants)", "plots/staleness.png"))
    if plot_over_time(out / "plots/staleness_over_time.png", data):
        plots.append(("Staleness over time (async, ssp and quorum variants)", "plots/staleness_over_time.png"))
    if plot_traffic(out / "plots/traffic.png", spec, summaries):
        plots.append(("Traffic of the busiest process per step", "plots/traffic.png"))
    return plots
