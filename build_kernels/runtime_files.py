"""The runtime's stdlib-only modules the build shares, loaded by path.

kda_aot/abi_hash.py and kda_aot/abi_constants.py are the single definitions of the ABI hash and
of the constants both wings agree on. Importing them as `kda_aot.x` would import the kda_aot
package, whose modules need the runtime's dependencies (numpy, cuda.core) that a build environment
need not have; so they are executed from their files. Each is loaded once and kept in sys.modules
under a private name, so the registry, the ABI writer and every kernel module see one object.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load(name: str):
    """kda_aot/<name>.py as a module of its own (not part of the kda_aot package)."""
    key = f"_kda_aot_file_{name}"
    module = sys.modules.get(key)
    if module is None:
        spec = importlib.util.spec_from_file_location(key, ROOT / "kda_aot" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # before exec: dataclasses and typing look modules up by name
        spec.loader.exec_module(module)
    return module


ABI_CONSTANTS = load("abi_constants")
