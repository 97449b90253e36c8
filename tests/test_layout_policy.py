"""policy/ is sans-IO: none of its files, nor any of our modules they import, imports an event loop or a network stack.

The closure follows the import graph of ``scripts/import_graph.py`` (module level and inside
functions, ``TYPE_CHECKING`` blocks aside); a package's ``__init__`` is not counted for its
submodules (the package root is the flat re-export surface).
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
BANNED = ("asyncio", "anyio", "aiohttp", "grpc", "trio", "httpx", "uvicorn", "starlette")


def _import_graph() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("import_graph", module)
    spec.loader.exec_module(module)
    return module


def _external(path: Path, graph: ModuleType) -> set[tuple[str, int]]:
    """Every imported top-level name outside our packages, with its line (``TYPE_CHECKING`` blocks aside)."""
    found: set[tuple[str, int]] = set()
    for node, _lazy in graph._walk(ast.parse(path.read_text(encoding="utf-8")), False):
        if isinstance(node, ast.Import):
            found.update((alias.name.partition(".")[0], node.lineno) for alias in node.names)
        elif node.level == 0 and node.module:
            found.add((node.module.partition(".")[0], node.lineno))
    return found


def _closure(graph_module: ModuleType) -> tuple[set[str], dict[str, object]]:
    graph = graph_module.build(ROOT)
    start = {name for name in graph.modules if name.startswith("reach_plugins.policy.")}
    seen, todo = set(start), list(start)
    while todo:
        module = todo.pop()
        for arrow in graph.imports:
            if arrow.source == module and arrow.target not in seen:
                seen.add(arrow.target)
                todo.append(arrow.target)
    return seen, graph.modules


def test_policy_and_what_it_imports_never_import_an_event_loop_or_a_network_stack() -> None:
    """No module under reach_plugins/policy/, nor one it imports (transitively), imports asyncio, aiohttp, grpc...."""
    graph_module = _import_graph()
    closure, modules = _closure(graph_module)
    assert "reach_plugins.policy.breaker" in closure
    offending = sorted(
        f"{module}:{line} imports {name}"
        for module in closure
        for name, line in _external(modules[module], graph_module)  # type: ignore[arg-type]
        if name in BANNED
    )
    assert offending == []
