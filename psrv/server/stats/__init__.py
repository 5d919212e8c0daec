"""What a shard says of itself: its answer to STATS and its summary (handler.py), over the counters in its state
(psrv/server/counters.py)."""
