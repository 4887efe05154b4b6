"""The package's version, in a module of its own so that any module can import it without
importing the package's front ends (kda_aot/__init__.py imports those, api.py among them)."""

from .library.identity import package_version

# From this package's own metadata (pyproject.toml in a source tree, else the installed
# distribution: kda-aot, kda-aot-cu12 or kda-aot-cu13), never from the build manifest, which the
# loader checks against it (identity.py).
__version__ = package_version()
