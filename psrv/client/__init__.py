"""psrv.client, the worker side, beside psrv/server/ (the library a worker process calls; the shipped loop
and jobs built on it are psrv.workers, workers/): psrv.Worker (session.py, with its local steps' rounds in
local_rounds.py and its compression's state in compression_state.py), what its keywords leave to the
environment and the shards (keywords.py) and what its step() returns (step_info.py), the client that
talks to every shard (psclient.py), the factory that picks psrv.Worker or the all-reduce worker
by the run's mode (make.py), its push messages (push_messages.py) and its round trips
(roundtrip.py), the admin client (admin.py), the flat buffers (flat.py), overlap with backward
(overlap.py), the step record (steplog.py), the heartbeat (heartbeat.py), local steps' inner step that a
NaN gradient does not poison (inner_step.py), and the worker's halves of
1-bit Adam (onebit.py) and momentum correction (momentum_correction.py).

`Worker` and `StepInfo` are imported on first use, so importing one of these modules does not import
the others."""
from __future__ import annotations

import importlib

_WHERE = {"Worker": "psrv.client.session", "StepInfo": "psrv.client.step_info"}
__all__ = list(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'psrv.client' has no attribute {name!r}")
