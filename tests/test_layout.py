"""The house (DESIGN.md section 2): imports only point down, no circle, no lazy import of our own that dodges one."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _graph_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("import_graph", module)
    spec.loader.exec_module(module)
    return module


graph_of = _graph_module()
GRAPH = graph_of.build()

FRAMEWORKS = ("langchain", "langchain_core", "langgraph", "llama_index", "dify_plugin")
"""Host frameworks: imported only by the adapters that serve them."""


def test_no_circle_among_files_counting_function_level_imports() -> None:
    """No two modules of ours import each other, directly or around a circle, at module level or inside a function."""
    assert graph_of.circles(GRAPH.file_arrows()) == []


def test_no_circle_among_rooms() -> None:
    """No two rooms (top-level modules, first-level packages) import each other, directly or around a circle."""
    assert graph_of.circles(GRAPH.room_arrows()) == []


def test_every_room_has_a_floor_and_imports_only_point_down() -> None:
    """Each room sits on a floor of the house, and imports only rooms on lower floors."""
    rooms = {GRAPH.room(module) for module in GRAPH.modules}
    assert rooms - set(graph_of.FLOORS) == set(), "place new rooms in scripts/import_graph.py FLOORS"
    upward = [(a, b) for a, b in GRAPH.room_arrows() if graph_of.FLOORS[a] <= graph_of.FLOORS[b]]
    assert upward == []


def test_lazy_imports_of_our_own_load_an_optional_extra_only() -> None:
    """A function-level import of our own is allowed only where it loads an optional extra (framework, grpc, NumPy)."""
    lazy = {(i.source, i.target) for i in GRAPH.imports if i.lazy}
    assert lazy - graph_of.LAZY_EXTRAS == set()


def test_the_library_never_imports_a_transport_at_import_time() -> None:
    """``reach_plugins`` reaches ``transports.*`` only lazily (the default transport inside a constructor)."""
    eager = [
        (i.source, i.target)
        for i in GRAPH.imports
        if i.source.startswith("reach_plugins") and i.target.startswith("transports") and not i.lazy
    ]
    assert eager == []


def test_framework_neutral_modules_import_no_framework() -> None:
    """Only the adapters (frameworks/, the agent SDK's LangGraph and LlamaIndex servers) and the demo import a host."""
    hosts = graph_of.foreign_imports(FRAMEWORKS)
    allowed = (
        "reach_plugins.frameworks.",
        "reach_plugins.agent.langgraph",
        "reach_plugins.agent.llamaindex",
        "reach_plugins.demo.",
    )

    outside = sorted(module for module in hosts if not module.startswith(allowed))
    assert outside == []
