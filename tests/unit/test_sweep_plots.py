"""A simulation spec's plots (psrv/experiments/simulate/sweep.py `figure`): a line per variant against N, or, where
the spec sweeps one N, a bar per variant, so variants with equal values (a quorum's timing is async's) are not drawn
one on another at the one N."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from psrv.cli import main  # noqa: E402
from psrv.experiments.simulate.sweep import figure  # noqa: E402

HEADER = {"name": "spec"}


def _rows(ns, values):
    return [{"variant": v, "workers": n, "goodput": values[v] if values[v] is None else values[v] * n / ns[0]}
            for v in values for n in ns]


def test_one_n_draws_a_bar_per_variant_in_the_specs_order_with_its_value():
    values = {"sync-mtbf5": 0.757, "quorum-mtbf5": 1.0, "async-mtbf5": 1.0, "ssp-none": None}
    fig = figure(HEADER, "goodput", _rows([1000], values), list(values))
    ax = fig.axes[0]
    assert [p.get_width() for p in ax.patches] == [0.757, 1.0, 1.0, 0]
    assert [t.get_text() for t in ax.get_yticklabels()] == list(values)
    assert [t.get_text().strip() for t in ax.texts] == ["0.757", "1", "1", "n/a"]
    assert "N = 1000" in ax.get_title() and not ax.lines
    plt.close(fig)


def test_several_ns_draw_a_line_per_variant():
    values = {"sync": 0.5, "async": 0.9}
    fig = figure(HEADER, "goodput", _rows([16, 64, 256], values), list(values))
    ax = fig.axes[0]
    assert [list(line.get_xdata()) for line in ax.lines] == [[16, 64, 256]] * 2 and not ax.patches
    plt.close(fig)


def test_a_one_n_spec_writes_its_bar_plots(tmp_path):
    spec = tmp_path / "one_n.toml"
    spec.write_text('name = "one"\nworkers = [4]\n[job]\nsteps = 5\n[faults]\ncompute_ms = 20.0\n'
                    '[[variants]]\nname = "sync"\nmode = "sync"\n[[variants]]\nname = "async"\nmode = "async"\n')
    assert main(["simulate", "--spec", str(spec), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "plots" / "samples_per_second.png").stat().st_size > 0
