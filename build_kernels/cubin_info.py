"""Registers and stack frame of each kernel in a cubin, read from its ELF (no CUDA tools needed).

ptxas records both per function in the .nv.info section as EIATTR_REGCOUNT (0x2f) and
EIATTR_FRAME_SIZE (0x11), each an (ELF symbol index, value) pair. A kernel that spills has a
non-zero frame. The build machine has no cuobjdump, so tests/build/test_ptx.py reads these here
to check that a kernel whose speed depends on its CTAs per SM still fits them, without spills.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Dict

_REGCOUNT, _FRAME_SIZE = 0x2F, 0x11
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 0x01, 0x02, 0x03, 0x04


def _sections(blob: bytes):
    """(name, offset, size) of each ELF64 section."""
    shoff, = struct.unpack_from("<Q", blob, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    for h in headers:
        start = names_at + h[0]
        yield blob[start:blob.index(b"\0", start)].decode(), h[4], h[5]


def kernel_resources(cubin: Path) -> Dict[str, Dict[int, int]]:
    """{"registers": {symbol: n}, "frame_bytes": {symbol: n}} over every function in the cubin."""
    blob = Path(cubin).read_bytes()
    if blob[:4] != b"\x7fELF" or blob[4] != 2:
        raise ValueError(f"{cubin}: not an ELF64 cubin")
    found: Dict[str, Dict[int, int]] = {"registers": {}, "frame_bytes": {}}
    for name, offset, size in _sections(blob):
        if name != ".nv.info":
            continue
        at, end = offset, offset + size
        while at < end:
            fmt, attr = blob[at], blob[at + 1]
            if fmt == _EIFMT_SVAL:
                length, = struct.unpack_from("<H", blob, at + 2)
                if attr in (_REGCOUNT, _FRAME_SIZE) and length == 8:
                    symbol, value = struct.unpack_from("<II", blob, at + 4)
                    found["registers" if attr == _REGCOUNT else "frame_bytes"][symbol] = value
                at += 4 + length
            elif fmt in (_EIFMT_BVAL, _EIFMT_HVAL):
                at += 4
            elif fmt == _EIFMT_NVAL:
                at += 2
            else:
                raise ValueError(f"{cubin}: unknown .nv.info entry format {fmt:#x}")
    return found
