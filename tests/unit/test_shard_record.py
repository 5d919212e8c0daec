"""A replicated shard's record, DIR/server-K.json, is the record of the replica that served it last
(experiments/launcher/replication.py settle): a primary paused past the takeover bound is fenced when it comes back and
writes its own record, which counts only what it applied until then; before, that record stayed the shard's
(a 300-step run said `updates_applied` 71 while the backup that took over held the true 300)."""
from __future__ import annotations

import json

from psrv.config import RunConfig, from_dict
from psrv.experiments.launcher.replication import settle


def _write(path, **record) -> None:
    path.write_text(json.dumps({"shard": 0, "num_shards": 1, **record}))


def test_the_replica_that_served_last_writes_the_shards_record_and_a_fenced_primary_keeps_its_own(tmp_path):
    cfg = from_dict(RunConfig, {"cluster": {"servers": 1, "replicas": 1}})
    _write(tmp_path / "server-0.json", role="primary", epoch=1, fenced=True, updates_applied=71, version=71)
    _write(tmp_path / "backup-0-1.json", role="primary", epoch=2, fenced=False, updates_applied=300, version=300,
           address="tcp://127.0.0.1:2", failovers=[{"epoch": 2, "from": "tcp://127.0.0.1:1", "at": 1.0,
                                                    "silent_s": 0.5, "version": 71}])
    _write(tmp_path / "backup-0-2.json", role="backup", epoch=3, fenced=False, updates_applied=300, version=300,
           address="tcp://127.0.0.1:3", failovers=[])
    replication = settle(cfg, tmp_path)
    record = json.loads((tmp_path / "server-0.json").read_text())
    assert record["updates_applied"] == 300 and record["address"] == "tcp://127.0.0.1:2" and record["took_over"]
    assert json.loads((tmp_path / "replaced-server-0.json").read_text())["updates_applied"] == 71
    assert [f["epoch"] for f in replication["failovers"]] == [2]


def test_a_primary_that_served_to_the_end_keeps_its_record(tmp_path):
    cfg = from_dict(RunConfig, {"cluster": {"servers": 1, "replicas": 1}})
    _write(tmp_path / "server-0.json", role="primary", epoch=1, fenced=False, updates_applied=300, version=300)
    _write(tmp_path / "backup-0-1.json", role="backup", epoch=1, fenced=False, updates_applied=300, version=300,
           failovers=[])
    settle(cfg, tmp_path)
    assert "took_over" not in json.loads((tmp_path / "server-0.json").read_text())
    assert not (tmp_path / "replaced-server-0.json").exists()
