"""The kernel wing's module structure, checked on the CPU without the DSL (source parsing only).

A kernel module (one named by a registry variant's `module`) may import shared helper modules
(ptx_ops, tile_ops, recurrence_common, ...) but never another kernel module: what two kernels
share lives in a helper both import, so a change to one kernel cannot silently change another's
PTX through an import, and each kernel file reads on its own.
"""

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KERNELS = REPO / "build_kernels" / "kernels"
sys.path.append(str(REPO))  # build_kernels lives only in the source tree (appended: kda_aot stays the installed one); registry.py is stdlib only

from build_kernels.registry import all_variants  # noqa: E402


def _kernel_modules():
    return sorted({v.module for v in all_variants()})


def _imported_kernel_siblings(module: str):
    """Modules of build_kernels.kernels that `module` imports, by any import form."""
    tree = ast.parse((KERNELS / f"{module}.py").read_text(), filename=f"{module}.py")
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:  # from .x import y / from . import x
                if node.module:
                    found.add(node.module.split(".")[0])
                else:
                    found.update(alias.name for alias in node.names)
            elif node.module and node.module.startswith("build_kernels.kernels"):
                rest = node.module[len("build_kernels.kernels"):].lstrip(".")
                if rest:
                    found.add(rest.split(".")[0])
                else:
                    found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("build_kernels.kernels."):
                    found.add(alias.name.split(".")[2])
    return found


def test_every_kernel_module_exists():
    for module in _kernel_modules():
        assert (KERNELS / f"{module}.py").is_file(), module


def test_no_kernel_module_imports_another_kernel_module():
    kernels = set(_kernel_modules())
    offenders = {}
    for module in sorted(kernels):
        others = _imported_kernel_siblings(module) & (kernels - {module})
        if others:
            offenders[module] = sorted(others)
    assert not offenders, (f"kernel modules import other kernel modules: {offenders}; move what they share "
                           "into a helper module (ptx_ops, tile_ops, recurrence_common)")


def test_the_import_scan_sees_every_form(tmp_path, monkeypatch):
    """The scan itself: each import form of a sibling module is reported (else the test above
    could pass vacuously)."""
    (tmp_path / "fake.py").write_text(
        "from .k2_recurrence import STAGES\n"
        "from . import cp_merge\n"
        "from build_kernels.kernels.k1_prepare import THREADS\n"
        "import build_kernels.kernels.seq_tables\n"
        "from .tile_ops import D\n")
    monkeypatch.setattr(sys.modules[__name__], "KERNELS", tmp_path)
    assert _imported_kernel_siblings("fake") == {"k2_recurrence", "cp_merge", "k1_prepare", "seq_tables",
                                                 "tile_ops"}


def test_a_kernels_cache_key_covers_every_module_it_imports():
    """compile.fingerprint hashes the sources compile._kernel_sources lists: every module of
    build_kernels/kernels/ that a kernel imports, the helpers of common/ and theirs included (else a
    helper's change would leave stale kernels in the build cache)."""
    pytest = __import__("pytest")
    pytest.importorskip("cutlass")
    from build_kernels import compile as kc

    def imported(path: Path, package: str):
        tree = ast.parse(path.read_text(), filename=path.name)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                yield f"{package}.{node.module}" if package else node.module

    for module in _kernel_modules():
        listed = {p.resolve() for p in kc._kernel_sources(module)}
        todo, wanted = [module], set()
        while todo:
            name = todo.pop()
            path = KERNELS.joinpath(*name.split(".")).with_suffix(".py")
            if path in wanted:
                continue
            wanted.add(path)
            todo.extend(imported(path, name.rpartition(".")[0]))
        assert wanted <= listed, (module, sorted(str(p.relative_to(KERNELS)) for p in wanted - listed))
        assert any(p.parent.name == "common" for p in listed), module
