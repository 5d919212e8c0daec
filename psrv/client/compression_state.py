"""psrv.Worker's compression as it shows and carries it, a mixin of it (psrv/client/session.py): which codecs
run (`compression()`), the bytes they put on the wire (`wire_bytes()`), and the state they keep between steps
that the servers do not hold (`state_dict()` / `load_state_dict()`: the push codec's error-feedback residuals,
onebit_adam's local momentum, momentum correction's velocity, and the step count). Apart from the session
because all of it is read from the worker's client (psrv/client/psclient.py: `encoder`, `onebit`, `velocity`,
`pull_view`, `compress`, `wire`), not from the training loop; it reads the worker's `_client` and `steps`."""
from __future__ import annotations


class CompressionState:
    def state_dict(self) -> dict:
        """What this worker carries between steps that the servers do not hold: its step count, the
        error-feedback residuals of a compressed push, onebit_adam's momentum and momentum correction's
        velocity ({"steps", "compress", "onebit", "velocity"}: None where not used)."""
        encoder, onebit, velocity = self._client.encoder, self._client.onebit, self._client.velocity
        return {"steps": self.steps, "compress": None if encoder is None else encoder.state_dict(),
                "onebit": None if onebit is None else onebit.state_dict(),
                "velocity": None if velocity is None else velocity.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Carry on from `state` (a state_dict of a worker of this model and codec); ValueError where
        it does not fit (another model's residuals, a codec or onebit_adam's momentum on one side only)."""
        encoder, saved = self._client.encoder, state.get("compress")
        if (encoder is None) != (saved is None):
            raise ValueError("the state was saved " + ("without" if saved is None else "with") +
                             " a push codec, and this worker runs " + ("with" if saved is None else "without") + " one")
        onebit, momentum = self._client.onebit, state.get("onebit")
        if (onebit is None) != (momentum is None):
            raise ValueError("the state was saved " + ("without" if momentum is None else "with") +
                             " onebit_adam's local momentum, and the shards run " + ("it" if momentum is None else "another optimizer"))
        velocity, saved_velocity = self._client.velocity, state.get("velocity")
        if (velocity is None) != (saved_velocity is None):
            raise ValueError("the state was saved " + ("without" if saved_velocity is None else "with") +
                             " momentum correction's velocity, and this worker runs " +
                             ("with" if saved_velocity is None else "without") + " it")
        if velocity is not None:
            velocity.load_state_dict(saved_velocity)
        if onebit is not None:
            onebit.load_state_dict(momentum)
        if encoder is not None:
            encoder.load_state_dict(saved)
        self.steps = int(state.get("steps", self.steps))

    def compression(self) -> dict:
        """{"compress": the codec's name as given, "error_feedback": whether residuals are kept (a lossy codec only),
        "compress_pull": the pull codec ('': dense pulls),
        "momentum_correction": whether this worker keeps the velocity (psrv/client/momentum_correction.py)}."""
        encoder = self._client.encoder
        view = self._client.pull_view
        return {"compress": self._client.compress, "error_feedback": encoder is not None and encoder.error is not None,
                "compress_pull": "" if view is None else view.spec,
                "momentum_correction": self._client.velocity is not None}

    def wire_bytes(self) -> dict:
        """Bytes this worker's client sent and received (psrv/client/roundtrip.py WireBytes): bytes_pushed,
        bytes_pulled, bytes_sent, bytes_received, dense_push_bytes and compression_ratio."""
        return self._client.wire.to_dict()
