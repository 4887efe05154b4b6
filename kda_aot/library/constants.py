"""The numbers both wings agree on (head dimension, tile size, K2 value blocks, workspace slots, the
gate and beta forms' codes),
as the build declares them (build_kernels/shared_constants.py) and generates them into _abi.py.

The runtime reads them from here (validation, planner, workspace, cp_plan, the references), and
identity.py compares manifest_constants() with a library's manifest. Stdlib only, free of package
imports beyond the generated _abi.py.
"""

from __future__ import annotations

import json
from typing import Any, Dict

import functools

from ._abi import (BETA_CODES, CHUNK, GATE_CODES, K1X_GATE_TAGS, LOG2E, MANIFEST_CONSTANTS,  # noqa: F401
                   MANIFEST_FORMAT, MAX_SLOTS, REGSTATE_RENAME, REGSTATE_VALUE_BLOCKS, SHIPPED, SIGNATURES,
                   SLOT_BYTES, STATE_BYTES, TILE_IMAGE_BYTES, VALUE_BLOCKS, WORKSPACE_ALIGN, D)

SLOT = dict(SLOT_BYTES)


def regstate_name(k2_name: str) -> str:
    """The kernel name of the register-state twin of the K2 variant `k2_name` (same arguments,
    same bits): the build's naming rule, REGSTATE_RENAME."""
    return k2_name.replace(*REGSTATE_RENAME, 1)


@functools.lru_cache(maxsize=None)
def variant_constants() -> Dict[str, Dict[str, Any]]:
    """{kernel name: its baked-in constants} of every variant of this package, shipped or not
    (_abi.SIGNATURES: `name(args) {constants as JSON}`), for naming a kernel by its constants
    whether or not the loaded library holds it (SHIPPED: the names every library holds)."""
    return {sig.split("(", 1)[0]: json.loads(sig.rsplit(") ", 1)[1]) for sig in SIGNATURES}


def manifest_constants() -> Dict[str, Any]:
    """The constants as the manifest records them (JSON types: lists, not tuples), a fresh copy."""
    return json.loads(json.dumps(MANIFEST_CONSTANTS))
