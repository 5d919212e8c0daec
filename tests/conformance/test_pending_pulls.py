"""The pulls a shard holds for later (psrv/server/pulls/pending.py), where the matrix's runs do not look closely:
a backup is sent them with the rest of its primary's state (psrv/server/replication/handler.py `replica_state`,
through torch.save's bytes as a join sends it), and must hold each as its primary does, so that it releases the same
pulls in the same order with the same fields once it answers; a pull re-sent on another connection is one pull
answered on each. The reference: the pulls as this file made them, field by field."""
from __future__ import annotations

import io

import torch

from psrv.server.pulls.pending import MAX_PEERS, PendingPulls

# (worker, seq, clock, final, push, view, fragment): a plain pull, a PUSH_PULL's, a compressed pull's copy number,
# a streaming DiLoCo fragment of two ranges, rank 0's final pull
PULLS = [(0, 7, 3, False, None, 0, None),
         (2, 5, 4, False, {"version": 9, "dropped": "late"}, 0, None),
         (1, 9, 2, False, None, 6, ((0, 40), (90, 100))),
         (3, 4, 5, True, {"version": 11}, 2, None)]


def _through_bytes(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf)


def _held(pending: PendingPulls) -> list[tuple]:
    return [(p.worker, p.seq, p.clock, p.final, p.push, p.view, p.fragment) for p in pending]


def test_a_backup_holds_its_primarys_pending_pulls_and_releases_them_as_it_does():
    primary = PendingPulls()
    for i, (worker, seq, clock, final, push, view, fragment) in enumerate(PULLS):
        primary.add(f"conn-{i}", worker=worker, seq=seq, clock=clock, final=final, received=100.0 + i, push=push,
                    view=view, fragment=fragment)
    backup = PendingPulls()
    backup.load_state_dict(_through_bytes(primary.state_dict()), received=250.0)
    assert _held(backup) == _held(primary) == PULLS
    assert [(p.peers, p.received) for p in backup] == [([], 250.0)] * len(PULLS)  # answered where re-sent
    assert backup.workers() == primary.workers() == {0, 1, 2, 3} and len(backup) == len(PULLS)
    assert all(backup.holding(w, s) for w, s, *_ in PULLS) and not backup.holding(0, 8)
    assert not backup.holding(0, "7")  # a probe's seq comes off the wire

    backup.add("again", worker=1, seq=9, clock=2, final=False, received=260.0, push=None, view=6,
               fragment=((0, 40), (90, 100)))  # the worker re-sends its pull to the new primary: the same one
    assert len(backup) == len(PULLS) and [p.peers for p in backup if p.worker == 1] == [["again"]]

    answered = {"primary": [], "backup": []}
    for name, pending in (("primary", primary), ("backup", backup)):
        pending.release(lambda p: p.clock <= 3, lambda p, name=name: answered[name].append(
            (p.worker, p.seq, p.clock, p.final, p.push, p.view, p.fragment)))
    assert answered["primary"] == answered["backup"] == [PULLS[0], PULLS[2]]
    assert _held(backup) == _held(primary) == [PULLS[1], PULLS[3]]
    backup.drop(2)
    assert _held(backup) == [PULLS[3]] and backup.workers() == {3}


def test_a_pull_re_sent_on_other_connections_is_answered_once_on_each_of_the_last_few():
    pending = PendingPulls()
    for i in range(MAX_PEERS + 2):
        pending.add(f"conn-{i}", worker=4, seq=1, clock=0, final=False, received=float(i), push=None)
        pending.add(f"conn-{i}", worker=4, seq=1, clock=0, final=False, received=float(i), push=None)  # twice
    (p,) = list(pending)
    assert p.peers == [f"conn-{i}" for i in range(2, MAX_PEERS + 2)] and p.received == 0.0
    assert (p.view, p.fragment) == (0, None)  # a dense pull of the whole shard: no copy held (copies.py's 0)
    seen = []
    pending.release(lambda q: True, seen.append)
    assert seen == [p] and len(pending) == 0 and not pending.holding(4, 1)
