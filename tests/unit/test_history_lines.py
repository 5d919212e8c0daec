"""The history's lines as psrv check reads them back (psrv/history.py writes them with orjson): the values a
process records (sets and tuples of workers, torch and numpy scalars, a dict with int keys) come back as json
would have written them, one whole event per line."""
import json

import numpy as np
import torch

from psrv.experiments.launcher.history.reading import read_log
from psrv.history import History


def test_recorded_values_read_back_as_json_writes_them(tmp_path):
    h = History(tmp_path / "worker-0.1.jsonl")
    h.start("worker", w=0)
    values = {"pushed": {2, 0, 1}, "pair": (3, 4), "version": torch.tensor(7), "n": np.int64(5),
              "lr": np.float32(0.5), "by": {1: "a", 2: [1, 2]}, "why": "late", "dropped": None}
    h.record("commit", clock=1, **values)
    h.close()
    log = read_log(tmp_path / "worker-0.1.jsonl")
    assert not log.torn and [e.ev for e in log.events] == ["start", "commit"]
    got = {k: v for k, v in log.events[1].fields.items() if k not in ("ev", "t")}
    expected = json.loads(json.dumps({"clock": 1, **values}, default=lambda v: sorted(v) if isinstance(v, set)
                                     else v.item()))
    assert got == expected and got["pushed"] == [0, 1, 2] and got["by"] == {"1": "a", "2": [1, 2]}
    lines = (tmp_path / "worker-0.1.jsonl").read_bytes().split(b"\n")
    assert len(lines) == 3 and lines[-1] == b""  # one line an event, each ended by its newline


def test_nothing_is_written_when_off(tmp_path):
    h = History.off()
    h.record("push", w=0, seq=1, shard=0, clock=0)
    assert not h.on and not list(tmp_path.iterdir())
