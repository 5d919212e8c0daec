"""The nemesis's schedule (`psrv run --nemesis SPEC`, spec key nemesis.schedule): its text form, what a run must
have for it, the faults a seed draws, and which process a target is (the witness's latest epoch)."""
from __future__ import annotations

import json

import pytest

from psrv.cli import build_parser
from psrv.config import ConfigError, RunConfig, from_dict
from psrv.config.base import config_hash
from psrv.config.cli_args import config_from_args
from psrv.config.nemesis import At, Drawn, Fixed, Target, parse_schedule
from psrv.experiments.launcher.nemesis.record import Record
from psrv.experiments.launcher.nemesis.schedule import Timeline, draws
from psrv.experiments.launcher.nemesis.targets import configuration

W1, P0, B0 = Target("worker", 1), Target("primary", 0), Target("backup", 0)


@pytest.mark.parametrize(("text", "clauses"), [
    ("", ()),
    ("pause primary:0 at step 40 for 2.5s; kill backup:0 at 12s",
     (Fixed("pause", (P0,), At(step=40), 2.5), Fixed("kill", (B0,), At(seconds=12.0)))),
    ("partition worker:1/primary:0 at 3s for 500ms", (Fixed("partition", (W1, P0), At(seconds=3.0), 0.5),)),
    ("late_ack backup:0 at step 20 for 2s", (Fixed("late_ack", (B0,), At(step=20), 2.0),)),
    ("disk_full at 5s for 1s", (Fixed("disk_full", (), At(seconds=5.0), 1.0),)),
    ("pause launcher at 1s for 1s;", (Fixed("pause", (Target("launcher"),), At(seconds=1.0), 1.0),)),
    ("pause worker:* at .5s for 1s", (Fixed("pause", (Target("worker"),), At(seconds=0.5), 1.0),)),
    ("every 5s pause,kill on worker:*,primary:0 for 1s seed 7",
     (Drawn(5.0, "exp", ("pause", "kill"), (Target("worker"), P0), 1.0, 7),)),
    ("every 2s fixed kill on worker:1", (Drawn(2.0, "fixed", ("kill",), (W1,)),)),
    ("every 10s disk_full for 1s", (Drawn(10.0, "exp", ("disk_full",), (), 1.0),)),
])
def test_good_forms(text, clauses):
    assert parse_schedule(text) == clauses


@pytest.mark.parametrize(("text", "why"), [
    ("pause primary:0 at 40", "a time looks like 12s, 2.5s or 500ms, not '40'"),
    ("pause primary:0 at step 0 for 1s", "a step is an integer >= 1"),
    ("stop worker:1 at 3s", "unknown KIND 'stop'"),
    ("pause server:0 at 3s for 1s", "unknown TARGET 'server:0'"),
    ("pause worker:1 for 1s", "no 'at'"),
    ("pause worker:1 at 3s", "pause lasts: add 'for Ds'"),
    ("kill worker:1 at 3s for 1s", "a kill does not last"),
    ("kill launcher at 3s", "the launcher is only paused"),
    ("late_ack worker:1 at 3s for 1s", "only to a backup"),
    ("partition worker:1 at 3s for 1s", "partition takes TARGET/TARGET"),
    ("partition worker:1/worker:1 at 3s for 1s", "two different processes"),
    ("disk_full worker:1 at 3s for 1s", "disk_full takes no TARGET"),
    ("pause worker:1 at 3s for 1s now", "unexpected 'now'"),
    ("every 0s pause on worker:1 for 1s", "'every' takes a time > 0"),
    ("every 5s pause on for 1s", "unknown TARGET 'for'"),
    ("every 5s partition on worker:1,launcher for 1s", "partition draws two different targets"),
    ("every 5s late_ack on worker:1 for 1s", "late_ack has no TARGET"),
    ("every 5s kill on worker:1,launcher", "no KIND listed can be done to launcher"),
    ("every 5s pause on worker:1 for 1s seed x", "a seed is an integer"),
    (" ; ", "no clause"),
])
def test_bad_forms_are_one_line_naming_the_form(text, why):
    with pytest.raises(ValueError) as err:
        parse_schedule(text)
    message = str(err.value)
    assert why in message and "\n" not in message, message
    assert "a clause looks like 'KIND TARGET at (step N | Ns) [for Ds]' or 'every Ts" in message, message


@pytest.mark.parametrize(("data", "message"), [
    ({"schedule": "kill worker:0 at 3s"}, r"^nemesis\.schedule: kill worker:0: rank 0 writes the final weights"),
    ({"schedule": "pause worker:2 at 3s for 1s"}, r"^nemesis\.schedule: worker:2: rank must be in 0\.\.1"),
    ({"schedule": "pause primary:2 at 3s for 1s"}, r"^nemesis\.schedule: primary:2: shard must be in 0\.\.1"),
    ({"schedule": "kill backup:0 at 3s"}, r"^nemesis\.schedule: backup:0: the run has no backups"),
    ({"schedule": "disk_full at 3s for 1s"},
     r"^nemesis\.schedule: disk_full fills DIR/checkpoints, .*--checkpoint-every"),
    ({"schedule": "pause at"}, r"^nemesis\.schedule: no time after 'at' in 'pause at'; a clause looks like"),
    ({"disk_mb": 64}, r"^nemesis\.disk_mb: sizes the tmpfs disk_full fills; the schedule has none"),
])
def test_a_run_is_refused_naming_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(RunConfig, {"nemesis": data})


def test_the_schedule_is_part_of_the_config_and_its_hash_and_the_command_line_names_its_flag():
    text = "pause worker:1 at step 10 for 1s; every 5s kill on worker:1 seed 3"
    cfg = config_from_args(RunConfig, build_parser().parse_args(["run", "--nemesis", text]))
    assert cfg.nemesis.schedule == text and cfg == from_dict(RunConfig, {"nemesis": {"schedule": text}})
    assert config_hash(cfg) != config_hash(RunConfig())
    with pytest.raises(ValueError, match=r"^--nemesis: kill worker:0: rank 0 writes the final weights"):
        config_from_args(RunConfig, build_parser().parse_args(["run", "--nemesis", "kill worker:0 at 1s"]))


def _within(text: str, seconds: float, *, seed: int = 0) -> list[str]:
    """The faults `text` draws in its first `seconds` (after worker 0's first step) with run seed `seed`."""
    return [str(p) for p in Timeline(text, seed=seed, servers=2, workers=4).due(seconds=seconds, step=0)]


def test_a_seed_draws_the_same_faults_and_another_seed_others():
    text = "every 2s pause,kill,partition on worker:*,primary:*,backup:0 for 1s"
    first = _within(text, 60, seed=5)
    assert len(first) > 10 and first == _within(text, 60, seed=5)
    assert first != _within(text, 60, seed=6)
    assert _within(text + " seed 9", 60, seed=5) == _within(text + " seed 9", 60, seed=6)  # its own seed wins
    assert {f.split()[0] for f in first} == {"pause", "kill", "partition"}
    assert "worker:0" not in " ".join(first)  # `*` never draws rank 0


def test_intervals_are_exponential_with_the_given_mean_or_fixed():
    [clause] = parse_schedule("every 2s pause on worker:1 for 1s")
    stream = draws(clause, 0, seed=1, servers=1, workers=2)
    times = [next(stream).at.seconds for _ in range(2000)]
    gaps = [b - a for a, b in zip([0.0, *times], times)]
    assert 1.85 < sum(gaps) / len(gaps) < 2.15 and min(gaps) < 0.1 and max(gaps) > 8  # exponential, mean 2 s
    assert _within("every 2s fixed pause on worker:1 for 1s", 6) == [
        f"pause worker:1 at {t}s for 1s" for t in (2, 4, 6)]


def test_the_timeline_hands_out_each_fault_once_when_it_falls_due():
    timeline = Timeline("pause worker:1 at step 20 for 1s; kill worker:1 at 3s; every 2s fixed pause on launcher "
                        "for 1s", seed=0, servers=1, workers=2)
    assert timeline.due(seconds=None, step=0) == []  # before worker 0's first step: nothing timed
    assert [str(p) for p in timeline.due(seconds=2.5, step=10)] == ["pause launcher at 2s for 1s"]
    assert [str(p) for p in timeline.due(seconds=4.5, step=20)] == ["pause worker:1 at step 20 for 1s",
                                                                      "kill worker:1 at 3s",
                                                                      "pause launcher at 4s for 1s"]
    assert timeline.due(seconds=4.6, step=30) == [] and timeline.fixed == []


def _witness(out, shard, epoch, primary, backups):
    folder = out / "witness" / f"shard-{shard}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"epoch-{epoch}.json").write_text(json.dumps({"epoch": epoch, "primary": primary, "backups": backups}))


def test_the_current_primary_and_backups_come_from_the_witness_latest_epoch(tmp_path):
    for name, port in (("server-0", 1), ("backup-0-1", 2), ("backup-0-2", 3), ("server-1", 4)):
        (tmp_path / f"{name}.addr").write_text(f"tcp://127.0.0.1:{port}\n")
    # no witness yet: server-K is the primary, its backups those that announced themselves
    assert configuration(tmp_path, 0).primary == "server-0" and configuration(tmp_path, 0).epoch is None
    assert configuration(tmp_path, 0).backups == ("backup-0-1", "backup-0-2")
    _witness(tmp_path, 0, 0, "tcp://127.0.0.1:1", ["tcp://127.0.0.1:2", "tcp://127.0.0.1:3"])
    _witness(tmp_path, 0, 2, "tcp://127.0.0.1:2", ["tcp://127.0.0.1:3"])  # backup-0-1 took over
    _witness(tmp_path, 0, 10, "tcp://127.0.0.1:3", [])  # 10 > 2: by number, not by name
    (tmp_path / "witness" / "shard-0" / "epoch-11.json").write_text('{"epoch": 11, "prim')  # torn: skipped
    now = configuration(tmp_path, 0)
    assert (now.epoch, now.primary, now.backups, now.unknown) == (10, "backup-0-2", (), ())
    _witness(tmp_path, 0, 12, "tcp://127.0.0.1:9", ["tcp://127.0.0.1:1"])
    now = configuration(tmp_path, 0)
    assert (now.primary, now.backups, now.unknown) == (None, ("server-0",), ("tcp://127.0.0.1:9",))
    assert configuration(tmp_path, 1).primary == "server-1"  # another shard's witness is its own


def test_the_record_appends_each_fault_and_its_heal_and_sums_them_up(tmp_path):
    record = Record(tmp_path, started=0.0)
    pause = record.fault(kind="pause", target="worker:1", at="step 10", duration=1.0, processes=["worker-1"],
                         pids=[11], step=10, done=True)
    record.fault(kind="kill", target="primary:0", at="3s", duration=0.0, processes=["server-0"], pids=[12],
                 step=20, done=False, why="it had ended already (signal 9)")
    record.healed(pause, step=20)
    lines = [json.loads(line) for line in (tmp_path / "nemesis.jsonl").read_text().splitlines()]
    assert [(line["ev"], line["id"]) for line in lines] == [("fault", 1), ("fault", 2), ("healed", 1)]
    block = record.summary(schedule="s", seed=0, not_reached=["kill worker:1 at 9s"])
    assert (block["done"], block["not_done"], block["not_reached"]) == (1, 1, ["kill worker:1 at 9s"])
    assert block["by_kind"] == {"pause": {"done": 1, "not_done": 0}, "kill": {"done": 0, "not_done": 1}}
    assert block["by_target"] == {"worker:1": {"done": 1, "not_done": 0}, "primary:0": {"done": 0, "not_done": 1}}
    assert block["faults"][0]["healed"] is True and block["faults"][0]["healed_step"] == 20
    assert block["faults"][1]["why"] == "it had ended already (signal 9)" and "healed" not in block["faults"][1]
