"""psrv.Worker's steps under `local_steps` (local SGD / DiLoCo), a mixin of it (psrv/client/session.py): the
inner steps that push nothing, streaming DiLoCo's step (`fragments` F > 1: merge the fragment pushed at the last
step(), push the next every H/F inner steps without waiting; psrv/client/streaming.py) and its settling at
close(), and the rounds' inner steps (`next_local_steps`, `inner_steps_per_push`). Apart from the session
because these are the steps that do not push a gradient every call, while the session's step() is the plain
push and pull. It reads the worker's attributes: steps, _flat, _period (psrv/local_period.py), _stream
(StreamingOuter), _clock, _version, _answered_at_close (a list: (step, staleness) of the fragment push close()
merged, for the record); and its methods _logged and _abandon."""
from __future__ import annotations

import time

from psrv.client.step_info import StepInfo


class LocalRounds:
    @property
    def next_local_steps(self) -> int | None:
        """With local_steps: the inner steps of the round under way (under 'auto:H', planned by speed)."""
        return self._period.h if self._period is not None else None

    @property
    def inner_steps_per_push(self) -> list[int]:
        """With local_steps: the inner steps each push carried (under 'auto:H', each round's H_i)."""
        return list(self._period.history) if self._period is not None else []

    def _local_step(self, t0: float, loss, batch_size) -> StepInfo:
        """An inner step that pushes nothing: the caller's optimizer has stepped the model."""
        self._flat.zero_grad()
        info = StepInfo(step=self.steps, clock=self._clock, version=self._version, staleness=0, waited=0.0,
                        seconds=time.perf_counter() - t0, pushed=False)
        self.steps += 1
        self._logged(info, loss, batch_size, t0)
        self._period.returned(time.perf_counter())
        return info

    def _streaming_step(self, t0: float, loss, batch_size) -> StepInfo:
        """Streaming DiLoCo's step() (psrv/client/streaming.py): merge the fragment pushed at the last
        step() (its answer arrived while the caller's inner step ran, or is waited for now), then push the
        next fragment if H/F inner steps have passed since the last push, without waiting for it. A push's
        staleness is known at its merge: the pushing step says None, the merging one `answered`."""
        answered, waited = None, 0.0
        try:
            if self._stream.in_flight:
                reply, pushed_at = self._stream.merge()
                self._clock, self._version = reply.clock, min(reply.versions)
                answered, waited = (pushed_at, reply.staleness), reply.waited
            self._flat.zero_grad()
            pushed = self._period.stepped(t0)
            if pushed:
                self._stream.send(self._clock, step=self.steps)
                self._period.pushed(None)
        except BaseException:
            self._abandon()
            raise
        info = StepInfo(step=self.steps, clock=self._clock, version=self._version,
                        staleness=None if pushed else 0, waited=waited,
                        seconds=time.perf_counter() - t0, pushed=pushed, answered=answered)
        self.steps += 1
        self._logged(info, loss, batch_size, t0)
        self._period.returned(time.perf_counter())
        return info

    def _settle_stream(self) -> None:
        """close() under streaming DiLoCo: merge the fragment in flight (its staleness goes to its step's row:
        `_answered_at_close`); inner steps taken since the last push push the next fragment in turn, waited
        for (as plain DiLoCo's close() pushes a last, shorter round, which has no row)."""
        if self._stream.in_flight:
            reply, pushed_at = self._stream.merge()
            self._clock, self._version = reply.clock, min(reply.versions)
            if pushed_at is not None:
                self._answered_at_close.append((pushed_at, reply.staleness))
        if self._period.pending:
            self._stream.send(self._clock, step=None)
            self._period.pushed(None)
            reply, _ = self._stream.merge()
            self._clock, self._version = reply.clock, min(reply.versions)
