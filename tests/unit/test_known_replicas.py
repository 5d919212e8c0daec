"""A worker knows a shard's backups that its transport names from the start (a torch RPC world's, fixed when it
forms), besides those WELCOME lists: a backup may join its primary only after the worker's HELLO, whose WELCOME
then lists the primary alone, and the worker must still find that backup when the primary dies."""
from __future__ import annotations

from psrv.partition import ParamSpec, PartitionPlan
from psrv.protocol import Message, MsgType, decode, encode
from psrv.transport.base import ClientTransport
from psrv.client.psclient import PSClient

PRIMARY, BACKUP = "rpc://h:1/server-0", "rpc://h:1/backup-0-1"


class _Welcoming(ClientTransport):
    """Answers HELLO with a WELCOME that lists the primary alone; names one backup per shard itself."""

    def __init__(self):
        self.replies, self.redirected = [], []

    def replicas(self, shard):
        return [BACKUP]

    def send(self, shard, frames):
        msg = decode([bytes(memoryview(f)) for f in frames])
        fields = {"replicas": [PRIMARY], "worker_timeout": 10.0, "initialised": False}
        self.replies.append((shard, encode(Message(MsgType.WELCOME, seq=msg.seq, fields=fields))))

    def recv(self, timeout):
        return self.replies.pop(0) if self.replies else None

    def redirect(self, shard, address):
        self.redirected.append((shard, address))

    def reconnect(self, shard):
        pass

    def close(self):
        pass


def test_a_backup_the_transport_names_is_kept_after_a_welcome_that_lists_only_the_primary():
    net = _Welcoming()
    client = PSClient([PRIMARY], PartitionPlan((ParamSpec("w", (4,)),), 1), worker=0, world_size=1,
                      heartbeat=False, net=net)
    client.hello()
    assert client.addresses.replicas[0] == [PRIMARY, BACKUP]
    assert client.addresses.failover(0) and net.redirected == [(0, BACKUP)] and client.servers[0] == BACKUP
