"""Code blocks of README.md that tests run: the CPU stand-in (tests/cpu/test_torch_op.py) and the
GPU (tests/gpu/test_torch_op.py) run the same example."""


def readme_example(device: str) -> str:
    """The python block of README's "FLA drop-in" section, on `device`."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text.split("## FLA drop-in", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'dev = 4, "cuda"' in code
    return code.replace('dev = 4, "cuda"', f'dev = 4, "{device}"')
