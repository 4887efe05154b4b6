"""The repository's text describes the product: no bookkeeping of how it was made, and no docs
link that leads nowhere.

Fails on, in any text file git tracks:
- the word for a sitting of work (WORD below; pytest's fixture scope of that name is code and
  allowed);
- references to internal issue numbers ("issue 14", "issue-14's", "#14" in prose of a document);
- names of branches that do not exist in the repository;
- a docs link that does not resolve: a relative markdown link `[text](path)` (with or without a
  `#heading`, which must then be one of the target's headings) or a backticked `docs/...` path.

Reads the source tree next to this file through `git ls-files`; skips where there is no git
checkout (an unpacked sdist has neither .git nor docs/).
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Spelt in two pieces so that `git grep` for the word finds nothing in this file either.
WORD = "ses" "sion"
WORD_RE = re.compile(WORD, re.I)
# The one code form of the word: pytest fixture scopes.
WORD_OK = re.compile(r"""scope\s*=\s*["']""" + WORD + r"""["']""")
ISSUE_NUMBER = re.compile(r"\bissue[ -]#?\d+|\bissues #\d+", re.I)  # "issues 32 copies" is a verb
# "#12" as a reference in prose: after a space or an opening bracket, not a markdown heading, a
# colour, a shell `${x#y}` or a C preprocessor line.
HASH_NUMBER = re.compile(r"(?:^|[\s(\[])#\d+\b")
MISSING_BRANCHES = ("k2-fused", "k1-k2-overlap", "wgmma-q1", "k1-cpasync", "k2-regstate")
BRANCH = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, MISSING_BRANCHES)) + r")(?![\w-])")
LENT = re.compile(r"\blent\b", re.I)

MD_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOCS_PATH = re.compile(r"`(docs/[\w./-]*)`")
# This file names what it looks for.
SELF = Path(__file__).resolve()


def _tracked_text_files(root: Path = REPO):
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("no git checkout here (the scan reads `git ls-files`)")
    names = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True,
                           text=True).stdout.split("\0")
    for name in names:
        path = root / name
        if not name or not path.is_file() or path.resolve() == SELF:
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary (images)
        yield path, data.decode("utf-8", errors="replace")


def _bookkeeping(path: Path, text: str, rel: str):
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        where = f"{rel}:{lineno}"
        if WORD_RE.search(WORD_OK.sub("", line)):
            found.append(f"{where}: '{WORD}': {line.strip()[:100]}")
        if ISSUE_NUMBER.search(line):
            found.append(f"{where}: internal issue number: {line.strip()[:100]}")
        if path.suffix == ".md" and not line.lstrip().startswith("#") and HASH_NUMBER.search(line):
            found.append(f"{where}: '#N' reference: {line.strip()[:100]}")
        if BRANCH.search(line):
            found.append(f"{where}: branch that does not exist: {line.strip()[:100]}")
        if LENT.search(line):
            found.append(f"{where}: 'lent': {line.strip()[:100]}")
    return found


def scan_bookkeeping(root: Path = REPO):
    found = []
    for path, text in _tracked_text_files(root):
        found += _bookkeeping(path, text, str(path.relative_to(root)))
    return found


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(doc: Path):
    return {_anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", doc.read_text(), re.M)}


def _resolve(ref: str, source: Path, root: Path):
    """The target of a link from `source`, or None where it does not resolve."""
    target, _, fragment = ref.partition("#")
    if not target:
        path = source
    else:
        path = (source.parent / target).resolve()
        if not path.exists():
            path = (root / target).resolve()  # a repository-rooted path, as the docs write them
        if not path.exists():
            return None
    if fragment and path.suffix == ".md" and _anchor(fragment) not in _anchors(path):
        return None
    return path


def scan_links(root: Path = REPO):
    missing = []
    for path, text in _tracked_text_files(root):
        rel = path.relative_to(root)
        for lineno, line in enumerate(text.splitlines(), 1):
            refs = []
            if path.suffix == ".md":
                refs += [r for r in MD_LINK.findall(line) if "://" not in r and not r.startswith("mailto:")]
            refs += DOCS_PATH.findall(line)
            for ref in refs:
                if "<" in ref or "*" in ref:
                    continue  # a pattern (docs/bench/<gpu>_<date>.json), not a file
                if _resolve(ref, path, root) is None:
                    missing.append(f"{rel}:{lineno}: {ref}")
    return missing


def test_no_trace_of_how_the_work_was_organised():
    found = scan_bookkeeping()
    assert not found, "tracked files that describe the making, not the product:\n" + "\n".join(found)


def test_every_docs_link_resolves():
    missing = scan_links()
    assert not missing, "links that lead nowhere:\n" + "\n".join(missing)


def test_the_docs_index_lists_every_doc():
    """docs/README.md is the index: every page under docs/ is linked from it."""
    index = (REPO / "docs" / "README.md").read_text()
    linked = set(MD_LINK.findall(index))
    pages = {p.name for p in (REPO / "docs").glob("*.md") if p.name != "README.md"}
    assert pages <= linked, f"docs pages missing from docs/README.md: {sorted(pages - linked)}"


def _repo(tmp_path, files):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    subprocess.run(["git", "-C", str(tmp_path), "init", "-q"], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    return tmp_path


def test_the_scans_see_what_they_look_for(tmp_path):
    """The scanners themselves, on a made-up tree: each kind of trace and of broken link is
    reported, and the allowed forms are not (else the tests above prove nothing)."""
    root = _repo(tmp_path, {
        "docs/a.md": "# A title\n\n## Two words\n\nSee [b](b.md), [here](#two-words), [gone](c.md),\n"
                     "[bad anchor](b.md#nowhere), `docs/a.md`, `docs/none.md` and [web](https://x.org/y.md).\n"
                     f"The third {WORD} found it (issue 14, see #12). Branch k2-fused; a lent machine.\n",
        "docs/b.md": "# B\n",
        "tests/c.py": f'@pytest.fixture(scope="{WORD}")\ndef f(): pass\n# ${{x#2}} stays\n',
    })
    links = scan_links(root)
    assert links == ["docs/a.md:5: c.md", "docs/a.md:6: b.md#nowhere", "docs/a.md:6: docs/none.md"], links
    kinds = [line.split(": ", 2)[1] for line in scan_bookkeeping(root)]
    assert kinds == [f"'{WORD}'", "internal issue number", "'#N' reference", "branch that does not exist",
                     "'lent'"], kinds
