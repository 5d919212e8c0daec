"""SparseLoCo (docs/compression.md) under `psrv run`'s own processes: DiLoCo's pushes as chunked top-k with 2-bit
values and a decayed error-feedback accumulator, its pulls the same way, the outer step plain SGD. It learns, and
the bytes both ways are a small fraction of the same run's dense ones. (Its numbers against the papers' math: the
conformance matrix's `sparseloco` and `ef_decay` levels.)"""
import pytest

from tests.helpers import psrv_run

ARGS = ("--job", "digits_mlp", "--mode", "sync", "--workers", "2", "--servers", "2", "--local-steps", "8",
        "--optimizer", "sgd", "--momentum", "0", "--lr", "1", "--steps", "160", "--seed", "0")


@pytest.mark.timeout(120)
def test_sparseloco_learns_at_a_fraction_of_the_dense_bytes(tmp_path):
    dense = psrv_run(tmp_path / "dense", *ARGS, timeout=100)
    sparse = psrv_run(tmp_path / "sparse", *ARGS, "--compress", "sparseloco:0.03125", "--error-feedback-decay", "0.9",
                      "--compress-pull", "sparseloco:0.03125", timeout=100)
    assert sparse["complete"] and sparse["compress"] == "sparseloco:0.03125", sparse
    assert sparse["eval_accuracy"] > 0.8, sparse["eval_accuracy"]  # from 0.1 at the start; dense: above 0.9
    assert sparse["bytes_pushed"] < dense["bytes_pushed"] / 10, (sparse["bytes_pushed"], dense["bytes_pushed"])
    assert sparse["bytes_pulled"] < dense["bytes_pulled"] / 3, (sparse["bytes_pulled"], dense["bytes_pulled"])
