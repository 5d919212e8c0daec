"""A shard's pulls: the handler (handler.py), the pulls waiting for their answer (pending.py) and the workers'
copies under compressed pulls (copies.py)."""
