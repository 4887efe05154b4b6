"""The runtime's import graph has no circles and its roles import downwards (no GPU needed): every
import between kda_aot's modules, in every sub-package, at module level or inside a function, read
from the source with ast.

Modules are named by their dotted path below kda_aot ("api", "plan.launcher"); a sub-package's
__init__ is its package name ("plan"). Roles (CONTRIBUTING.md, "Layout"):
  front ends and commands   the other top-level modules (what is imported or run by name)
  tools                     kda_aot/tools/ (the measurement tools behind the commands)
  intake, plan              kda_aot/intake/, kda_aot/plan/
  references                kda_aot/references/ and kda_aot/reference.py (public: docs/api.md)
  spec                      kda_aot/spec/ (prefill's arguments, the gate forms, the Problem)
  library                   kda_aot/library/ and kda_aot/errors.py
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "kda_aot"
BUILD = Path(__file__).resolve().parents[2] / "build_kernels"

# The commands and the tools behind them (kda_aot/tools/): they may import anything, and nothing but
# another command or tool imports them.
TOOLS = {"__main__", "bench", "bench_op", "profile", "demo", "tools"}
# Top-level modules of a lower role: the exceptions, and the public torch reference.
TOP_LEVEL_ROLES = {"errors": "library", "reference": "references"}
# What each role may import besides itself (front ends: anything but the commands).
MAY_IMPORT = {
    "library": {"library"},
    "spec": {"library"},
    "intake": {"spec", "library"},
    "plan": {"spec", "library"},
    "references": {"spec", "library"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def role(name: str) -> str:
    """The role of a module: its sub-package, TOP_LEVEL_ROLES' for errors.py and reference.py, "tools"
    for a command, "front" for the other top-level modules."""
    if "." in name or name in MAY_IMPORT:
        return name.split(".")[0]
    if name in TOP_LEVEL_ROLES:
        return TOP_LEVEL_ROLES[name]
    return "tools" if name in TOOLS else "front"


def _resolve(path: Path, node: ast.ImportFrom, modules) -> set:
    """The kda_aot modules one `from ... import ...` names (a module, or a package's __init__ and
    each sub-module imported from it)."""
    if node.level:
        here = module_name(path).split(".") if path.name == "__init__.py" else module_name(path).split(".")[:-1]
        if path.name == "__init__.py" and here == ["__init__"]:
            here = []
        base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
    elif node.module and node.module.split(".")[0] == "kda_aot":
        base = []
    else:
        return set()
    mod = (node.module or "").split(".") if node.level else node.module.split(".")[1:]
    target = [p for p in base + mod if p]
    deps = set()
    name = ".".join(target)
    if name in modules:
        deps.add(name)
    for alias in node.names:
        sub = ".".join(target + [alias.name])
        if sub in modules:
            deps.add(sub)
    return deps


def import_graph():
    paths = [p for p in PKG.rglob("*.py") if "_lib" not in p.relative_to(PKG).parts]
    modules = {module_name(p): p for p in paths}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                deps |= _resolve(path, node, modules)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == "kda_aot" and len(parts) > 1 and ".".join(parts[1:]) in modules:
                        deps.add(".".join(parts[1:]))
        graph[name] = sorted(d for d in deps if d != name and d != "__init__")
    return graph


def find_cycle(graph):
    """One circle as a list of modules, or None."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        for dep in graph[node]:
            if state.get(dep) == "open":
                return path[path.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep, path + [dep])
                if found:
                    return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def layering_violations(graph):
    """Every import that goes against the roles: (importer, imported)."""
    bad = []
    for name, deps in graph.items():
        mine = role(name)
        for dep in deps:
            theirs = role(dep)
            if theirs == mine or mine == "tools":
                continue
            if mine == "front":
                ok = theirs != "tools"
            else:
                ok = theirs in MAY_IMPORT[mine]
            if not ok:
                bad.append((name, dep))
    return bad


def test_the_graph_reads_every_sub_package():
    graph = import_graph()
    assert {"api", "torch", "fla_compat", "errors", "library.loader", "library.identity", "spec.problem",
            "intake.validation", "plan.launcher", "plan.cp_plan", "reference", "references.reference_np"} <= set(graph)
    assert {"library.loader", "spec.problem"} <= set(graph["plan.launcher"])
    assert "plan.cp_plan" in graph["plan.call_plan"]  # `from . import cp_plan` inside a sub-package
    assert "errors" in graph["library.loader"]  # `from ..errors import ...`
    assert "plan.call_plan" in graph["api"]  # `from .plan import call_plan`
    assert role("reference") == "references" and role("errors") == "library" and role("bench") == "tools"
    assert role("tools") == role("tools.bench.cli") == "tools" and "tools.bench.cli" in graph["bench"]


def test_the_runtime_imports_in_one_direction():
    graph = import_graph()
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_roles_import_downwards():
    """library <- spec <- intake, plan, references <- front ends <- commands: intake and plan never
    import each other (the wall hands the plan a spec.problem.Problem), and no layer below the front
    ends imports a front end or a command."""
    graph = import_graph()
    assert layering_violations(graph) == []


def test_the_cycle_finder_finds_a_circle():
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b"], "b": [], "c": ["a"]}) is None


def test_the_layering_check_finds_an_upward_import():
    graph = {"library.loader": ["api"], "plan.launcher": ["intake.validation"], "intake.tensors": ["spec.problem"],
             "api": ["bench"], "bench": ["api"]}
    assert sorted(layering_violations(graph)) == [("api", "bench"), ("library.loader", "api"),
                                                  ("plan.launcher", "intake.validation")]


def _imported_by(statement: str, modules=("jax", "jaxlib", "torch")):
    """The modules of `modules` that a fresh interpreter holds after `statement`."""
    code = f"import sys; {statement}; print(sorted(m for m in {modules!r} if m in sys.modules))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert run.returncode == 0, run.stderr
    return eval(run.stdout.strip().splitlines()[-1])


def test_import_kda_aot_imports_neither_jax_nor_torch():
    assert _imported_by("import kda_aot; import kda_aot.api, kda_aot.intake.frameworks") == []


def test_kda_aot_jax_imports_jax_and_not_torch():
    pytest.importorskip("jax", reason="JAX is not installed (ci/test.sh installs its CPU wheel)")
    assert _imported_by("import kda_aot.jax") == ["jax", "jaxlib"]


def test_the_build_never_imports_jax():
    """The XLA handler is plain C against declarations of its own (build_kernels/shim/xla_ffi_abi.h):
    no JAX, jaxlib or XLA header at build time."""
    found = [f"{p.relative_to(BUILD)}" for p in BUILD.rglob("*") if p.suffix in (".py", ".c", ".h", ".txt")
             and re.search(r"^\s*(import|from)\s+jax|#include\s+[<\"]xla/", p.read_text(), re.M)]
    assert found == []
