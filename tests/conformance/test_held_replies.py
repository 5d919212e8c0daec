"""A reply a primary holds for its backups' acks (psrv/server/replication/primary.py `hold`, `protect`) goes out as it
was made, even where the weights it views are written before it leaves: a shard driven by hand, its replies held as
`deferring` holds them while a backup has not acknowledged, and a push applied meanwhile (the pushes' handler calls
`protect` right before it writes the weights). The reference: the weights the test itself sent."""
from __future__ import annotations

import torch

from psrv.config import OptimConfig, ServerConfig
from psrv.protocol import Message, MsgType, decode
from tests.helpers import hand_driven
from tests.helpers import send_to as send

N = 64


def test_a_held_reply_keeps_the_weights_it_was_made_with_across_a_write():
    svc, net = hand_driven(ServerConfig(workers=2, mode="async", optimizer=OptimConfig("sgd", lr=0.5, momentum=0.0)), N)
    net.out.clear()
    replicas = svc.replication.replicas
    replicas.outbox = []  # what `deferring` holds while a backup has yet to acknowledge
    send(svc, Message(MsgType.PUSH, worker=1, seq=3, clock=0, tensor=torch.ones(N)))  # answered in one frame
    send(svc, Message(MsgType.PULL, worker=1, seq=4, clock=1))
    assert net.out == [] and len(replicas.outbox) == 2, replicas.outbox  # both held
    (_, answer, _), (_, weights, _) = replicas.outbox
    assert len(answer) == 1 and len(weights) == 2 and not isinstance(weights[1], bytes), weights  # it views them
    before = svc.state.shard.weights.clone()
    send(svc, Message(MsgType.PUSH, worker=0, seq=3, clock=0, tensor=torch.full((N,), 2.0)))  # a write
    assert not torch.equal(svc.state.shard.weights, before)
    held, replicas.outbox = replicas.outbox, None
    assert len(held) == 3 and held[0][1] == answer, held
    reply = decode([bytes(memoryview(f)) for f in held[1][1]])
    assert (reply.type, reply.seq, reply.fields["version"]) == (MsgType.WEIGHTS, 4, 1), reply
    # zeros, one step of lr 0.5 down worker 1's gradient of ones; not the -1.5 of the write after it
    assert torch.equal(before, torch.full((N,), -0.5)) and torch.equal(reply.tensor, before), reply.tensor
