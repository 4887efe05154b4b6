"""The benchmark figures of the docs, generated from one JSON record.

    python ci/bench_tables.py [--json docs/bench/h200.json] [--check]

docs/bench/h200.json is what `python -m kda_aot.bench --json FILE` writes, plus the host-cost
records of the entry points (`host_cost_records`, from `python -m kda_aot.bench --contract-cost`,
`python -m kda_aot.bench_op` and ci/host_breakdown.py, added to the record by hand with their
dates and commands). The generator rewrites what lies between the markers

    README.md:          <!-- BENCH:README --> ... <!-- /BENCH:README -->
    docs/benchmarks.md: <!-- BENCH:TABLES --> ... <!-- /BENCH:TABLES -->
                        <!-- BENCH:HOST --> ... <!-- /BENCH:HOST -->
    docs/gate_forms.md: <!-- BENCH:GATE_FORMS --> ... <!-- /BENCH:GATE_FORMS -->

README: one table, the safe gate per input class: kda-aot's CUDA-graph time beside FlashKDA,
FLA and cuDNN's engine. docs/benchmarks.md: every row (kernels, eager and graph times per class
and gate form, the peers, accuracy against float64 where the JSON has it), the ratios the prose
refers to, the run's notes and host costs; then the entry points' host-cost records.
docs/gate_forms.md: each gate form's time against the safe gate, the accurate mode and the peers.
Prose elsewhere cites these tables instead of restating a figure; tests/cpu/test_doc_figures.py
fails on a restated one.
With --check nothing is written: it exits 1 naming the first file that differs and its first
differing line. A file without its markers is an error (exit 1) in both modes.
It reads both of the benchmark's JSON formats: a list of rows (the first, N(0, 1) gates and the
safe gate only, no machine or date recorded) and an object with the run's machine, date, peers
and notes beside "rows".
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JSON = os.path.join("docs", "bench", "h200.json")
# Each generated block: its marker and the file that holds it.
MARKERS = {"BENCH:README": "README.md", "BENCH:TABLES": os.path.join("docs", "benchmarks.md"),
           "BENCH:HOST": os.path.join("docs", "benchmarks.md"),
           "BENCH:GATE_FORMS": os.path.join("docs", "gate_forms.md")}
FILES = tuple(dict.fromkeys(MARKERS.values()))
# The uneven batch of FlashKDA's benchmark (kda_aot.bench.UNEVEN6), named "uneven6" in the tables.
UNEVEN6 = [1300, 547, 2048, 963, 271, 3063]
# The input classes (kda_aot.bench's --gates) as the tables name them: the class, then what sets it
# apart. "correlated": model's gates, one base key c per head with k = c + eps N(0, 1) (eps and the
# beta logit are input_classes' CORRELATED_EPS and CORRELATED_BETA_LOGIT).
CLASS_NAMES = {"model": "model (FLA layer init)", "random": "random, N(0, 1)", "long": "long, g ~ N(-8, 1)",
               "correlated": "correlated, k = c + 0.05 N(0, 1), beta logit 6"}


def load(path: str) -> dict:
    with open(path) as f:
        return load_data(json.load(f))


def load_data(data) -> dict:
    """The JSON as {"rows": [...], ...}; rows of the first format get gates "random", gate "safe"."""
    if isinstance(data, list):
        data = {"format": 1, "rows": data}
    rows = []
    for row in data["rows"]:
        row = dict(row)
        row.setdefault("gates", "random")
        row.setdefault("gate", "safe")
        rows.append(row)
    return dict(data, rows=rows)


def ms(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def err(pair) -> str:
    return "-" if pair is None else f"{pair[0]:.2e} / {pair[1]:.2e}"


def flashkda(row) -> str:
    """This run's FlashKDA time, else the published one (marked), else '-'."""
    if row.get("FlashKDA ms (this run)") is not None:
        return ms(row["FlashKDA ms (this run)"])
    published = row.get("FlashKDA ms (published, same H200 kind)")
    return "-" if published is None else f"{published:.3f} (published)"


def seqs(row) -> str:
    """bench.shape_key's name as the docs write it: [8192, 2048], 8 x [1024], uneven6."""
    key = str(row["sequences"])
    if not key[:1].isdigit():
        return key
    if "x" in key:
        n, length = key.split("x")
        return f"{n} x [{length}]"
    return "[" + key.replace("+", ", ") + "]"


def provenance(data: dict) -> str:
    if data.get("format", 1) == 1:
        return ("Machine and date are not recorded in this JSON (the benchmark's first format); "
                "N(0, 1) gates only.")
    peers = ", ".join(f"{k} {v}" for k, v in sorted(data.get("peers", {}).items()) if v) or "none"
    return (f"{data.get('machine', '?')}, {data.get('date', '?')}, kda-aot {data.get('kda_aot', '?')}, "
            f"torch {data.get('torch', '?')}; peers: {peers}. Median of {data.get('iters', '?')} CUDA-event "
            f"timings after {data.get('warmup', '?')} warm-ups.")


def readme_block(data: dict) -> str:
    """H, sequences, class; kda-aot graph ms, FlashKDA, FLA, cuDNN engine (graph, else eager)."""
    lines = ["| H, sequences | gates | kda-aot | FlashKDA | FLA | cuDNN engine |", "|---|---|---|---|---|---|"]
    for row in data["rows"]:
        if row["gate"] != "safe":
            continue
        cudnn = row.get("cuDNN graph ms")
        cudnn_cell = ms(cudnn) if cudnn is not None else (
            f"{ms(row['cuDNN eager ms'])} (eager)" if row.get("cuDNN eager ms") is not None else "-")
        lines.append(f"| {row['H']} {seqs(row)} | {CLASS_NAMES.get(row['gates'], row['gates'])} | "
                     f"{ms(row.get('graph ms'))} | {flashkda(row)} | {ms(row.get('FLA ms'))} | {cudnn_cell} |")
    lines += ["", "ms per call, CUDA-graph replay for kda-aot and cuDNN's engine, eager calls for FlashKDA and FLA. "
              + provenance(data)]
    return "\n".join(lines)


def tables_block(data: dict) -> str:
    """Every row, the peers and the errors, then the host costs and the run's notes."""
    rows = data["rows"]
    lines = [provenance(data), "",
             "| H, sequences | gates | gate (g) | floor | kernels | eager | eager+seq_lens | graph | plan | FlashKDA "
             "(bitwise) | FLA | cuDNN graph / eager (host us) | error o / state: kda-aot | FlashKDA | cuDNN | FLA |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        fk = flashkda(row)
        if row.get("FlashKDA bitwise"):
            fk += f" ({row['FlashKDA bitwise']})"
        if row.get("cuDNN graph ms") is not None or row.get("cuDNN eager ms") is not None:
            host = row.get("cuDNN host us")
            cudnn = f"{ms(row.get('cuDNN graph ms'))} / {ms(row.get('cuDNN eager ms'))}" + (
                f" ({host:.0f})" if host is not None else "")
        else:
            cudnn = "-"
        gate = row["gate"] + (f" ({row['g dtype']})" if row.get("g dtype") else "")
        lines.append(" | ".join([
            f"| {row['H']} {seqs(row)}", CLASS_NAMES.get(row["gates"], row["gates"]), gate,
            ms(row.get("floor ms")), ms(row.get("kernels ms")), ms(row.get("eager ms")),
            ms(row.get("eager+seq_lens ms")), ms(row.get("graph ms")), str(row.get("plan", "-")), fk,
            ms(row.get("FLA ms")), cudnn, err(row.get("error kda-aot")), err(row.get("error FlashKDA")),
            err(row.get("error cuDNN")), err(row.get("error FLA"))]) + " |")
    lines += ["", "ms per call. Errors: relative RMSE of the output and the final state against the float64 gold "
              "(bf16 final states for kda-aot, FlashKDA and cuDNN, fp32 for FLA), on every row of a run with "
              "accuracy on, for each implementation timed on it. uneven6: the six packed sequences "
              f"{UNEVEN6} ({sum(UNEVEN6)} tokens). -: not measured on that row in this run (the notes say why)."]
    summary = ratio_lines(data)
    if summary:
        lines += [""] + [f"- {line}" for line in summary]
    notes = sorted({row["cuDNN note"] for row in rows if row.get("cuDNN note")})
    notes = list(data.get("notes", [])) + [f"cuDNN: {n}" for n in notes]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    if data.get("host_cost"):
        lines += ["", "| host us per call (fresh tensors) | us |", "|---|---|"]
        lines += [f"| {label} | {us:.1f} |" for label, us in data["host_cost"]]
    return "\n".join(lines)


def span(values, fmt: str = "{:.2f}") -> str:
    """`a-b` of the values (one value when they agree at the format's precision)."""
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def ratio_lines(data: dict) -> list:
    """The ratios the prose of docs/benchmarks.md and README.md refers to, from the rows: cuDNN's
    engine against kda-aot per input class (graph replay, the same gate form) and the floors' copy
    bandwidth. Not the accurate mode's ratio: docs/numerics.md ("What accurate costs") holds the
    released kernels' figures, which may be newer than the record's run."""
    lines = []
    by_class = {}
    for row in data["rows"]:
        if row.get("cuDNN graph ms") is not None and row.get("graph ms"):
            by_class.setdefault(row["gates"], []).append(row["cuDNN graph ms"] / row["graph ms"])
    if by_class:
        lines.append("cuDNN's engine against kda-aot (graph replay, the same gate form): " + "; ".join(
            f"{span(r)}x kda-aot's time on {CLASS_NAMES.get(c, c)} inputs" for c, r in by_class.items()) + ".")
    if data.get("copy_bandwidth_TBps"):
        lines.append(f"floor: the row's DRAM bytes at the device-to-device copy bandwidth of this run, "
                     f"{data['copy_bandwidth_TBps']:.2f} TB/s.")
    return lines


def host_block(data: dict) -> str:
    """The entry points' host-cost records: one table per record, with its date and command."""
    records = data.get("host_cost_records") or []
    if not records:
        return "No host-cost records of the entry points in this JSON."
    lines = []
    for rec in records:
        columns = rec.get("columns") or ["us"]
        lines += [f"**{rec['title']}** ({rec.get('machine', '?')}, {rec.get('date', '?')}, `{rec['command']}`): "
                  f"{rec['what']}.", "",
                  "| call | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
        lines += [f"| {label} | " + " | ".join(f"{us:.1f}" for us in values) + " |" for label, values in rec["rows"]]
        if rec.get("note"):
            lines += ["", rec["note"]]
        lines.append("")
    return "\n".join(lines).rstrip()


GATE_FORM_ORDER = ("safe", "sigmoid", "softplus", "log_decay")


def gate_forms_block(data: dict) -> str:
    """Per shape and gate form: kda-aot's graph time on model gates against the safe gate's, FLA and
    cuDNN's engine; then random gates. (The accurate mode's cost is docs/numerics.md's.)"""
    rows = data["rows"]
    index = {(r["H"], r["sequences"], r["gates"], r["gate"]): r for r in rows}
    shapes = list(dict.fromkeys((r["H"], r["sequences"]) for r in rows))
    forms = [f for f in GATE_FORM_ORDER if any(r["gate"] == f for r in rows)]
    lines = [provenance(data), "",
             "| H, sequences | gate (g) | model gates: kda-aot | FLA chunk_kda | cuDNN engine "
             "| random gates: kda-aot | cuDNN engine |", "|---|---|---|---|---|---|---|"]
    vs_safe, vs_fla = [], []

    def cudnn(row):
        if row is None:
            return "-"
        if row.get("cuDNN graph ms") is not None:
            return ms(row["cuDNN graph ms"])
        return "n/a" if "in-kernel gate" in (row.get("cuDNN note") or "") else "-"

    for H, key in shapes:
        for form in forms:
            model, random = index.get((H, key, "model", form)), index.get((H, key, "random", form))
            if model is None and random is None:
                continue
            gate = form + (f" ({model['g dtype']})" if model and model.get("g dtype") else "")
            cells = [f"{H} {seqs({'sequences': key})}", gate]
            if model is not None:
                safe = index.get((H, key, "model", "safe"))
                cell = ms(model.get("graph ms"))
                if form != "safe" and safe and safe.get("graph ms") and model.get("graph ms"):
                    ratio = model["graph ms"] / safe["graph ms"]
                    vs_safe.append(ratio)
                    cell += f" ({ratio:.2f}x safe)"
                if model.get("FLA ms") and model.get("graph ms"):
                    vs_fla.append(model["FLA ms"] / model["graph ms"])
                cells += [cell, ms(model.get("FLA ms")), cudnn(model)]
            else:
                cells += ["-", "-", "-"]
            cells += [ms(random.get("graph ms")) if random else "-", cudnn(random)]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "ms per call: CUDA-graph replay for kda-aot and cuDNN's engine, FLA's `chunk_kda` eager. "
              "n/a: the engine's in-kernel gate is the bounded sigmoid gate only. -: not measured on that "
              "row in this run (docs/benchmarks.md's notes say why)."]
    summary = []
    if vs_safe:
        summary.append(f"The other forms cost {span(vs_safe)}x the safe gate's time (model gates).")
    if vs_fla:
        summary.append(f"kda-aot runs {span(vs_fla, '{:.1f}')}x faster than FLA's `chunk_kda` where FLA was timed.")
    if summary:
        lines += ["", " ".join(summary)]
    return "\n".join(lines)


def replace_block(text: str, marker: str, block: str, name: str) -> str:
    start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        raise KeyError(f"{name}: the markers {start} ... {end} are missing")
    return text[:i + len(start)] + "\n" + block + "\n" + text[j:]


def blocks(data: dict) -> dict:
    """{marker: generated text} of every block."""
    return {"BENCH:README": readme_block(data), "BENCH:TABLES": tables_block(data), "BENCH:HOST": host_block(data),
            "BENCH:GATE_FORMS": gate_forms_block(data)}


def render_blocks(generated: dict, markers: dict, texts: dict) -> dict:
    """{file name: new text} for `texts` ({file name: current text}), each block of `generated`
    ({marker: text}) written into the file `markers` names for it."""
    new = dict(texts)
    for marker, block in generated.items():
        name = markers[marker]
        new[name] = replace_block(new[name], marker, block, name)
    return new


def render(data: dict, texts: dict) -> dict:
    """{file name: new text} for `texts` ({file name: current text})."""
    return render_blocks(blocks(data), MARKERS, texts)


def first_difference(name: str, old: str, new: str) -> str:
    for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0):
        if line.startswith(("-", "+")) and not line.startswith(("---", "+++")):
            return f"{name} differs from the JSON's tables, first at: {line}"
    return f"{name} differs from the JSON's tables"


def generate(argv, repo: str, script: str, description: str, default_json: str, load_json, render_texts,
             files) -> int:
    """The command line of a docs-table generator (this one and ci/accuracy_tables.py): read the JSON,
    render the marked blocks of `files` (render_texts(data, {file: text}) -> {file: text}), and
    write them, or with --check exit 1 naming the first file that differs."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--json", default=os.path.join(repo, default_json))
    parser.add_argument("--check", action="store_true", help="exit 1 if a file differs from what the JSON gives")
    args = parser.parse_args(argv)
    data = load_json(args.json)
    texts = {}
    for name in files:
        with open(os.path.join(repo, name)) as f:
            texts[name] = f.read()
    try:
        new = render_texts(data, texts)
    except KeyError as exc:
        print(f"{script}: {exc.args[0]}", file=sys.stderr)
        return 1
    for name in files:
        if new[name] == texts[name]:
            continue
        if args.check:
            print(f"{script}: " + first_difference(name, texts[name], new[name]) + f" (run python {script})",
                  file=sys.stderr)
            return 1
        with open(os.path.join(repo, name), "w") as f:
            f.write(new[name])
        print(f"rewrote the tables of {name}")
    return 0


def main(argv=None, repo: str = REPO) -> int:
    return generate(argv, repo, "ci/bench_tables.py", __doc__.splitlines()[0], JSON, load, render, FILES)


if __name__ == "__main__":
    sys.exit(main())
