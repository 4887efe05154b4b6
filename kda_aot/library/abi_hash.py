"""The ABI of a kernel list, as one hash and one readable signature per kernel.

Stdlib only and free of package imports: the runtime checks a library with it (identity.py) and
the build loads this very file by path to write the manifest's abi_hash and kda_aot/library/_abi.py
(build_kernels/abi.py), so both wings hash with one definition.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, Mapping, Sequence

_ARG_KEYS = ("name", "kind", "dtype", "align")


def kernel_record(kernel: Mapping[str, Any]) -> Dict[str, Any]:
    """What the ABI of one kernel is: its name, arguments and constants (not its entry symbol
    or object fingerprint, which change with unrelated rebuilds)."""
    args = [{key: arg[key] for key in _ARG_KEYS if key in arg} for arg in kernel["args"]]
    return {"name": kernel["name"], "args": args, "constants": dict(kernel.get("constants") or {})}


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def abi_hash(kernels: Sequence[Mapping[str, Any]]) -> str:
    """sha256 of the canonical JSON of every kernel's record, in name order: the runtime finds a
    kernel by name in the library's own manifest (kda_aot/library/loader.py), so the order in which a
    build lists its kernels is not part of the ABI."""
    records = sorted((kernel_record(k) for k in kernels), key=lambda r: r["name"])
    return hashlib.sha256(_canonical(records).encode()).hexdigest()


def signatures(kernels: Sequence[Mapping[str, Any]]) -> list:
    """kernel_signature of every kernel, in name order (the order abi_hash hashes them in)."""
    return [kernel_signature(k) for k in sorted(kernels, key=lambda k: k["name"])]


def kernel_signature(kernel: Mapping[str, Any]) -> str:
    """One readable line per kernel, for error messages and _abi.py:
    name(arg:kind[:dtype:align], ...) {constants}."""
    rec = kernel_record(kernel)
    args = ", ".join(":".join(str(a[key]) for key in _ARG_KEYS if key in a) for a in rec["args"])
    return f"{rec['name']}({args}) {_canonical(rec['constants'])}"
