"""Measure the package's architecture traits (docs/design.md §5 quotes them).

    python analysis/arch_traits.py            # a Markdown table of the traits of dcut_sched/
    python analysis/arch_traits.py --list     # the same, then the long functions and the lazy imports
    python analysis/arch_traits.py --package /old/checkout/dcut_sched   # another tree (before/after)

Read with ``ast`` only (nothing is imported). The traits: functions over 100 lines, the largest
module, modules over 500 lines, imports inside functions outside ``cli/`` (and in all), root
modules, files that build an ``argparse.ArgumentParser`` outside ``cli/``, the import cycles (every
import counted, module level or inside a function; ``if TYPE_CHECKING`` blocks too) and the
docstring share of the core modules (docstring lines / all lines), the ``assert`` statements
(internal facts) and the ``MAX_*`` size limits (module-level constants named ``MAX_...`` or
``_MAX_...``).
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import numpy as np
from scipy.sparse import csr_array
from scipy.sparse.csgraph import connected_components

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dcut_sched"
LONG_FUNCTION = 100
LONG_MODULE = 500
# The pure core: scores and budgets, step costs, sampling, the policies and the controller.
CORE = ("scores.py", "step_costs.py", "sampling.py", "policies", "controller")
LIMIT_NAME = re.compile(r"_?MAX_[A-Z0-9_]+")


def _modules(package: Path) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)


def _rel(path: Path, package: Path) -> str:
    return path.relative_to(package).as_posix()


def _docstring_lines(tree: ast.Module) -> int:
    """Lines taken by the module, class and function docstrings of one module."""
    total = 0
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                total += body[0].end_lineno - body[0].lineno + 1
    return total


def _lazy_imports(tree: ast.Module) -> list[int]:
    """Line numbers of the import statements inside a function body."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    lines.append(inner.lineno)
    return sorted(set(lines))


def _limits(tree: ast.Module) -> list[str]:
    """The names of the module-level ``MAX_*`` constants of one module."""
    names = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        names += [t.id for t in targets if isinstance(t, ast.Name) and LIMIT_NAME.fullmatch(t.id)]
    return names


def _builds_parser(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Attribute) and f.attr == "ArgumentParser") or \
                    (isinstance(f, ast.Name) and f.id == "ArgumentParser"):
                return True
    return False


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The modules of the package that module ``name`` (file ``path``) imports."""
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
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
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports (every import, module level or inside a
    function; a package is its ``__init__``; ``from . import name`` is an edge to the submodule
    ``name`` when there is one; importing ``a.b`` does not count as importing ``a``)."""
    files = {}
    for path in _modules(package):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return {name: _imports(path, name, set(files)) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of two or more modules, each sorted, in sorted order."""
    names = sorted(graph)
    at = {n: k for k, n in enumerate(names)}
    edges = [(at[v], at[w]) for v in names for w in graph[v] if w in at]
    adjacency = csr_array((np.ones(len(edges)), ([e[0] for e in edges], [e[1] for e in edges])),
                          shape=(len(names), len(names)))
    _, label = connected_components(adjacency, directed=True, connection="strong")
    groups: dict[int, list[str]] = {}
    for n, lab in zip(names, label):
        groups.setdefault(int(lab), []).append(n)
    return sorted(sorted(g) for g in groups.values() if len(g) > 1)


def import_cycles(package: Path = PACKAGE) -> list[list[str]]:
    """The import cycles among the package's modules."""
    return cycles(import_graph(package))


def measure(package: Path = PACKAGE) -> dict:
    """The traits of ``package`` as a dict (the lists hold ``path:name lines`` / ``path:line`` strings)."""
    long_functions, lazy_all, lazy_outside_cli, parsers_outside_cli = [], [], [], []
    asserts, limits = [], []
    sizes, core_doc, core_lines = {}, 0, 0
    for path in _modules(package):
        rel = _rel(path, package)
        text = path.read_text()
        tree = ast.parse(text, filename=str(path))
        n_lines = len(text.splitlines())
        sizes[rel] = n_lines
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > LONG_FUNCTION:
                    long_functions.append((length, f"{rel}:{node.name}"))
        asserts += [f"{rel}:{node.lineno}" for node in ast.walk(tree) if isinstance(node, ast.Assert)]
        limits += [f"{rel}:{name}" for name in _limits(tree)]
        in_cli = rel.startswith("cli/")
        for line in _lazy_imports(tree):
            lazy_all.append(f"{rel}:{line}")
            if not in_cli:
                lazy_outside_cli.append(f"{rel}:{line}")
        if not in_cli and _builds_parser(tree):
            parsers_outside_cli.append(rel)
        if rel.startswith(CORE) or rel in CORE:
            core_doc += _docstring_lines(tree)
            core_lines += n_lines
    largest = max(sizes, key=sizes.get)
    root = sorted(p.name for p in package.glob("*.py") if p.name != "__init__.py")
    return {
        "functions_over_100": [f"{name} {n}" for n, name in sorted(long_functions, reverse=True)],
        "largest_module": f"{largest} {sizes[largest]}",
        "modules_over_500": [f"{m} {n}" for m, n in sorted(sizes.items(), key=lambda kv: -kv[1]) if n > LONG_MODULE],
        "lazy_imports_outside_cli": lazy_outside_cli,
        "lazy_imports_all": lazy_all,
        "root_modules": root,
        "parsers_outside_cli": parsers_outside_cli,
        "core_docstring_share": core_doc / core_lines if core_lines else 0.0,
        "asserts": asserts,
        "max_limits": limits,
        "import_cycles": [" <-> ".join(m.removeprefix("dcut_sched.") for m in c) for c in import_cycles(package)],
    }


def table(traits: dict) -> str:
    def _few(items: list[str], k: int = 3) -> str:
        shown = ", ".join(f"`{i}`" for i in items[:k])
        return f"{len(items)}" + (f": {shown}" + (", ..." if len(items) > k else "") if items else "")

    rows = [
        ("functions over 100 lines", _few(traits["functions_over_100"])),
        ("largest module", f"`{traits['largest_module']}`"),
        ("modules over 500 lines", _few(traits["modules_over_500"])),
        ("imports inside functions outside `cli/`",
         f"{len(traits['lazy_imports_outside_cli'])} ({len(traits['lazy_imports_all'])} in all)"),
        ("root modules", f"{len(traits['root_modules'])}: " + ", ".join(traits["root_modules"])),
        ("argparse parsers outside `cli/`", _few(traits["parsers_outside_cli"], k=6)),
        ("import cycles", _few(traits["import_cycles"], k=6)),
        ("docstring share of core modules", f"{100 * traits['core_docstring_share']:.0f} %"),
        ("`assert` statements", f"{len(traits['asserts'])}"),
        ("`MAX_*` size limits", f"{len(traits['max_limits'])}"),
    ]
    out = ["| trait | dcut_sched/ |", "|---|---|"]
    out += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true",
                        help="also list the long functions, the lazy imports, the asserts and the MAX_* limits")
    parser.add_argument("--package", type=Path, default=PACKAGE, help="the package folder (default: this checkout's)")
    args = parser.parse_args(argv)
    if not (args.package / "__init__.py").is_file():
        parser.error(f"--package {args.package}: not a package folder (no __init__.py); give the dcut_sched folder")
    traits = measure(args.package)
    print(table(traits))
    if args.list:
        print("\nfunctions over 100 lines:", *traits["functions_over_100"], sep="\n  ")
        print("\nimports inside functions outside cli/:", *traits["lazy_imports_outside_cli"], sep="\n  ")
        print("\nassert statements:", *traits["asserts"], sep="\n  ")
        print("\nMAX_* limits:", *traits["max_limits"], sep="\n  ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
