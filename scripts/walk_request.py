"""Walk one request through the library and count where control goes: stays, rooms, returns.

Control is followed from ``Pipeline.run`` to its end with ``sys.setprofile``: every call into and every return to
a function of ``reach_plugins`` or ``transports`` moves control to that function's room (a top-level module or a
first-level package). A *stay* is a run of consecutive moments in one room; a *return* is a stay in a room that
control had already left. Frames of other libraries (pydantic, asyncio) leave control where it was.

The request: a reach with a session id and an idempotency key, through a ``MockTransport`` to one agent (the
second such call: the first one warms the caches).
``python scripts/walk_request.py [--files] [--leaves] [--path]``: files instead of rooms; count calls that call
none of ours as stays of their own; print the path.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("reach_plugins", "transports")


def place(frame: FrameType | None, files: bool) -> str | None:
    """The room (or file) of ``frame``'s code, ``None`` outside our packages."""
    if frame is None:
        return None
    try:
        rel = Path(frame.f_code.co_filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    if rel.parts[0] not in PACKAGES:
        return None
    if files:
        return str(rel)
    depth = 3 if rel.parts[0] == "transports" else 2
    if len(rel.parts) > depth - 1 and not rel.parts[depth - 1].endswith(".py"):
        return "/".join(rel.parts[:depth])
    return str(rel)


class Node:
    """One activation of one of our functions (a coroutine's resumption is an activation of its own)."""

    __slots__ = ("children", "where")

    def __init__(self, where: str | None) -> None:
        self.where = where
        self.children: list[Node] = []


class Walk:
    """The activations of our functions while a ``Pipeline.run`` frame was active, as a call tree."""

    def __init__(self, files: bool, leaves: bool) -> None:
        self.files = files
        self.leaves = leaves
        self.inside = 0
        self.root = Node(None)
        self.stack: list[Node] = [self.root]

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        is_run = frame.f_code.co_name == "run" and frame.f_code.co_filename.endswith("pipeline.py")
        if event == "call":
            self.inside += is_run
            if self.inside:
                node = Node(place(frame, self.files))
                self.stack[-1].children.append(node)
                self.stack.append(node)
        elif event == "return" and self.inside:
            if len(self.stack) > 1:
                self.stack.pop()
            self.inside -= is_run

    def stays(self) -> list[str]:
        """Where control is, moment by moment; a call that calls none of ours stays in its caller's room
        (reading a clock or a pure rule is a step of the caller) unless ``leaves`` counts those too."""
        out: list[str] = []

        def at(where: str | None) -> None:
            if where is not None and (not out or out[-1] != where):
                out.append(where)

        def visit(node: Node, here: str | None) -> None:
            own = node.where or here
            if not node.children and not self.leaves:
                own = here or own
            at(own)
            for child in node.children:
                visit(child, own)
                at(own)

        for child in self.root.children:
            visit(child, None)
        return out

    def figures(self) -> dict[str, Any]:
        stays = self.stays()
        seen: set[str] = set()
        returns = 0
        for where in stays:
            returns += where in seen
            seen.add(where)
        entered = Counter(stays)
        return {"stays": len(stays), "rooms": len(seen), "returns": returns, "entered": entered.most_common(5)}


async def reach_once(files: bool, leaves: bool) -> Walk:
    from reach_plugins import AgentDescriptor, Capability, Instance, ReachClient
    from reach_plugins.registry.memory import MemoryRegistry
    from reach_plugins.transport import MockTransport

    registry = MemoryRegistry()
    capability = Capability(name="query_order", idempotency_key="${params.order_id}")
    await registry.register_agent(AgentDescriptor(name="orders", capabilities=[capability]))
    await registry.register_instance(Instance(agent="orders", instance_id="orders-1", endpoint="http://127.0.0.1:1"))
    walk = Walk(files, leaves)
    async with ReachClient(registry=registry, transport=MockTransport(lambda call: {"status": "shipped"})) as client:
        await client.reach("query_order", {"order_id": "A0"}, session_id="s-1")
        sys.setprofile(walk.profile)
        try:
            await client.reach("query_order", {"order_id": "A1"}, session_id="s-1")
        finally:
            sys.setprofile(None)
    return walk


def main() -> None:
    files = "--files" in sys.argv
    walk = asyncio.run(reach_once(files, "--leaves" in sys.argv))
    result = walk.figures()
    print(f"stays {result['stays']}, {'files' if files else 'rooms'} {result['rooms']}, returns {result['returns']}")
    print("entered most:", ", ".join(f"{where} x{count}" for where, count in result["entered"]))
    if "--path" in sys.argv:
        print(" -> ".join(walk.stays()))


if __name__ == "__main__":
    main()
