"""A shard's state and checkpoints: the handler (handler.py), the state as one dict (snapshot.py) and the writer
thread (writer.py)."""
