"""The Python examples of the README and of docs/frameworks.md cover torch, the FLA drop-in, CuPy
and JAX (tests/gpu/test_readme_examples.py runs each on the GPU)."""

import re

from readme_snippets import BLOCKS, REPO, block_modules


def test_readme_has_an_example_for_each_framework():
    """The README keeps the torch call and the FLA drop-in; the examples together cover torch,
    CuPy and JAX (CPU test)."""
    readme = "\n".join(re.findall(r"^```python\n(.*?)^```", (REPO / "README.md").read_text(), re.S | re.M))
    assert "kda_aot.prefill(" in readme and "kt.chunk_kda(" in readme
    imports = set().union(*(block_modules(b) for b in BLOCKS))
    assert {"torch", "cupy", "jax"} <= imports, imports
