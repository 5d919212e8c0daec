"""A replicated shard (docs/reliability.md, "Replicated shards"): the handler that owns the epoch (handler.py),
the witness that decides the epochs (witness.py), the primary's half (primary.py), a backup's (follower.py) and
the stream's wire form (stream.py)."""
