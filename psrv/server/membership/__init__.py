"""Who works with a shard: the handler (handler.py), whose plan it holds (plans.py), who holds each rank
(identity.py) and what is said of workers not joined (joining.py); who was heard from when is the state's
(psrv/server/liveness.py)."""
