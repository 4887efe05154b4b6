"""The runtime's import graph has no circles (no GPU needed): every import between kda_aot's modules,
at module level or inside a function, read from the source with ast."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "kda_aot"


def import_graph():
    modules = {p.stem: p for p in PKG.glob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level == 1:  # from .x import y / from . import x, y
                deps |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            elif node.level == 0 and node.module and node.module.split(".")[0] == "kda_aot":
                parts = node.module.split(".")
                deps |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
        graph[name] = sorted(d for d in deps if d in modules and d != name)
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


def test_the_runtime_imports_in_one_direction():
    graph = import_graph()
    assert {"api", "loader", "identity", "errors", "torch", "fla_compat"} <= set(graph)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_finder_finds_a_circle():
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b"], "b": [], "c": ["a"]}) is None
