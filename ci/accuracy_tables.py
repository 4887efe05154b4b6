"""The accuracy figures of docs/numerics.md's correlated-key table, generated from one JSON record.

    python ci/accuracy_tables.py [--json docs/bench/accuracy_h200.json] [--check]

docs/bench/accuracy_h200.json holds what `python3 ci/numerics_table.py` writes into its
numerics_table.json ("correlated": one row per input class, key noise eps, beta logit and gate
form, with both modes' relative RMSE against float64, serial and cp="on", FLA's and cuDNN's engine's
beside them), plus the run's machine, date, versions and, under "before", the same rows measured
with the kernels that formed the intra-chunk inverse by the fp16 Neumann product. The generator
rewrites what lies between the markers

    docs/numerics.md: <!-- ACCURACY:CORRELATED --> ... <!-- /ACCURACY:CORRELATED -->

With --check nothing is written: it exits 1 naming the file that differs and its first differing
line. Prose elsewhere cites the table (docs/numerics.md, "Correlated keys") instead of restating a
figure; tests/cpu/test_doc_figures.py fails on a restated one.
"""

from __future__ import annotations

import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_tables import generate, render_blocks  # noqa: E402 - the benchmark's command line and block writer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JSON = os.path.join("docs", "bench", "accuracy_h200.json")
MARKERS = {"ACCURACY:CORRELATED": os.path.join("docs", "numerics.md")}
FILES = tuple(dict.fromkeys(MARKERS.values()))
CLASS_NAMES = {"correlated_weak": "weak decay", "correlated": "model gates"}


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _err(pair) -> str:
    if pair is None:
        return "-"
    # a non-finite error is stored as null (JSON has no NaN)
    return " / ".join("NaN" if x is None or not math.isfinite(x) else f"{x:.2e}" for x in pair)


def _key(row) -> tuple:
    return (row["class"], row["eps"], row["beta_logit"], row["gate"], row["T"])


def correlated_block(data: dict) -> str:
    before = {_key(r): r for r in data.get("before", [])}
    lines = ["| keys | eps | beta logit | gate | T | default | accurate | FLA chunk_kda | cuDNN engine | "
             "before: default | before: accurate |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["correlated"]:
        old = before.get(_key(r), {})
        lines.append(f"| {CLASS_NAMES[r['class']]} | {r['eps']:g} | {r['beta_logit']:g} | {r['gate']} | {r['T']} | "
                     f"{_err(r.get('flashkda/off'))} | {_err(r.get('accurate/off'))} | {_err(r.get('fla'))} | "
                     f"{_err(r.get('cudnn'))} | {_err(old.get('flashkda/off'))} | {_err(old.get('accurate/off'))} |")
    lines += ["", f"Relative RMSE against float64, output / final state, H=2, one sequence, serial plans; fp32 "
              f"initial state (zero in the {data['correlated'][-1]['T']}-token row, the repeated-key reproducer). "
              f"{data['machine']}, {data['date']}, {data['versions']}. \"before\": {data['before_note']}"]
    return "\n".join(lines)


def blocks(data: dict) -> dict:
    return {"ACCURACY:CORRELATED": correlated_block(data)}


def render(data: dict, texts: dict) -> dict:
    """{file name: new text} for `texts` ({file name: current text})."""
    return render_blocks(blocks(data), MARKERS, texts)


def main(argv=None, repo: str = REPO) -> int:
    return generate(argv, repo, "ci/accuracy_tables.py", __doc__.splitlines()[0], JSON, load, render, FILES)


if __name__ == "__main__":
    sys.exit(main())
