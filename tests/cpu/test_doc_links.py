"""The repository is self-contained: every document a comment, docstring or doc cites is in it.

A cited *.md path must exist (relative to the repository root or to the citing file; a bare name
such as "wheels.md" anywhere in the tree), and a cited section of docs/algorithm.md or
docs/build.md ("docs/algorithm.md §2.4") must be one of its headings. Reads the source tree next to
this file, not the installed package (documents are not installed).
"""

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".whl", ".carry", ".peers"}
BUILD_OUTPUT = {"build", "dist"}  # at the repository root only (tests/build/ is the build tests)
SUFFIXES = {".py", ".md", ".sh", ".txt", ".toml", ".c", ".h", ".map", ".cu", ".cuh", ".yml"}
# The scanners' own tests cite made-up documents on purpose.
SCANNER_TESTS = {"test_doc_links.py", "test_docs.py"}
# A path-like token ending in .md; URLs are the web's business, not the repository's.
MD_REF = re.compile(r"(?<![\w/.:-])((?:[\w.-]+/)*[\w.-]+\.md)\b")
# Tokens that end in .md without citing a document: files the tools write into $OUT
# (ci/gpu_bench.sh, tests/gpu/test_torch_op.py, ci/numerics_table.py) and the benchmark's --md option (args.md).
NOT_DOCUMENTS = {"bench.md", "op_dispatch.md", "args.md", "numerics_table.md"}
SECTION_REF = re.compile(r"(docs/(?:algorithm|build)\.md) ((?:§\d+(?:\.\d+)?(?:, (?:§)?\d+(?:\.\d+)?)*))")


def _files(root: Path = REPO):
    for base, dirs, names in os.walk(root):
        # Any virtual environment (ci/venv.sh's .venv/, .ci/run's .venv-notorch/, ...) holds
        # third-party code, not the repository's.
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")
                   and not (d in BUILD_OUTPUT and Path(base) == root)
                   and not Path(base, d, "pyvenv.cfg").exists()]
        for name in names:
            path = Path(base, name)
            if (path.suffix in SUFFIXES or name == "CMakeLists.txt") and not (
                    name in SCANNER_TESTS and path.parent == Path(__file__).resolve().parent):
                yield path


def _missing_documents(root: Path = REPO):
    names = {p.name for p in _files(root) if p.suffix == ".md"}
    missing = []
    for path in _files(root):
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in MD_REF.finditer(line):
                ref = match.group(1)
                word = line[line.rfind(" ", 0, match.start()) + 1:match.end()]
                if "://" in word or "$" in word or Path(ref).name in NOT_DOCUMENTS:
                    continue  # a URL, a path under a shell variable, or not a document
                found = (root / ref).is_file() or (path.parent / ref).is_file() or ("/" not in ref and ref in names)
                if not found:
                    missing.append(f"{path.relative_to(root)}:{lineno}: {ref}")
    return missing


def test_every_cited_document_exists():
    missing = _missing_documents()
    assert not missing, "documents cited but not in the repository:\n" + "\n".join(missing)


def _sections(doc: Path):
    found = set()
    for line in doc.read_text().splitlines():
        m = re.match(r"#{2,3} (\d+(?:\.\d+)?)\.? ", line)
        if m:
            found.add(m.group(1).rstrip("."))
    return found


def test_cited_sections_exist():
    known = {doc: _sections(REPO / doc) for doc in ("docs/algorithm.md", "docs/build.md")}
    missing = []
    for path in _files():
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in SECTION_REF.finditer(line):
                doc = match.group(1)
                for number in re.findall(r"\d+(?:\.\d+)?", match.group(2)):
                    # "§4.6 item 2" cites 4.6; a bare chapter ("§2") is a "## 2." heading.
                    if number not in known[doc]:
                        missing.append(f"{path.relative_to(REPO)}:{lineno}: {doc} §{number}")
    assert not missing, "sections cited but not in the document:\n" + "\n".join(missing)


def test_the_check_sees_a_missing_document(tmp_path):
    """The scanner itself: a made-up citation is reported, a present one is not (else the test
    above proves nothing)."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("# here\n")
    (tmp_path / "probe.py").write_text('"""See docs/here.md and shared/design/nowhere_spec.md; '
                                       'https://example.com/away.md is a URL."""\n')
    assert _missing_documents(tmp_path) == ["probe.py:1: shared/design/nowhere_spec.md"]
