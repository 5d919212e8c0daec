"""The push codecs' names (`--compress`), without torch: the config tree checks a name with `parse`
when a setting is read, and the command line must not pay torch's import for that. psrv/codecs holds
the codecs themselves."""
from __future__ import annotations

CASTS = {"float16": "float16", "fp16": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}
LOSSY_NAMES = ("topk", "randomk", "sign", "int8", "fp4", "sparseloco")
RATIO_NAMES = ("topk", "randomk", "sparseloco")  # NAME:RATIO
FORMS = ("topk:RATIO, randomk:RATIO, sign, int8, fp4, sparseloco:RATIO (chunked top-k, 2-bit values), float16 (fp16), "
         "bfloat16 (bf16), or '' for none")


def parse(spec: str) -> tuple[str, float | None]:
    """(name, ratio) of a --compress value; ValueError naming the accepted forms otherwise."""
    name, _, arg = spec.partition(":")
    if name in RATIO_NAMES:
        try:
            ratio = float(arg)
        except ValueError:
            raise ValueError(f"{name} needs a ratio in (0, 1], e.g. {name}:0.01; got {spec!r}") from None
        if not 0 < ratio <= 1:
            raise ValueError(f"{name}'s ratio must be in (0, 1]; got {spec!r}")
        return name, ratio
    if (name in LOSSY_NAMES or name in CASTS) and not arg:
        return CASTS.get(name, name), None
    raise ValueError(f"must be one of {FORMS}; got {spec!r}")
