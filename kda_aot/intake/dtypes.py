"""Element types by name: which ones the runtime reads, and the size of any of them.

Stdlib only, so the validation wall and hand-built descriptions can use it without a framework.
"""

from __future__ import annotations

import re

# The dtypes intake describes (DLPack / numpy names). Anything else (float8_*, uint16, uint32,
# complex64, ...) is refused at intake naming the argument: no kernel reads it, and refusing it
# there keeps every later size computation on a known width.
KNOWN_ITEMSIZE = {
    "bfloat16": 2, "float16": 2, "float32": 4, "float64": 8,
    "int8": 1, "uint8": 1, "int16": 2, "int32": 4, "int64": 8, "bool": 1,
}

# The element width is the first number of a DLPack-style name: float8_e4m3fn -> 8, uint16 -> 16,
# complex64 -> 64, float4_e2m1fn -> 4.
_WIDTH = re.compile(r"^[a-z]+?(\d+)")


def is_known(dtype: object) -> bool:
    return isinstance(dtype, str) and dtype in KNOWN_ITEMSIZE


def itemsize(dtype: object) -> int:
    """Bytes per element of any dtype name; never raises (a description of an unknown dtype may
    still be printed or compared). Sub-byte widths round up to 1 so a non-empty tensor never
    spans 0 bytes; a name without a width counts as 1 (such a tensor is refused before any
    size matters: intake refuses it, validation checks dtypes before sizes)."""
    if isinstance(dtype, str):
        known = KNOWN_ITEMSIZE.get(dtype)
        if known is not None:
            return known
        found = _WIDTH.match(dtype)
        if found:
            return max(1, (int(found.group(1)) + 7) // 8)
    return 1


def supported_list() -> str:
    return ", ".join(KNOWN_ITEMSIZE)
