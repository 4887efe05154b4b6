"""The tests' own layout (docs/testing.md, "Where the tests are"): every test file is in one of the
three layers, a tests/gpu file marks its tests `gpu` (so that they skip without a Hopper GPU), and
a tests/cpu or tests/build file marks none."""

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
LAYERS = ("cpu", "gpu", "build")
GPU_MARK = re.compile(r"pytest\.mark\.gpu\b")


def test_every_test_file_is_in_a_layer():
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []
    assert sorted(p.parent.name for p in TESTS.glob("*/test_*.py") if p.parent.name not in LAYERS) == []
    assert all(list((TESTS / layer).glob("test_*.py")) for layer in LAYERS)


def test_gpu_tests_are_marked_and_the_others_are_not():
    unmarked = [p.name for p in (TESTS / "gpu").glob("test_*.py") if not GPU_MARK.search(p.read_text())]
    marked = [f"{p.parent.name}/{p.name}" for layer in ("cpu", "build") for p in (TESTS / layer).glob("test_*.py")
              if GPU_MARK.search(p.read_text()) and p != Path(__file__).resolve()]
    assert unmarked == [] and marked == [], (unmarked, marked)
