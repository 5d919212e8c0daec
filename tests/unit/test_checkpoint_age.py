"""`checkpoint_max_age_seconds` (psrv/checkpoint.py Checkpointer): the oldest the newest checkpoint on disk has been,
from the state it holds being taken to the next one landing (from the start to the first), on a clock of the test's;
a starved writer is said in the log."""
import logging

from psrv.checkpoint import Checkpointer


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_age_runs_from_the_state_taken_to_the_next_one_landing(tmp_path, caplog):
    clock = Clock()
    c = Checkpointer(str(tmp_path), shard=0, num_shards=1, every=5.0, now=clock)
    assert c.max_age is None
    clock.t = 105.0
    c.begin()            # state taken at 105
    clock.t = 106.0
    c.write({"w": 1}, version=1)   # lands at 106: nothing was on disk since the start (100): 6 s
    assert c.max_age == 6.0
    clock.t = 111.0
    c.begin()            # taken at 111
    clock.t = 112.5
    c.write({"w": 2}, version=2)   # lands at 112.5; the one before held 105's state: 7.5 s
    assert c.max_age == 7.5
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    clock.t = 113.0
    c.begin()            # taken at 113, but the writer is starved: it lands at 125
    clock.t = 125.0
    with caplog.at_level(logging.WARNING, logger="psrv"):
        c.write({"w": 3}, version=3)
    assert c.max_age == 125.0 - 111.0
    assert "the newest checkpoint on disk was 14.0s old before this one landed (--checkpoint-every 5s)" in caplog.text


def test_a_failed_write_lands_nothing(tmp_path):
    clock = Clock()
    c = Checkpointer(str(tmp_path / "missing" / "x"), shard=0, num_shards=1, every=5.0, now=clock)
    (tmp_path / "missing").write_text("a file where the folder should be")
    c.begin()
    clock.t = 130.0
    assert c.write({"w": 1}, version=1) is None and c.max_age is None
