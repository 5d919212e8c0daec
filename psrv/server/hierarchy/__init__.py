"""A regional shard under global ones: psrv/server/hierarchy/upstream.py."""
