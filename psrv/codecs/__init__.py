"""Push codecs (`--compress`), chosen by name: topk:RATIO, randomk:RATIO, sign, int8 (lossy, one
module each, with error feedback on the worker: psrv/codecs/push.py), and float16/bfloat16 (the cast
that --wire-dtype makes). `parse(spec)` checks a name; `make(spec, seed)` builds the lossy codec."""
from __future__ import annotations

from psrv.codecs.base import Codec, Decoded
from psrv.codecs.int8 import Int8
from psrv.codecs.randomk import RandomK
from psrv.codecs.sign import Sign
from psrv.codecs.topk import TopK

CASTS = {"float16": "float16", "fp16": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}
LOSSY = {"topk": TopK, "randomk": RandomK, "sign": Sign, "int8": Int8}  # decoders by header name
FORMS = "topk:RATIO, randomk:RATIO, sign, int8, float16 (fp16), bfloat16 (bf16), or '' for none"


def parse(spec: str) -> tuple[str, float | None]:
    """(name, ratio) of a --compress value; ValueError naming the accepted forms otherwise."""
    name, _, arg = spec.partition(":")
    if name in ("topk", "randomk"):
        try:
            ratio = float(arg)
        except ValueError:
            raise ValueError(f"{name} needs a ratio in (0, 1], e.g. {name}:0.01; got {spec!r}") from None
        if not 0 < ratio <= 1:
            raise ValueError(f"{name}'s ratio must be in (0, 1]; got {spec!r}")
        return name, ratio
    if (name in LOSSY or name in CASTS) and not arg:
        return CASTS.get(name, name), None
    raise ValueError(f"must be one of {FORMS}; got {spec!r}")


def make(spec: str, *, seed: int = 0) -> Codec | None:
    """The lossy codec `spec` names; None for '' and for the casts (the client casts those)."""
    if not spec:
        return None
    name, ratio = parse(spec)
    if name == "topk":
        return TopK(ratio)
    if name == "randomk":
        return RandomK(ratio, seed=seed)
    return LOSSY[name]() if name in LOSSY else None


__all__ = ["CASTS", "Codec", "Decoded", "FORMS", "LOSSY", "make", "parse"]
