"""No import circle inside ``dcut_sched/integrations``; the vLLM plugin never imports its tools.

The graph is analysis/arch_traits.py's (read with ``ast``: every import, lazy ones included, since a
lazy import still closes a circle when it runs), restricted to ``dcut_sched.integrations``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "dcut_sched.integrations"
_spec = importlib.util.spec_from_file_location("arch_traits", ROOT / "analysis" / "arch_traits.py")
arch_traits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(arch_traits)


def _integrations_graph() -> dict[str, set[str]]:
    inside = lambda m: m == PACKAGE or m.startswith(PACKAGE + ".")  # noqa: E731
    return {m: {t for t in targets if inside(t)} for m, targets in arch_traits.import_graph().items() if inside(m)}


def test_no_import_circle_inside_integrations():
    graph = _integrations_graph()
    assert "dcut_sched.integrations.vllm.scheduler" in graph and "dcut_sched.integrations.vllm_tools.run" in graph
    assert arch_traits.cycles(graph) == []


def test_the_plugin_never_imports_the_tools():
    graph = _integrations_graph()
    plugin = [m for m in graph if m.startswith("dcut_sched.integrations.vllm.") or m == "dcut_sched.integrations.vllm"]
    assert len(plugin) >= 7
    for m in plugin:
        assert not any(t.startswith("dcut_sched.integrations.vllm_tools") for t in graph[m]), (m, graph[m])
    assert "dcut_sched.integrations.vllm.hooks" in graph["dcut_sched.integrations.vllm.scheduler"]  # edges are seen


def test_circles_are_found():
    assert arch_traits.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert arch_traits.cycles({"a": {"b"}, "b": set()}) == []
