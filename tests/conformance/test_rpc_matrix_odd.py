"""The conformance matrix's odd cases over torch RPC (test_rpc_matrix.py says why they are files of their own)."""
from __future__ import annotations

import pytest

from tests.conformance.axes import case_id
from tests.conformance.test_matrix import one_thread  # noqa: F401 (one torch thread here too)
from tests.conformance.test_rpc_matrix import RPC_CASES, run_rpc_case


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", RPC_CASES[1::2], ids=case_id)
def test_rpc_pairs(case, tmp_path, monkeypatch):
    run_rpc_case(case, tmp_path, monkeypatch)
