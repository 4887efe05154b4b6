"""The runtime's stdlib-only module the build shares, loaded by path.

kda_aot/library/abi_hash.py is the single definition of the ABI hash (a function both wings run: the build
on its registry, the runtime on a manifest). Importing it as `kda_aot.library.abi_hash` would import the
kda_aot package, whose modules need the runtime's dependencies (numpy, cuda.core) that a build
environment need not have; so it is executed from its file, once, and kept in sys.modules under a
private name. The ABI constants flow the other way: build_kernels/shared_constants.py, generated into
kda_aot/library/_abi.py.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load(name: str):
    """kda_aot/library/<name>.py as a module of its own (not part of the kda_aot package)."""
    key = f"_kda_aot_file_{name}"
    module = sys.modules.get(key)
    if module is None:
        spec = importlib.util.spec_from_file_location(key, ROOT / "kda_aot" / "library" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # before exec: dataclasses and typing look modules up by name
        spec.loader.exec_module(module)
    return module

