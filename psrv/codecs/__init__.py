"""Push codecs (`--compress`), chosen by name (the names, once: psrv/codec_names.py): the lossy ones, one module
each, with error feedback on the worker (psrv/codecs/push.py), and the casts that --wire-dtype makes.
`parse(spec)` checks a name; `make(spec, seed)` builds the lossy codec."""
from __future__ import annotations

from psrv.codec_names import CASTS, FORMS, parse
from psrv.codecs.base import Codec, Decoded
from psrv.codecs.fp4 import Fp4
from psrv.codecs.int8 import Int8
from psrv.codecs.randomk import RandomK
from psrv.codecs.sign import Sign
from psrv.codecs.sparseloco import SparseLoCo
from psrv.codecs.topk import TopK

LOSSY = {"topk": TopK, "randomk": RandomK, "sign": Sign, "int8": Int8, "fp4": Fp4, "sparseloco": SparseLoCo}  # decoders by header name


def make(spec: str, *, seed: int = 0, sign_scale: str = "l1") -> Codec | None:
    """The lossy codec `spec` names (sign with `sign_scale`, psrv/codecs/sign.py); None for '' and for
    the casts (the client casts those)."""
    if not spec:
        return None
    name, ratio = parse(spec)
    if name == "topk":
        return TopK(ratio)
    if name == "randomk":
        return RandomK(ratio, seed=seed)
    if name == "sparseloco":
        return SparseLoCo(ratio)
    if name == "sign":
        return Sign(scale=sign_scale)
    return LOSSY[name]() if name in LOSSY else None


__all__ = ["CASTS", "Codec", "Decoded", "FORMS", "LOSSY", "make", "parse"]
