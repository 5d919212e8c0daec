"""The server side: the shard's loop (service.py) and its handlers, one folder a concern (pushes/, pulls/,
membership/, replication/, checkpoints/, stats/), over the state they share (state.py); the shard's math (shard.py,
optim.py, rules/, fragments.py) and its consistency controllers (consistency/)."""
