"""experiments/harness/goodput.py: which variant of a spec is another's fault-free baseline."""
from psrv.config import RunConfig, from_dict
from psrv.experiments.harness.goodput import baselines, faulted


def cfg(**tree) -> RunConfig:
    return from_dict(RunConfig, {"mode": "async", "faults": {"compute_ms": 5.0}, **tree})


def test_the_same_run_without_its_faults_is_the_baseline():
    clean, slow = cfg(), cfg(faults={"compute_ms": 5.0, "straggler": "1:4"})
    killed = cfg(kill={"worker": "1:5"}, job={"steps": 50})  # the steps may differ: a rate is compared
    assert faulted(slow, clean) and faulted(killed, clean)
    assert faulted(clean, slow) is False and faulted(slow, slow) is False  # a baseline has no faults
    assert faulted(cfg(faults={"compute_ms": 5.0, "straggler": "1:4"}, optimizer={"lr": 0.1}), clean) is None
    assert faulted(cfg(faults={"compute_ms": 9.0, "straggler": "1:4"}), clean) is None  # compute is no fault
    assert baselines({"clean": clean, "slow": slow, "killed": killed, "other": cfg(mode="sync")}) == \
        {"slow": "clean", "killed": "clean"}
    assert baselines({"slow": slow, "lr": cfg(optimizer={"lr": 0.1})}) == {}
