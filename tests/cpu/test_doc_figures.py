"""Measured figures in the docs come from their JSON record, and prose cites them (CPU only).

A figure a user reads (a time of a benchmark row, a host cost) is written once: in a block that a
generator renders from a JSON record, between `<!-- NAME -->` and `<!-- /NAME -->` markers. Prose
elsewhere cites the block's page instead of restating the number, so that one measurement never
shows different numbers on different pages. RECORDS is the registry of such JSON records; each
entry names its JSON, its generator (a script with `main(["--check"])` and `MARKERS`, marker name
-> file), the strings that cite it, what its figures look like and how its rows are named. Only
the benchmark record and the accuracy record of docs/numerics.md's correlated-key table are wired;
docs/numerics.md's older accuracy tables are dated records of their own runs.

What fails, outside generated blocks (fenced code is skipped):
- on any page, a paragraph, list item or table row that cites a record and also holds one of its
  figures: a restated figure next to its source, which is how diverging copies start;
- on the pages a user reads first (README.md, docs/benchmarks.md and the pages docs/README.md lists
  under "Using it"), a paragraph, list item or table row that names one of the record's rows (say
  "H=4 [16384]", or "host cost") and holds a figure: a copy of the record's figure (restated) or
  a number that disagrees with it, both reported as such. A figure dated with another day than
  the record's is a record of that run (a feature's cost, a model's input) and stays;
- a generated block that differs from what its generator renders from the JSON, or a marker that
  no generator knows.
The design records (docs/design.md and the other pages listed under "Design records") keep their
dated measurements: only the citation rule applies there. CHANGELOG.md is history and not scanned.
"""

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]

# A time or a speed ratio as prose writes it: "0.163 ms", "33 us", "1 µs", "9.6x", "2 to 27x".
TIME_FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:ms|us|µs)\b|(?<![\w.])\d+(?:\.\d+)?x(?![\w])")
# In a table row the unit sits in the header: a bare decimal with two or more places counts too.
TABLE_DECIMAL = re.compile(r"(?<![\w.])\d+\.\d{2,}(?![\w.])")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench_rows(generator, data) -> dict:
    """The benchmark's rows: {"H=4 [16384]": (pattern matching the ways the docs write the row,
    every figure the record holds for it)}."""
    rows = {}
    for row in data["rows"]:
        H, seqs = row["H"], generator.seqs(row)
        shown = re.escape(seqs)
        if seqs == "uneven6":
            shown = r"(?:uneven6|six uneven sequences)"
        pattern = re.compile(
            rf"\bH\s*=\s*{H}\b,?\s*{shown}|(?<![\w.\[]){H} {shown}|\|\s*{H}\s*\|\s*{shown}\s*\|")
        values = [v for v in row.values() if isinstance(v, float)]
        name = f"H={H} {seqs}"
        rows[name] = (pattern, rows.get(name, (pattern, []))[1] + values)
    # The host costs per call are figures of the same record.
    host = [us for _, us in data.get("host_cost") or []]
    host += [us for rec in data.get("host_cost_records") or [] for _, values in rec["rows"] for us in values]
    rows["host cost per call"] = (re.compile(r"\bhost (?:cost|time|us|microseconds)\b", re.I), host)
    return rows


def _agrees(figure: str, values) -> bool:
    """Whether a figure as written ("0.163 ms", "0.1630") is one of the values at its precision."""
    number = re.match(r"\d+(?:\.(\d+))?", figure)
    places = len(number.group(1) or "")
    return any(f"{v:.{places}f}" == number.group(0) for v in values)


@dataclass
class Record:
    name: str
    json: str
    generator: str
    marker_prefix: str
    cited_by: Tuple[str, ...]  # a unit holding one of these strings cites the record
    rows: Callable  # (generator module, data) -> {row name: (pattern of the ways the docs write it, figures)}
    figure: re.Pattern = TIME_FIGURE
    table_figure: re.Pattern = TABLE_DECIMAL
    # Pages whose measured tables belong to another record, not generated yet: the row rule skips
    # them (the citation rule does not).
    owned_elsewhere: Tuple[str, ...] = ()

    def module(self):
        return _load(REPO / self.generator)

    def data(self):
        generator = self.module()
        return generator.load(str(REPO / self.json))


# An error against float64 as the accuracy tables write it: "1.90e-02".
ERROR_FIGURE = re.compile(r"(?<![\w.])\d\.\d+e[-+]\d+(?!\w)")


def _correlated_rows(generator, data) -> dict:
    """The correlated-key table's rows, by input class and beta logit ("weak decay ... beta logit 6"),
    with every error the record holds for them."""
    rows = {}
    for row in data["correlated"]:
        name = f"{generator.CLASS_NAMES[row['class']]}, beta logit {row['beta_logit']:g}"
        values = [x for key in ("flashkda/off", "flashkda/on", "accurate/off", "accurate/on", "fla", "cudnn")
                  for x in (row.get(key) or []) if x is not None]
        pattern = re.compile(re.escape(generator.CLASS_NAMES[row["class"]]) + rf".*beta logit {row['beta_logit']:g}\b")
        rows[name] = (pattern, rows.get(name, (pattern, []))[1] + values)
    return rows


RECORDS = (
    Record(name="benchmark", json="docs/bench/h200.json", generator="ci/bench_tables.py", marker_prefix="BENCH:",
           cited_by=("docs/benchmarks.md", "benchmarks.md", "bench/h200.json", "README's speed table",
                     "README.md#speed", "gate_forms.md#cost"),
           rows=_bench_rows,
           # docs/numerics.md's "What accurate costs" times the accurate mode on the benchmark's
           # rows with its own method (ci/ab_wheels.sh); it belongs with the accuracy tables.
           owned_elsewhere=("docs/numerics.md",)),
    Record(name="accuracy", json="docs/bench/accuracy_h200.json", generator="ci/accuracy_tables.py",
           marker_prefix="ACCURACY:", cited_by=("accuracy_h200.json", "ci/accuracy_tables.py"),
           rows=_correlated_rows, figure=ERROR_FIGURE, table_figure=ERROR_FIGURE),
)

MARKER = re.compile(r"<!-- (/?)([A-Z]+:[A-Z_]+) -->")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
UNIT_START = re.compile(r"^\s*(?:[-*+]\s|\d+\.\s|\|)")


def pages(root: Path = REPO):
    """The Markdown pages a reader sees: README.md, CONTRIBUTING.md and docs/*.md."""
    found = [root / "README.md", root / "CONTRIBUTING.md"] + sorted((root / "docs").glob("*.md"))
    return [p for p in found if p.exists()]


def _index_section(root: Path, heading: str) -> set:
    """The pages docs/README.md links under one of its `## ` headings."""
    index = (root / "docs" / "README.md").read_text()
    part = index.split(f"## {heading}\n", 1)
    if len(part) < 2:
        return set()
    section = part[1].split("\n## ", 1)[0]
    return {f"docs/{name}" for name in re.findall(r"\]\(([\w.-]+\.md)\)", section)}


def user_pages(root: Path = REPO) -> set:
    """The pages a user reads first: README.md, docs/benchmarks.md and docs/README.md's "Using it"."""
    return {"README.md", "docs/benchmarks.md"} | _index_section(root, "Using it")


def outside_blocks(text: str) -> str:
    """The text with every generated block's content and every fenced code block blanked out
    (line breaks kept, so that line numbers stay)."""
    blank = lambda m: "\n" * m.group(0).count("\n")
    text = re.sub(r"<!-- ([A-Z]+:[A-Z_]+) -->.*?<!-- /\1 -->", blank, text, flags=re.S)
    return FENCE.sub(blank, text)


def units(text: str):
    """(first line number, text) of each paragraph, list item and table row outside generated
    blocks and code: the pieces a citation or a row name applies to."""
    current, start = [], 0
    for lineno, line in enumerate(outside_blocks(text).splitlines(), 1):
        if not line.strip() or UNIT_START.match(line) or (current and current[-1].lstrip().startswith("|")):
            if current:
                yield start, " ".join(current)
            current, start = [], lineno
            if not line.strip():
                continue
        if not current:
            start = lineno
        current.append(line.strip())
    if current:
        yield start, " ".join(current)


def figures(record: Record, unit: str) -> list:
    found = [m.group(0) for m in record.figure.finditer(unit)]
    if unit.startswith("|"):
        found += [m.group(0) for m in record.table_figure.finditer(unit)]
    return found


def scan(record: Record, root: Path = REPO, generator=None, data=None) -> list:
    """Every unit that restates one of the record's figures, as "file:line: why: text"."""
    generator = generator or record.module()
    data = data if data is not None else generator.load(str(root / record.json))
    rows = record.rows(generator, data)
    first = user_pages(root)
    found = []
    for page in pages(root):
        rel = str(page.relative_to(root))
        for lineno, unit in units(page.read_text()):
            numbers = figures(record, unit)
            if not numbers:
                continue
            where = f"{rel}:{lineno}"
            cited = [c for c in record.cited_by if c in unit]
            if cited:
                found.append(f"{where}: restates {', '.join(numbers)} beside a citation of {cited[0]} "
                             f"(cite it, without the number): {unit[:140]}")
                continue
            if rel not in first or rel in record.owned_elsewhere:
                continue
            named = [(name, values) for name, (pattern, values) in rows.items() if pattern.search(unit)]
            if not named:
                continue
            dates = set(DATE.findall(unit))
            if dates and data.get("date") not in dates:
                continue  # another run's dated figure: a record of that run
            values = [v for _, vs in named for v in vs]
            disagree = [n for n in numbers if not _agrees(n, values)]
            if disagree:
                found.append(f"{where}: {', '.join(disagree)} for {named[0][0]} disagrees with the {record.name} "
                             f"record ({record.json}): cite its generated tables instead: {unit[:140]}")
            else:
                found.append(f"{where}: restates {', '.join(numbers)} for {named[0][0]} from the {record.name} "
                             f"record ({record.json}) outside its generated tables: cite them: {unit[:140]}")
    return found


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.name)
def test_generated_blocks_are_what_the_json_gives(record):
    generator = record.module()
    assert generator.main(["--check"]) == 0, f"run python {record.generator} after changing {record.json}"


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.name)
def test_every_marker_belongs_to_its_generator(record):
    """A `<!-- PREFIX:NAME -->` block that the generator does not write would never be updated."""
    generator = record.module()
    for page in pages():
        rel = str(page.relative_to(REPO))
        for closing, name in MARKER.findall(page.read_text()):
            if not name.startswith(record.marker_prefix):
                continue
            assert name in generator.MARKERS, f"{rel}: marker {name} is not one {record.generator} writes"
            assert rel == generator.MARKERS[name], f"{rel}: marker {name} belongs in {generator.MARKERS[name]}"


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.name)
def test_no_doc_restates_a_figure_of_the_record(record):
    found = scan(record)
    assert not found, "figures restated outside the generated tables:\n" + "\n".join(found)


def test_every_generator_is_registered():
    """A script under ci/ that renders marked blocks (it defines MARKERS) is a record's generator:
    without an entry in RECORDS its figures would go unchecked."""
    generators = {str(p.relative_to(REPO)) for p in (REPO / "ci").glob("*.py")
                  if re.search(r"^MARKERS\s*=", p.read_text(), re.M)}
    assert generators <= {r.generator for r in RECORDS}, generators


def test_the_scan_sees_what_it_looks_for(tmp_path):
    """The scanner itself, on a made-up tree: the cases it must catch and the ones it must let be."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "README.md").write_text(
        "# Index\n\n## Using it\n\n- [torch.md](torch.md): x\n\n## Design records\n\n- [design.md](design.md): y\n")
    (tmp_path / "README.md").write_text(
        "# R\n\n<!-- BENCH:README -->\n| 4 [16384] | 0.163 |\n<!-- /BENCH:README -->\n\n"
        "kda-aot is fast (docs/benchmarks.md).\n")
    (tmp_path / "docs" / "torch.md").write_text(
        "# T\n\n- faster than FlashKDA (at H = 4 [16384]: 0.160 ms against 1.615 ms; docs/benchmarks.md).\n"
        "- It costs 1.07-1.11x the default (docs/gate_forms.md#cost).\n\n"
        "| H, sequences | kda-aot |\n|---|---|\n| 4 [16384] | 0.163 |\n\n"
        "Measured 2026-12-01 at H=64 [8192]: 0.595 -> 0.617 ms without a state.\n\n"
        "Measured 2026-12-02 at H=64 [8192]: 0.603 ms.\n\n"
        "On 2026-12-02 H=64 [8192] took 0.590 ms.\n\n"
        "Reading the stream costs 0.3 us.\n\n"
        "```\nH=4 [16384] 0.999 ms docs/benchmarks.md\n```\n")
    (tmp_path / "docs" / "design.md").write_text("# D\n\n| H=4 [16384] | 0.160 ms |\n")
    record = RECORDS[0]
    data = {"date": "2026-12-02", "rows": [{"H": 4, "sequences": "16384", "gates": "model", "gate": "safe",
                                            "graph ms": 0.1631},
                                           {"H": 64, "sequences": "8192", "gates": "model", "gate": "safe",
                                            "graph ms": 0.6031}]}
    found = scan(record, root=tmp_path, generator=record.module(), data=data)
    where = [line.split(": ", 1)[0] for line in found]
    assert where == ["docs/torch.md:3", "docs/torch.md:4", "docs/torch.md:8", "docs/torch.md:12",
                     "docs/torch.md:14"], found
    assert "beside a citation of docs/benchmarks.md" in found[0], found
    assert "restates 1.11x beside a citation of gate_forms.md#cost" in found[1], found
    assert "restates 0.163 for H=4 [16384]" in found[2] and "restates 0.603 ms for H=64 [8192]" in found[3], found
    assert "0.590 ms for H=64 [8192] disagrees" in found[4], found
    # The citation rule applies to every page, and to any figure: gate_forms.md is cited there.
    record_gf = Record(name="t", json="x", generator=record.generator, marker_prefix="BENCH:",
                       cited_by=("docs/gate_forms.md",), rows=lambda generator, data: {})
    found = scan(record_gf, root=tmp_path, generator=record.module(), data=data)
    assert [line.split(": ", 1)[0] for line in found] == ["docs/torch.md:4"], found


def test_units_split_paragraphs_items_and_rows():
    text = ("One\nparagraph.\n\n- item one\n  continued\n- item two\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
            "<!-- BENCH:X -->\nhidden 1.000 ms\n<!-- /BENCH:X -->\nafter\n")
    assert list(units(text)) == [(1, "One paragraph."), (4, "- item one continued"), (6, "- item two"),
                                 (8, "| a | b |"), (9, "|---|---|"), (10, "| 1 | 2 |"), (14, "after")]


def test_the_accuracy_scan_flags_a_restated_error(tmp_path):
    """The accuracy record's rules on a made-up page: an error next to a citation of its JSON, and a
    correlated row's error on a user page, are reported; an undated figure of another kind is not."""
    record = RECORDS[1]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "README.md").write_text("# Index\n\n## Using it\n\n- [torch.md](torch.md): x\n")
    (tmp_path / "README.md").write_text("# x\n")
    (tmp_path / "docs" / "torch.md").write_text(
        "Measured in docs/bench/accuracy_h200.json: 1.90e-02.\n\n"
        "On weak decay with beta logit 6 the default measures 9.99e-02.\n\n"
        "A time: 0.163 ms.\n")
    found = scan(record, root=tmp_path, generator=record.module(), data=record.data())
    assert len(found) == 2 and "restates 1.90e-02" in found[0] and "9.99e-02" in found[1], found
