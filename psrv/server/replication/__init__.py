"""A replicated shard (docs/reliability.md, "Replicated shards"): the witness that decides its epochs
(witness.py), the primary's half (primary.py), a backup's (follower.py), the stream's wire form (stream.py),
and the service's part in it (service.py)."""
