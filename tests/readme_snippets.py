"""The Python blocks of README.md and docs/frameworks.md that the tests read and run: every block
(BLOCKS, with the modules each imports: block_modules) for tests/cpu/test_readme_examples.py and
tests/gpu/test_readme_examples.py, and the FLA drop-in example (readme_example) that the CPU stand-in
(tests/cpu/test_torch_op.py) and the GPU (tests/gpu/test_torch_op.py) run alike."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def readme_example(device: str) -> str:
    """The python block of README's "FLA drop-in" section, on `device`."""
    text = (REPO / "README.md").read_text()
    section = text.split("## FLA drop-in", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'dev = 4, "cuda"' in code
    return code.replace('dev = 4, "cuda"', f'dev = 4, "{device}"')


# The README shows torch and the FLA drop-in; docs/frameworks.md the CuPy and JAX callers.
EXAMPLE_FILES = ("README.md", "docs/frameworks.md")
BLOCKS = [block for name in EXAMPLE_FILES
          for block in re.findall(r"^```python\n(.*?)^```", (REPO / name).read_text(), re.S | re.M)]


def block_modules(block):
    """Top-level modules the block imports (`import a, b.c` and `from a import ...` lines)."""
    names = set()
    for line in re.findall(r"^import ([\w., ]+)$", block, re.M):
        names |= {part.split()[0].split(".")[0] for part in line.split(",")}  # "numpy as np" -> numpy
    names |= set(re.findall(r"^from (\w+)", block, re.M))
    return names
