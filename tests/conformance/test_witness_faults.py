"""A witness that fails while a backup's primary is silent (psrv/server/replication/handler.py try_take_over):
the witness is a directory, and here it is made to fail for real, by the kernel, not by a stand-in.

- a witness that cannot be read (its shard folder is a file, as a lost mount leaves a path that is no folder):
  the backup says so each bound, once, claims nothing, holds the workers' requests (the primary is still
  silent), and takes over once the witness reads again, its record giving the primary's whole silence;
- a witness that cannot take the claim (a full disk: the witness on a tmpfs of its own, filled; mounting one
  needs root, as CI runs): the same, tried every half bound, and no half-written claim left behind;
- a shard that finished while its primary fell silent (the witness's last word, written by the primary when
  its workers left): the backup ends, and claims nothing;
- the epochs the witness already holds: a later one of the same primary that keeps this backup is claimed, one
  that leaves it out (a drop, another's takeover) is joined, as is the winner of a claim another backup beat;
- a primary that cannot claim the epoch adding a joiner (a full disk) adds it once the disk has room; one whose
  claim finds that epoch taken (another replica took the shard) is fenced and sends the joiner no state; one
  started without a witness refuses a backup, which ends with that reason.

Each backup here takes over before any worker's INIT: its failover record and log line give version 0."""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import logging
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import zmq

from psrv.protocol import MsgType
from psrv.protocol.codec import decode
from psrv.server.replication import follower as follower_module
from psrv.server.replication import stream
from psrv.server.replication.primary import RETRY_CLAIM
from psrv.server.replication.witness import Configuration, Witness
from psrv.server.run import Server
from psrv.transport.zmq_client import ZmqClient
from tests.conformance.cluster import TIMEOUT, one_thread  # noqa: F401 (an autouse fixture)
from tests.conformance.failures import config
from tests.conformance.replica_pair import QUIET_S, follower, heartbeat, history_of, serving_pair, wait_for

SILENCE = 1.0  # seconds: failures.py's FAILURE_BOUND of 2 s gives this takeover bound
OUTAGE = 3.5  # seconds the witness fails for, once the primary is silent
NOTICE_S = 1.0  # a backup that waits to join says so this often (follower.JOIN_NOTICE, 10 s, here 1 s)


@pytest.fixture
def failing(tmp_path):
    """(primary, backup, witness folder) that may fail over: the primary is stopped by the case."""
    witness = tmp_path / "witness"
    with serving_pair(config("async", replicas=1), str(witness), str(tmp_path)) as (primary, backup):
        assert backup.service.replication.timing.silence == SILENCE
        yield primary, backup, witness


@contextlib.contextmanager
def tmpfs(path: Path, options: str):
    """A tmpfs mounted at `path` with `options` (its size), unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("a full witness disk is a tmpfs of its own: mounting one needs root (CI runs as root)")
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={options}", "psrv-witness", str(path)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"could not mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(folder: Path, what: str):
    """Fill `folder`'s file system: its "blocks" (one file written until no byte fits) or its "inodes" (empty
    files made until no file fits); a function that frees it again."""
    filler = folder / "filler"
    try:
        if what == "blocks":
            fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
            try:
                while True:
                    os.write(fd, b"\0" * 4096)
            finally:
                os.close(fd)
        filler.mkdir()
        for n in itertools.count():
            (filler / str(n)).touch()
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    return lambda: shutil.rmtree(filler) if filler.is_dir() else filler.unlink()


def silence(primary) -> float:
    """Stop `primary` (a clean stop: its workers have not left, so the witness is not told the shard finished);
    the time it fell silent."""
    primary.stop()
    primary.join(TIMEOUT)
    return time.monotonic()


def errors(caplog, prefix: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "psrv.server" and r.getMessage().startswith(prefix)]


def check_held_then_answered(worker: ZmqClient) -> None:
    """The held request is answered by the new primary (a heartbeat's OK: worker 0 is among those it waits
    for), not sent back to the silent one (ERROR NOT_PRIMARY)."""
    got = worker.recv(TIMEOUT)
    assert got is not None, "the held request was never answered"
    reply = decode(got[1])
    assert (reply.type, reply.seq, reply.fields) == (MsgType.OK, 1, {"active": True}), reply


def check_took_over(primary, backup, epoch: int, silent_since: float, caplog, *, outage: float = OUTAGE) -> None:
    """`backup` serves the shard at `epoch`, and its failover record gives the primary's whole silence."""
    # its takeover's line is the last thing it does before it answers the requests it held (follower None the first)
    wait_for("the backup never took over once the witness worked again",
             lambda: any("takes over" in m for m in errors(caplog, "shard 0: primary ")))
    latest = Witness(backup.cfg.witness, 0).latest()
    assert (latest.epoch, latest.primary, latest.backups) == (epoch, backup.address, ())
    assert time.time() - TIMEOUT < latest.at <= time.time(), latest  # the claim's time, for people reading it
    [failover] = backup.service.replication.failovers
    assert (failover["epoch"], failover["from"], failover["version"]) == (epoch, primary.address, 0), failover
    # heard last before the stop, within a bound (else it would have claimed the shard then)
    assert outage <= failover["silent_s"] <= time.monotonic() - silent_since + SILENCE, failover
    why = re.fullmatch(rf"take over from {primary.address}, silent (\d+\.\d\d)s", latest.why)  # the witness's
    # said at the claim, a moment before the record: no shorter than the bound, no longer than the record's
    assert why and outage - 0.006 <= float(why.group(1)) <= failover["silent_s"] + 0.006, (latest.why, failover)
    taking = [e for e in history_of(backup) if e["ev"] == "epoch" and e["role"] == "primary"]
    assert [e["epoch"] for e in taking] == [epoch], taking
    [said] = [m for m in errors(caplog, "shard 0: primary ") if "takes over" in m]
    took = re.fullmatch(rf"shard 0: primary {primary.address} silent for (\d+\.\d\d)s; this backup "
                        rf"\({backup.address}\) takes over at epoch {epoch}, version 0", said)
    assert took and abs(float(took.group(1)) - failover["silent_s"]) <= 0.006, said  # %.2f of what it rounds to 3


def check_still_following(backup, epoch: int) -> None:
    f = follower(backup)
    assert f is not None and f.following and backup.service.replication.epoch == epoch
    assert Witness(backup.cfg.witness, 0).latest().epoch == epoch


@pytest.mark.parametrize("lost", ["a file", "empty"])
def test_a_backup_that_cannot_read_the_witness_keeps_following_and_takes_over_once_it_can(failing, caplog, lost):
    """The shard's folder made a file (listing it fails: ENOTDIR), or emptied (a lost mount's bare mount point:
    the witness holds no configuration, though this backup follows one)."""
    primary, backup, witness = failing
    epoch = backup.service.replication.epoch
    shard = witness / "shard-0"
    away = witness / "shard-0.away"
    shard.rename(away)
    if lost == "a file":
        shard.write_text("not a folder")
        prefix, line = "shard 0: could not read the witness", (
            f"shard 0: could not read the witness {shard} ([Errno 20] Not a directory: '{shard}'); still following")
    else:
        shard.mkdir()
        prefix = "shard 0: the witness "
        line = f"shard 0: the witness {shard} holds no configuration of this shard; still following"
    silent_since = silence(primary)
    worker = heartbeat(backup)
    try:
        time.sleep(OUTAGE)
        assert worker.recv(0) is None, "a request was answered while the primary was silent and no one took over"
        lines = errors(caplog, prefix)
        # tried once a bound after the silence began, then once each bound: not at every turn of the loop
        assert 2 <= len(lines) <= (time.monotonic() - silent_since) / SILENCE + 1, lines
        assert set(lines) == {line}, lines
        f = follower(backup)
        assert f is not None and f.following and backup.service.replication.epoch == epoch
        shutil.rmtree(shard) if shard.is_dir() else shard.unlink()
        away.rename(shard)
        check_took_over(primary, backup, epoch + 1, silent_since, caplog)
        check_held_then_answered(worker)
    finally:
        worker.close()


def test_a_later_epoch_of_the_same_primary_with_this_backup_is_taken_over(failing, caplog):
    """The primary added another backup at a new epoch and fell silent before its stream told this one: no op of
    that epoch was acknowledged (each needs this backup's ack), so this backup claims the next."""
    primary, backup, witness = failing
    epoch = backup.service.replication.epoch
    w = Witness(witness, 0)
    assert w.claim(Configuration(epoch + 1, primary.address, (backup.address, "tcp://127.0.0.1:1"), "a join"))[0]
    silent_since = silence(primary)
    check_took_over(primary, backup, epoch + 2, silent_since, caplog, outage=SILENCE)


@pytest.mark.parametrize("latest", ["without this backup", "another primary"])
def test_a_later_epoch_that_leaves_this_backup_out_is_joined_not_claimed(failing, caplog, latest, monkeypatch):
    """The primary dropped this backup, or another replica took the shard: this backup asks the witness's primary
    to join (here a silent one, or none that answers: it waits, and says so every JOIN_NOTICE, here 1 s) and
    claims nothing."""
    monkeypatch.setattr(follower_module, "JOIN_NOTICE", NOTICE_S)
    primary, backup, witness = failing
    epoch = backup.service.replication.epoch
    w = Witness(witness, 0)
    later = (Configuration(epoch + 1, primary.address, (), "a drop") if latest == "without this backup" else
             Configuration(epoch + 1, "tcp://127.0.0.1:1", (backup.address,), "another's takeover"))
    assert w.claim(later)[0]
    silent_since = silence(primary)
    wait_for("the backup never stopped following", lambda: not follower(backup).following)
    time.sleep(SILENCE)
    assert w.latest() == later and backup.service.replication.failovers == []
    assert follower(backup).primary == later.primary and not follower(backup).following
    assert errors(caplog, "shard 0: the witness says") == [
        f"shard 0: the witness says {later.primary} serves this shard now; this backup joins it again"]
    time.sleep(2.5 * NOTICE_S)
    waits = errors(caplog, "shard 0: this backup has waited")
    waited = time.monotonic() - silent_since
    assert 2 <= len(waits) <= waited / NOTICE_S + 1, waits  # once a notice's time, not at each turn of the loop
    for line in waits:  # how long since its primary was last heard (within a bound before it stopped)
        said = re.fullmatch(rf"shard 0: this backup has waited (\d+)s to join its primary at "
                            rf"{re.escape(later.primary)}; is `psrv serve` running there\?", line)
        assert said and 0 <= int(said.group(1)) <= waited + SILENCE + 1, line


@pytest.mark.parametrize("full", ["blocks", "inodes"])
def test_a_backup_whose_claim_the_witness_cannot_take_tries_again_and_leaves_nothing_half_written(tmp_path, caplog,
                                                                                                  full):
    """The witness's file system full: no byte of the claim fits (its temporary file made, then removed), or no
    file (the temporary never made: the error said is still the full disk's)."""
    with tmpfs(tmp_path / "witness", "256k" if full == "blocks" else "256k,nr_inodes=64") as witness:
        with serving_pair(config("async", replicas=1), str(witness), str(tmp_path)) as (primary, backup):
            epoch = backup.service.replication.epoch
            free = fill(witness, full)
            silent_since = silence(primary)
            worker = heartbeat(backup)
            try:
                time.sleep(OUTAGE)
                assert worker.recv(0) is None, "a request was answered while no one served the shard"
                check_still_following(backup, epoch)
                lines = errors(caplog, "shard 0: could not claim the shard")
                # a bound after the silence began, then every half bound (4: not every bound, with a second to spare;
                # at most: the first try, one each half bound since, and one for a primary heard last a ping before
                # it stopped; a third of a bound would give two more)
                assert 4 <= len(lines) <= (time.monotonic() - silent_since - SILENCE) / (SILENCE / 2) + 2, lines
                where = witness / "shard-0"  # ENOSPC names the file it could not make, not the one it could not fill
                said = re.escape(f"shard 0: could not claim the shard on the witness {where} ([Errno 28] No space left "
                                 f"on device") + (re.escape(f": '{where}/.epoch-{epoch + 1}.") + r"\d+\.\d+\.tmp'"
                                                  if full == "inodes" else "") + re.escape("); still following")
                assert all(re.fullmatch(said, line) for line in lines), lines
                assert sorted(p.name for p in (witness / "shard-0").iterdir()) == [
                    f"epoch-{e}.json" for e in range(epoch + 1)], "a failed claim left a file"
                free()
                check_took_over(primary, backup, epoch + 1, silent_since, caplog)
                check_held_then_answered(worker)
            finally:
                worker.close()
    shutil.rmtree(tmp_path / "witness", ignore_errors=True)


def test_a_backup_that_loses_its_claim_joins_the_winner(failing, caplog):
    """Another backup claims the same epoch a moment before this one (two backups of a dead primary whose bounds
    ended together): link(2) lets one win; this one reads who did and joins it, and takes nothing over."""
    primary, backup, witness = failing
    epoch = backup.service.replication.epoch
    f = follower(backup)
    claim, rival = f.witness.claim, Configuration(epoch + 1, "tcp://127.0.0.1:1", (), "another backup's takeover")

    def beaten(config):  # the rival's claim lands between this backup's read and its claim
        Witness(witness, 0).claim(rival)
        return claim(config)
    f.witness.claim = beaten
    silence(primary)
    # lost_place stops following, then turns to the winner: wait for both (the suite under load read between them)
    wait_for("the backup never turned to the winner", lambda: not f.following and f.primary == rival.primary)
    latest = Witness(witness, 0).latest()
    assert (latest.epoch, latest.primary, latest.why) == (epoch + 1, rival.primary, rival.why)
    assert backup.service.replication.failovers == [] and follower(backup) is f
    assert errors(caplog, "shard 0: the witness says") == [
        f"shard 0: the witness says {rival.primary} serves this shard now; this backup joins it again"]


def test_a_primary_that_cannot_claim_a_joiners_epoch_adds_it_once_the_witness_takes_claims(tmp_path, caplog):
    """A second backup asks to join while the witness's disk is full: the primary cannot claim the epoch that adds
    it, says so once per try (every RETRY_CLAIM, 0.5 s), adds nothing, and adds it once the disk has room."""
    with tmpfs(tmp_path / "witness", "256k") as witness:
        with serving_pair(config("async", replicas=1), str(witness), str(tmp_path)) as (primary, first):
            replicas = primary.service.replication.replicas
            epoch = replicas.epoch
            free = fill(witness, "blocks")
            second = Server(dataclasses.replace(first.cfg, bind="tcp://127.0.0.1:0")).start()
            try:
                asked = time.monotonic()
                time.sleep(OUTAGE)
                lines = errors(caplog, "shard 0: could not claim epoch")
                tries = (time.monotonic() - asked) / RETRY_CLAIM
                assert 2 <= len(lines) <= tries + 1, lines  # once per try, not at each turn of the loop
                assert set(lines) == {f"shard 0: could not claim epoch {epoch + 1} on the witness "
                                      f"{witness / 'shard-0'} ([Errno 28] No space left on device); acknowledging "
                                      f"nothing until it can"}, lines
                assert replicas.epoch == epoch and replicas.addresses == [primary.address, first.address]
                # kept for the next try (read between tries: a try takes the list while it claims)
                wait_for("the primary forgot the joiner", lambda: replicas.joining == [second.address])
                assert not follower(second).following and follower(first).following
                free()
                wait_for("the second backup never followed", lambda: follower(second).following)
                assert replicas.epoch == epoch + 1 and replicas.addresses == [
                    primary.address, first.address, second.address]
                latest = Witness(witness, 0).latest()
                assert (latest.epoch, latest.primary, latest.backups) == (
                    epoch + 1, primary.address, (first.address, second.address))
            finally:
                second.stop()
                second.join(TIMEOUT)


def test_a_primary_whose_claim_for_a_joiner_finds_its_epoch_taken_is_fenced_and_sends_no_state(failing):
    """Another replica took the shard at the next epoch without this primary hearing of it; a backup asks this one
    to join (a "join" from a line of our own, naming a socket we listen on): the primary's claim of that epoch
    loses, it is fenced by the witness's word, and it sends the joiner no state to follow it by."""
    primary, first, witness = failing
    replicas = primary.service.replication.replicas
    epoch = replicas.epoch
    rival = Configuration(epoch + 1, "tcp://127.0.0.1:1", (), "another replica's takeover")
    assert Witness(witness, 0).claim(rival)[0]
    context = zmq.Context.instance()
    joiner = context.socket(zmq.ROUTER)
    port = joiner.bind_to_random_port("tcp://127.0.0.1")
    line = ZmqClient([primary.address], link=True)
    try:
        line.send(0, stream.frames_of("join", epoch, address=f"tcp://127.0.0.1:{port}"))
        wait_for("the primary was never fenced", lambda: replicas.fenced)
        assert not joiner.poll(int(QUIET_S * 1000)), "the fenced primary sent the joiner its state"
        assert replicas.addresses == [primary.address, first.address] and replicas.admitted == 1
        assert replicas.joining == []  # a fenced primary adds no one: it forgets who asked
        assert not [e for e in history_of(primary) if e["ev"] == "sent_state" and e["epoch"] > epoch]
        [fenced] = [e for e in history_of(primary) if e["ev"] == "fenced"]
        assert (fenced["epoch"], fenced["by"]) == (epoch + 1, f"{rival.primary} (witness: {rival.why})"), fenced
    finally:
        line.close()
        joiner.close(linger=0)


def test_a_primary_without_a_witness_refuses_a_backup_in_one_line(tmp_path):
    """`psrv serve --backup-of` a primary started without --witness: the backup ends with the primary's reason."""
    cfg = config("async")
    primary = Server(cfg.server_config(0, bind="tcp://127.0.0.1:0")).start()
    backup = Server(dataclasses.replace(cfg.server_config(0, bind="tcp://127.0.0.1:0"), backup_of=primary.address,
                                        witness=str(tmp_path / "witness"))).start()
    try:
        with pytest.raises(ValueError) as refused:
            backup.join(TIMEOUT)
        assert str(refused.value) == f"shard 0's primary at {primary.address} has no --witness"
        assert primary.service.replication.replicas.addresses == [primary.address]
    finally:
        for server in (backup, primary):
            server.stop()
        for server in (backup, primary):
            with contextlib.suppress(Exception):  # what made it fail is the case's to say, above
                server.join(TIMEOUT)


def test_a_backup_whose_shard_finished_while_its_primary_fell_silent_ends_and_claims_nothing(failing, caplog):
    caplog.set_level(logging.INFO, logger="psrv.server")
    primary, backup, witness = failing
    w = Witness(witness, 0)
    won, finished = w.claim(w.latest().ended())  # what the primary says when its workers have left
    assert won
    silence(primary)
    backup.join(TIMEOUT)  # it ends by itself
    assert backup.service.state.stopped
    assert w.latest() == finished and backup.service.replication.failovers == []
    assert errors(caplog, "shard 0: the shard finished") == [
        "shard 0: the shard finished (every worker left); this backup ends"]
