"""The import graph of the library: files, rooms, arrows, circles and function-level imports.

A room is a top-level module or a first-level package of ``reach_plugins`` (``transports.<leaf>`` for the client
transports). Every own import counts, at module level or inside a function; imports under ``if TYPE_CHECKING:``
do not (they never run). ``python scripts/import_graph.py`` prints the figures; ``--json`` prints them as JSON.
"""

from __future__ import annotations

import ast
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("reach_plugins", "transports")

FLOORS: dict[str, int] = {
    # the house from the ground up (DESIGN.md section 2): a room imports only rooms on lower floors
    **dict.fromkeys(
        [
            "reach_plugins.errors",
            "reach_plugins.ids",
            "reach_plugins.jsonsafe",
            "reach_plugins.units",
            "reach_plugins.clock",
            "reach_plugins.testing",
        ],
        0,
    ),
    **dict.fromkeys(["reach_plugins.endpoints", "reach_plugins.media"], 1),
    "reach_plugins.model": 2,
    **dict.fromkeys(["reach_plugins.transport", "reach_plugins.matching", "reach_plugins.telemetry"], 3),
    **dict.fromkeys(["reach_plugins.policy", "reach_plugins.config"], 4),
    **dict.fromkeys(["reach_plugins.wire", "reach_plugins.registry", "reach_plugins.stores"], 5),
    **dict.fromkeys(
        [
            "reach_plugins.routing",
            "reach_plugins.security",
            "reach_plugins.protocols",
            "reach_plugins.attempts",
            "transports.grpcnode",
        ],
        6,
    ),
    "transports.direct": 7,
    **dict.fromkeys(["reach_plugins.client", "reach_plugins.server", "transports.gateway"], 8),
    **dict.fromkeys(["reach_plugins.agent", "reach_plugins.gateway"], 9),
    **dict.fromkeys(["reach_plugins.frameworks", "reach_plugins.node"], 10),
    **dict.fromkeys(
        [
            "reach_plugins",
            "reach_plugins.demo",
            "reach_plugins.langchain",
            "reach_plugins.llamaindex",
            "reach_plugins.dify",
            "reach_plugins.fleet",
        ],
        11,
    ),
    "reach_plugins.cli": 12,
}
"""Each room's floor. A new room gets a floor here (the layout test refuses an unplaced room)."""

LAZY_EXTRAS: frozenset[tuple[str, str]] = frozenset(
    {
        # an optional extra loaded on first use: the demo, the server stack, grpc, NumPy, dify-plugin
        ("reach_plugins.cli", "reach_plugins.demo"),
        ("reach_plugins.cli", "reach_plugins.gateway"),
        ("reach_plugins.cli", "reach_plugins.gateway.workers"),
        ("reach_plugins.cli", "reach_plugins.node"),
        ("reach_plugins.cli", "reach_plugins.server.issuer_server"),
        ("reach_plugins.frameworks.dify", "reach_plugins.frameworks.dify.plugin"),
        ("reach_plugins.matching", "reach_plugins.matching.minilm"),
        ("reach_plugins.matching.embedders", "reach_plugins.matching.minilm"),
        ("reach_plugins.node.server", "reach_plugins.telemetry.prometheus"),
        # a transport, chosen when a constructor is given none (DESIGN.md 2.1), or the next hop's
        ("reach_plugins.client.client", "transports.direct"),
        ("reach_plugins.frameworks.dify.hook", "transports.gateway"),
        ("reach_plugins.server.forwarder", "transports.direct"),
        ("reach_plugins.server.forwarder", "transports.grpcnode"),
        ("reach_plugins.server.issuer_role", "transports.direct"),
        # the alternative HTTP engine, imported only by who asks for it
        ("transports.direct.engine", "transports.direct.engine_httpx"),
    }
)
"""Function-level imports of our own that are allowed: each loads an optional extra or a chosen transport."""


@dataclass(frozen=True, slots=True)
class Import:
    """One own import: where it is written, what it names, and whether it runs inside a function."""

    source: str
    target: str
    line: int
    lazy: bool


@dataclass(slots=True)
class Graph:
    """Modules of the tree and the own imports between them."""

    modules: dict[str, Path] = field(default_factory=dict)
    imports: list[Import] = field(default_factory=list)

    def room(self, module: str) -> str:
        """The room of a module: ``reach_plugins.x`` for ``reach_plugins.x.y``, ``transports.direct`` likewise."""
        parts = module.split(".")
        return ".".join(parts[:2]) if len(parts) > 1 else parts[0]

    def file_arrows(self) -> set[tuple[str, str]]:
        return {(i.source, i.target) for i in self.imports if i.source != i.target}

    def room_arrows(self) -> set[tuple[str, str]]:
        arrows = {(self.room(a), self.room(b)) for a, b in self.file_arrows()}
        return {(a, b) for a, b in arrows if a != b}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, lazy: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                yield from _walk(other, lazy)
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, lazy
        inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        yield from _walk(child, inner)


def _resolve(graph: Graph, name: str) -> str | None:
    """The module of the tree that an imported dotted name lands in (a name inside a module counts as it)."""
    while name:
        if name in graph.modules:
            return name
        name = name.rpartition(".")[0]
    return None


def build(root: Path = ROOT) -> Graph:
    graph = Graph()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            graph.modules[module_name(path)] = path
    for module, path in graph.modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        is_package = path.name == "__init__.py"
        for node, lazy in _walk(tree, False):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = module.split(".")
                    drop = node.level - 1 if is_package else node.level
                    anchor = anchor[: len(anchor) - drop] if drop else anchor
                    base = ".".join([*anchor, base]) if base else ".".join(anchor)
                names = [f"{base}.{alias.name}" for alias in node.names] or [base]
            for name in names:
                target = _resolve(graph, name)
                if target is not None and target != module:
                    graph.imports.append(Import(module, target, node.lineno, lazy))
    return graph


def circles(arrows: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    edges: dict[str, list[str]] = {}
    for a, b in arrows:
        edges.setdefault(a, []).append(b)
        edges.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    sys.setrecursionlimit(10_000)

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def foreign_imports(prefixes: tuple[str, ...], root: Path = ROOT) -> set[str]:
    """Our modules that import a foreign top-level package named in ``prefixes`` (anywhere in the file)."""
    found = set()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node, _lazy in _walk(tree, False):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if not (isinstance(node, ast.ImportFrom) and node.level) and any(
                    name.split(".")[0] in prefixes for name in names
                ):
                    found.add(module_name(path))
    return found


def figures(graph: Graph) -> dict[str, object]:
    rooms = {graph.room(m) for m in graph.modules}
    return {
        "files": len(graph.modules),
        "rooms": len(rooms),
        "arrows between rooms": len(graph.room_arrows()),
        "circles among files": circles(graph.file_arrows()),
        "circles among rooms": circles(graph.room_arrows()),
        "function-level own imports": sum(1 for i in graph.imports if i.lazy),
    }


def main() -> None:
    graph = build()
    result = figures(graph)
    if "--json" in sys.argv:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        if isinstance(value, list):
            print(f"{key}: {len(value)}")
            for component in value:
                print(f"  {len(component)}: {', '.join(component)}")
        else:
            print(f"{key}: {value}")
    if "--lazy" in sys.argv:
        for i in graph.imports:
            if i.lazy:
                print(f"  lazy {i.source}:{i.line} -> {i.target}")


if __name__ == "__main__":
    main()
