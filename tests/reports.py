"""Reports the GPU tests append to $OUT (the device scripts collect that folder).

A missing folder is created: a report is a side product, and a test must not fail on it after its
checks ran, or before them."""

import os


def append_report(filename, text):
    """Append `text` to $OUT/`filename` when OUT is set; do nothing otherwise."""
    out = os.environ.get("OUT")
    if not out:
        return
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, filename), "a") as f:
        f.write(text)
