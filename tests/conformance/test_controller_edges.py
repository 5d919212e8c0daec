"""What no case of the matrix shows about the consistency controllers, found by `make mutants`
(tests/conformance/mutants.py): SSP with its bound at zero is accepted and is BSP's barrier (the matrix's ssp
cases use bounds of 1 and more), and a negative bound is refused in one line naming it."""
import pytest

from psrv.server.consistency import make_controller
from psrv.server.consistency.ssp import SSPController


def bsp_pull_ready(clocks: dict[int, int], clock: int) -> bool:
    """BSP, from its definition: a pull for `clock` waits until every worker has pushed every clock before it."""
    return all(pushed >= clock for pushed in clocks.values())


def test_ssp_at_staleness_0_is_accepted_and_is_the_bsp_barrier():
    c = SSPController(3, staleness=0)
    pushes = [(0, 0), (1, 0), (0, 1), (2, 0), (1, 1), (2, 1), (0, 2)]
    clocks = {w: 0 for w in range(3)}
    for worker, clock in pushes:
        c.push(worker, clock)
        clocks[worker] = clock + 1
        for w in range(3):  # each worker's pull for the clock it pushes next
            assert c.pull_ready(w, clocks[w]) == bsp_pull_ready(clocks, clocks[w]), (worker, clock, w, clocks)
    assert make_controller("ssp", 2, staleness=0).staleness == 0


def test_a_negative_staleness_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"^staleness must be >= 0; got -1$"):
        SSPController(2, staleness=-1)
