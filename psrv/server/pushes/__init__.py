"""A shard's pushes: the handler (handler.py), pushes in chunks (chunked.py) and those held behind one (queued.py),
and late streaks (late.py); exactly-once answers are the state's (psrv/server/dedup.py)."""
