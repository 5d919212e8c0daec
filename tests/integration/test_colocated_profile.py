"""experiments/bench/colocated_profile.py: the profile of a co-located round trip times each of its passes, its
parts add up to the round trip, the worker sums nothing (a push the shard reads in place goes whole), and the
functions it wraps to time them are put back."""
import pytest

import psrv.client.roundtrip as roundtrip
import psrv.transport.shm as shm
from psrv.experiments.bench import colocated_profile


def test_the_profile_times_every_pass_and_puts_the_wrapped_functions_back():
    before = roundtrip.finite, shm.copy
    r = colocated_profile.run(16, 2, in_thread=True)  # 16 MB: over WorkerSettings' 8 MB chunks, were it cut
    assert (roundtrip.finite, shm.copy) == before
    assert r["worker_sum"] == 0, r  # the worker's sum before chunking never ran: the push went whole
    for key in ("worker_copy", "shard_sum", "shard_sgd", "memcpy"):
        assert r[key] > 0, (key, r)  # each pass ran: the worker's wrapped copy was called in the round trip
    assert r["worker_sum"] + r["worker_copy"] + r["wait"] == pytest.approx(r["total"])
    text = colocated_profile.table(r)
    assert "the one copy" in text and f"{r['total'] * 1e3:.2f}" in text
