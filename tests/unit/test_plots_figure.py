"""What every report plot shares: a colour per variant up to 50 variants, and a legend that covers no
panel once there are many variants."""
from __future__ import annotations

from matplotlib.colors import to_rgba

from psrv.experiments.harness.plots.figure import color, figure, legend


def test_fifty_variants_get_fifty_colours() -> None:
    assert len({to_rgba(color(i)) for i in range(50)}) == 50
    assert color(0) == "C0" and color(9) == "C9"  # the first ten as before


def test_a_legend_of_many_variants_goes_outside_the_panels() -> None:
    for lines, inside in ((3, True), (20, False)):
        fig, (ax,) = figure()
        for i in range(lines):
            ax.plot([0, 1], [i, i], color=color(i), label=f"v{i}")
        legend(fig, ax)
        assert (ax.get_legend() is not None) == inside and bool(fig.legends) != inside
