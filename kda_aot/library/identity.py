"""Does the kernel library belong to this package? Checked once, when the library is loaded.

The manifest beside the library (written by the build, possibly from another build directory
through KDA_AOT_LIB_DIR) must match what this package expects, each side from its own source:

- format: MANIFEST_FORMAT below;
- package_version: this package's metadata (pyproject.toml in a source tree, else the installed
  distribution: kda-aot, kda-aot-cu12 or kda-aot-cu13), never the manifest itself;
- git_revision: the stamp a wheel build installs beside this module (_build_revision.txt); a
  source tree has none, and then the revision is not compared;
- constants: the numbers both wings share (head dim, tile size, value blocks, workspace slot
  sizes), constants.manifest_constants() against the manifest's `constants` section;
- the kernels (each one's name, arguments with kinds, dtypes and alignments, and baked-in
  constants), against _abi.py, generated from build_kernels/registry.py and kept equal to it by a
  CPU test: the library must hold every kernel of the shipped lattice (_abi.SHIPPED, what the
  planner launches), nothing that is not a variant of this package (_abi.SIGNATURES, every
  variant), and each of its kernels with this package's signature. So a library of the shipped
  lattice and one of all variants (KDA_KERNEL_LATTICE=all, with the measurement-only kernels:
  docs/build.md) are both accepted. The manifest's own abi_hash must also match its own kernel
  list, so a hand-edited kernel list is caught even before the comparison.

The launcher passes raw pointers in manifest order: a library whose argument list differs from
the one this package's code was written for would be called with the wrong values, so any
mismatch refuses to load, naming both sides.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Optional

from . import constants
from .abi_hash import abi_hash
from .abi_hash import signatures as kernel_signatures
from ..errors import KdaError

MANIFEST_FORMAT = constants.MANIFEST_FORMAT  # the build writes the same number
DISTRIBUTIONS = ("kda-aot", "kda-aot-cu12", "kda-aot-cu13")
_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # kda_aot/
REVISION_STAMP = _PACKAGE_DIR / "_build_revision.txt"


class LibraryMismatchError(KdaError):
    """The library's manifest does not match what this package expects."""


# --------------------------------------------------------------------------------------------
# What this package is

def package_version() -> str:
    """This package's version: pyproject.toml when the package sits in a kda-aot source tree
    (the tree on sys.path is what runs), else the installed distribution's metadata."""
    pyproject = _PACKAGE_DIR.parent / "pyproject.toml"
    try:
        text = pyproject.read_text()
    except OSError:
        text = ""
    name = re.search(r'^name\s*=\s*"([^"]+)"', text, flags=re.M)
    if name and name.group(1) in DISTRIBUTIONS:  # ci/build_wheels.sh renames it per flavour
        found = re.search(r'^version\s*=\s*"([^"]+)"', text, flags=re.M)
        if found:
            return found.group(1)
    from importlib import metadata

    for dist in DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return "0+unknown"


def package_revision() -> Optional[str]:
    """The git revision a wheel build stamped into this package, or None (a source tree)."""
    try:
        return REVISION_STAMP.read_text().strip() or None
    except OSError:
        return None


def expected_identity() -> Dict[str, Any]:
    from . import _abi

    return {"format": MANIFEST_FORMAT, "package_version": package_version(),
            "git_revision": package_revision(), "constants": constants.manifest_constants(),
            "signatures": list(_abi.SIGNATURES), "shipped": _abi.SHIPPED}


# --------------------------------------------------------------------------------------------
# The check

_REBUILD = ("reinstall kda-aot, or rebuild the library from this source tree "
            "(pip install . / python -m build_kernels)")


def check_library_identity(manifest: dict, library_path, expected: Optional[Dict[str, Any]] = None) -> None:
    """Raise LibraryMismatchError unless `manifest` (read beside `library_path`) describes a
    library built for this package. `expected`: expected_identity() unless given (tests)."""
    want = expected_identity() if expected is None else expected
    where = f"kernel library {library_path}"

    def fail(what: str) -> None:
        raise LibraryMismatchError(f"{where}: {what}; {_REBUILD}")

    if not isinstance(manifest, dict):
        fail(f"its manifest is not a JSON object (got {type(manifest).__name__})")
    got_format = manifest.get("format")
    if got_format != want["format"]:
        fail(f"manifest format {got_format!r}, but this package reads format {want['format']}")
    got_version = manifest.get("package_version")
    if got_version != want["package_version"]:
        fail(f"built for kda-aot {got_version!r}, but this package is kda-aot {want['package_version']!r}")
    if want["git_revision"] is not None and manifest.get("git_revision") != want["git_revision"]:
        fail(f"built from git revision {manifest.get('git_revision')!r}, but this package was built "
             f"from {want['git_revision']!r}")
    got_constants = manifest.get("constants")
    if got_constants != want["constants"]:
        fail("built with other constants: " + _constants_difference(got_constants, want["constants"]))
    try:
        kernels = list(manifest["kernels"])
        actual = abi_hash(kernels)
        signatures = kernel_signatures(kernels)
    except (KeyError, TypeError, AttributeError) as exc:
        fail(f"its manifest's kernel list is malformed ({type(exc).__name__}: {exc})")
    if manifest.get("abi_hash") != actual:
        fail(f"the manifest's abi_hash {manifest.get('abi_hash')!r} does not match its own kernel list "
             f"(which hashes to {actual!r}): the manifest was edited after the build")
    problem = _kernel_problem(signatures, want["signatures"], want["shipped"])
    if problem:
        fail(f"kernel ABI differs from this package's: {problem}")


def _constants_difference(library: Any, package: Dict[str, Any]) -> str:
    """Each constant whose value differs, both sides, for the error message."""
    if not isinstance(library, dict):
        return f"the library's manifest has constants {library!r}, this package expects {package!r}"
    names = sorted(set(library) | set(package))
    return "; ".join(f"{name}: the library has {library.get(name, '(absent)')!r}, this package expects "
                     f"{package.get(name, '(absent)')!r}"
                     for name in names if library.get(name) != package.get(name))


def _kernel_problem(library: List[str], package: List[str], shipped) -> Optional[str]:
    """The first kernel (by name) that breaks the rule: listed twice, unknown to this package, of
    another signature, or shipped but absent. None when the library's kernels pass."""
    names = [sig.split("(", 1)[0] for sig in library]
    lib = dict(zip(names, library))
    pkg = {sig.split("(", 1)[0]: sig for sig in package}
    for name in sorted(set(lib) | set(shipped)):
        if names.count(name) > 1:
            return f"kernel {name}: the library lists it {names.count(name)} times"
        if name not in pkg:
            return f"kernel {name}: the library has {lib[name]}, this package has no such kernel"
        if name not in lib:
            return f"kernel {name}: the library lacks it, this package ships it as {pkg[name]}"
        if lib[name] != pkg[name]:
            return f"kernel {name}: the library has {lib[name]}, this package expects {pkg[name]}"
    return None
