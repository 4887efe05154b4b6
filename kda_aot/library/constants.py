"""The numbers both wings agree on (head dimension, tile size, K2 value blocks, workspace slots, the
gate and beta forms' codes),
as the build declares them (build_kernels/shared_constants.py) and generates them into _abi.py.

The runtime reads them from here (validation, planner, workspace, cp_plan, the references), and
identity.py compares manifest_constants() with a library's manifest. Stdlib only, free of package
imports beyond the generated _abi.py.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional, Tuple

import functools

from ._abi import (BETA_CODES, CHUNK, ENTRIES, GATE_CODES, GATE_NEEDS, K1X_GATE_TAGS, LOG2E,  # noqa: F401
                   MANIFEST_CONSTANTS, MANIFEST_FORMAT, MAX_SLOTS, REGSTATE_VALUE_BLOCKS, SHIPPED, SIGNATURES,
                   SLOT_BYTES, STATE_BYTES, TILE_IMAGE_BYTES, VALUE_BLOCKS, WORKSPACE_ALIGN, D)

SLOT = dict(SLOT_BYTES)


@functools.lru_cache(maxsize=None)
def variant_constants() -> Dict[str, Dict[str, Any]]:
    """{kernel name: its baked-in constants} of every variant of this package, shipped or not
    (_abi.SIGNATURES: `name(args) {constants as JSON}`), for naming a kernel by its constants
    whether or not the loaded library holds it (SHIPPED: the names every library holds)."""
    return {sig.split("(", 1)[0]: json.loads(sig.rsplit(") ", 1)[1]) for sig in SIGNATURES}


@functools.lru_cache(maxsize=None)
def _pointer_dtypes() -> Dict[str, Dict[str, str]]:
    """{kernel name: {pointer argument: element dtype}} of every variant (_abi.SIGNATURES' args,
    `name:ptr:dtype:align`)."""
    table = {}
    for sig in SIGNATURES:
        name, rest = sig.split("(", 1)
        args = rest.rsplit(") ", 1)[0].split(", ")
        table[name] = {a.split(":")[0]: a.split(":")[2] for a in args if a.split(":")[1] == "ptr"}
    return table


@functools.lru_cache(maxsize=None)
def _kernel(entry: str, dtypes: Tuple[Tuple[str, str], ...], constants: Tuple[Tuple[str, Any], ...]) -> str:
    want = dict(constants)
    found = [name for name, got in variant_constants().items()
             if ENTRIES[name] == entry and got == want
             and all(_pointer_dtypes()[name].get(arg) == dtype for arg, dtype in dtypes)]
    if len(found) != 1:
        raise LookupError(f"{'no' if not found else len(found)} kernel{'s' if found else ''} of entry {entry!r} "
                          f"with constants {want} and pointer dtypes {dict(dtypes)} in this package"
                          + (f": {found}" if found else ""))
    return found[0]


def kernel(entry: str, dtypes: Optional[Mapping[str, str]] = None, **constants: Any) -> str:
    """The name of the one kernel variant of host entry `entry` (the registry's `entry`) whose
    constants are exactly `constants` and whose pointer arguments named in `dtypes` have those
    element dtypes (where variants differ only by an argument's dtype: cu_seqlens, the checkpoint
    offsets, K1's g and beta), from this package's ABI whether or not the loaded library holds it.
    How the runtime names every kernel it launches (kda_aot/plan/launcher.py); LookupError where
    no variant or several match. Cached: planning calls it, a planned call does not."""
    return _kernel(entry, tuple(sorted((dtypes or {}).items())), tuple(sorted(constants.items())))


def manifest_constants() -> Dict[str, Any]:
    """The constants as the manifest records them (JSON types: lists, not tuples), a fresh copy."""
    return json.loads(json.dumps(MANIFEST_CONSTANTS))
