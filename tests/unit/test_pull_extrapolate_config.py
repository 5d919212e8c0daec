"""--pull-extrapolate K (worker.pull_extrapolate): where a round of local steps starts. Accepted with local steps in
every parameter-server mode; refused in one line where it would do nothing or the wrong thing: without local steps,
with fragments (merged one at a time into the local weights), with compressed pulls (the copy must stay the shards'
mirror), with DC-ASGD (its compensation reads the weights the shard sent) and in the all-reduce modes (no pulls)."""
import pytest

from psrv.config import ConfigError, RunConfig, from_dict

LOCAL = {"local_steps": 4, "pull_extrapolate": 2.0}


@pytest.mark.parametrize("tree", [{"mode": "sync", "quorum": 2, "cluster": {"workers": 3}}, {"mode": "async"},
                                  {"mode": "ssp"}, {"mode": "sync"}])
def test_accepted_with_local_steps(tree):
    cfg = from_dict(RunConfig, {**tree, "worker": LOCAL})
    assert cfg.worker.pull_extrapolate == 2.0 and cfg.worker_config(0, servers=("tcp://127.0.0.1:1",)).pull_extrapolate == 2.0


@pytest.mark.parametrize("tree, key, says", [
    ({"worker": {"pull_extrapolate": 1.0}}, "worker.pull_extrapolate", "needs local_steps > 1"),
    ({"worker": {**LOCAL, "fragments": 2}}, "worker.pull_extrapolate", "fragments are merged into the local weights"),
    ({"worker": {**LOCAL, "compress_pull": "topk:0.1"}}, "worker.pull_extrapolate", "a compressed pull keeps"),
    ({"mode": "async", "optimizer": {"update_rule": "dc-asgd"}, "worker": LOCAL}, "worker.pull_extrapolate",
     "dc-asgd compensates a push from the weights the shard sent"),
    ({"mode": "ddp", "worker": LOCAL}, "worker.pull_extrapolate", "mode 'ddp' has none"),
    ({"worker": {**LOCAL, "pull_extrapolate": -1.0}}, "worker.pull_extrapolate", ">= 0"),
])
def test_refused_in_one_line(tree, key, says):
    with pytest.raises(ConfigError) as exc:
        from_dict(RunConfig, tree)
    assert exc.value.key == key and says in str(exc.value), str(exc.value)
    assert "\n" not in str(exc.value)
