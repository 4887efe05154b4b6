"""Every kernel variant the library ships, in one table.

A variant is one exported symbol: a host entry (`@cute.jit` function) compiled with fixed
compile-time constants. Its argument list is declared here once, as data, and serves both wings:
the build turns it into fake arguments for `cute.compile`, and the manifest carries it to the
runtime, which turns it into ctypes values. Every kernel takes raw device pointers, integer
scalars and the stream last, so the C ABI is the same flat shape for all of them.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Tuple

# Argument kinds: "ptr" (device pointer, with element dtype and the alignment the kernel assumes),
# "i32", "i64", "f32" (scalars), "stream".
_SCALARS = ("i32", "i64", "f32")


@dataclasses.dataclass(frozen=True)
class Arg:
    name: str
    kind: str
    dtype: str = ""  # element type of a pointer: bfloat16, float16, float32, int32, int64, uint8
    align: int = 0  # bytes the kernel assumes for a pointer; the runtime checks it before a launch

    def to_json(self) -> Dict[str, object]:
        out: Dict[str, object] = {"name": self.name, "kind": self.kind}
        if self.kind == "ptr":
            out.update(dtype=self.dtype, align=self.align)
        return out


def ptr(name: str, dtype: str, align: int = 16) -> Arg:
    return Arg(name, "ptr", dtype, align)


def scalar(name: str, kind: str) -> Arg:
    assert kind in _SCALARS, kind
    return Arg(name, kind)


STREAM = Arg("stream", "stream")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One exported kernel entry."""

    name: str  # unique, used as the export prefix and by the runtime to find the kernel
    module: str  # module under build_kernels.kernels holding the host entry
    entry: str  # the @cute.jit host function
    args: Tuple[Arg, ...]
    constants: Tuple[Tuple[str, object], ...] = ()  # Constexpr keyword arguments, baked in

    def to_json(self) -> Dict[str, object]:
        return {
            "name": self.name,
            "args": [a.to_json() for a in self.args],
            "constants": {k: v for k, v in self.constants},
        }


def _varlen_tiles() -> List[Variant]:
    return [
        Variant(
            name=f"varlen_tiles_{cu}",
            module="varlen_tiles",
            entry="tile_prefix",
            args=(ptr("cu_seqlens", cu, 8 if cu == "int64" else 4), ptr("tile_prefix", "int32", 4),
                  scalar("n_seq", "i32"), STREAM),
        )
        for cu in ("int32", "int64")
    ]


def all_variants() -> List[Variant]:
    variants = _varlen_tiles()
    names = [v.name for v in variants]
    assert len(names) == len(set(names)), "variant names must be unique"
    return variants
