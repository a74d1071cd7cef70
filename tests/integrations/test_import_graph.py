"""No import circle inside ``dcut_sched/integrations``; the vLLM plugin never imports its tools.

The graph is read from the source with ``ast`` (every import, module level or inside a function,
since a lazy import still closes a circle when it runs), relative imports resolved, a package being
its ``__init__``. ``from . import name`` is an edge to the submodule ``name`` when there is one, else
to the package. Run as a script to print the graph and the circles:
``python tests/integrations/test_import_graph.py``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "dcut_sched.integrations"


def module_names(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted name -> file of every module under ``package``."""
    base = root.joinpath(*package.split("."))
    out = {}
    for path in sorted(base.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules under ``package`` it imports."""
    modules = module_names(root, package)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        here = name if is_pkg else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for t in targets:
                while t and t not in modules:  # ``import a.b.c`` of a name inside a module
                    t = t.rpartition(".")[0]
                if t and t != name:
                    graph[name].add(t)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_inside_integrations():
    graph = import_graph()
    assert "dcut_sched.integrations.vllm.scheduler" in graph and "dcut_sched.integrations.vllm_tools.run" in graph
    assert circles(graph) == []


def test_the_plugin_never_imports_the_tools():
    graph = import_graph()
    plugin = [m for m in graph if m.startswith("dcut_sched.integrations.vllm.") or m == "dcut_sched.integrations.vllm"]
    assert len(plugin) >= 7
    for m in plugin:
        assert not any(t.startswith("dcut_sched.integrations.vllm_tools") for t in graph[m]), (m, graph[m])


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def main() -> int:
    graph = import_graph()
    for m in sorted(graph):
        print(m, "->", ", ".join(sorted(graph[m])) or "-")
    found = circles(graph)
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports inside {PACKAGE}; circles: {found or 'none'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
