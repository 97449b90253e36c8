"""SyncReachClient: the blocking API, with a client, a pipeline and pools of its own on a private loop.

httpx has ``Client`` and ``AsyncClient``; we have :class:`SyncReachClient` and
:class:`~reach_plugins.client.client.ReachClient`. Driving one async client from two
event loops shares the core's waiting primitives across loops (a twin call
then waits its whole deadline), so the blocking client never does: every call
runs on its own loop, on a daemon thread, usable from plain code and from a
thread that already runs a loop (Jupyter, a framework's sync tool call).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any, Self, Unpack

from reach_plugins.client.broadcast import BroadcastResult
from reach_plugins.client.client import BroadcastOptions, ReachClient, ReachOptions
from reach_plugins.client.syncbridge import SyncBridge
from reach_plugins.model import ReachRequest, ReachResponse
from reach_plugins.routing.route import Route
from reach_plugins.transport import StreamEvent


class SyncReachClient:
    """Blocking :class:`ReachClient`: the same constructor arguments and call keywords, answers returned."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._bridge = SyncBridge()
        self.client = ReachClient(*args, **kwargs)
        """The async client this one drives, only ever on its private loop (:attr:`bridge`)."""

    @classmethod
    def wrap(cls, client: ReachClient) -> SyncReachClient:
        """Drive a ready async ``client`` from now on on a private loop (it must not be in use on another loop)."""
        blocking = cls.__new__(cls)
        blocking._bridge, blocking.client = SyncBridge(), client
        return blocking

    @property
    def bridge(self) -> SyncBridge:
        """The private loop every call of this client runs on."""
        return self._bridge

    def request(
        self, capability: str, payload: Mapping[str, Any] | None = None, **options: Unpack[ReachOptions]
    ) -> ReachRequest:
        """The :class:`ReachRequest` :meth:`reach` would send."""
        return self.client.request(capability, payload, **options)

    def reach(
        self,
        capability: str,
        payload: Mapping[str, Any] | None = None,
        *,
        trace: bool = False,
        **options: Unpack[ReachOptions],
    ) -> ReachResponse:
        """Blocking :meth:`ReachClient.reach`: raises when nothing was sent, else returns the response."""
        return self._bridge.run(self.client.reach(capability, payload, trace=trace, **options))

    def send(self, request: ReachRequest, *, trace: bool = False) -> ReachResponse:
        """Blocking :meth:`ReachClient.send` of a prepared request."""
        return self._bridge.run(self.client.send(request, trace=trace))

    def broadcast(
        self, capability: str, payload: Mapping[str, Any] | None = None, **options: Unpack[BroadcastOptions]
    ) -> BroadcastResult:
        """Blocking :meth:`ReachClient.broadcast`."""
        return self._bridge.run(self.client.broadcast(capability, payload, **options))

    def candidates(self, request: ReachRequest, *, limit: int | None = None) -> list[Route]:
        """Blocking :meth:`ReachClient.candidates`: asked on the private loop, where the router lives."""
        return self._bridge.run(self.client.candidates(request, limit=limit))

    def close_session(self, session_id: str) -> None:
        """Blocking :meth:`ReachClient.close_session`."""
        self._bridge.run(self.client.close_session(session_id))

    def stream(
        self, capability: str, payload: Mapping[str, Any] | None = None, **options: Unpack[ReachOptions]
    ) -> Iterator[StreamEvent]:
        """Blocking :meth:`ReachClient.stream`: events as they arrive; leaving the loop early closes the stream."""
        events = self.client.stream(capability, payload, **options)
        try:
            while True:
                try:
                    yield self._bridge.run(anext(events))
                except StopAsyncIteration:
                    return
        finally:
            self._bridge.run(events.aclose())

    def close(self) -> None:
        """Close the client (pools, what it opened from URLs), then stop the private loop."""
        try:
            self._bridge.run(self.client.aclose())
        finally:
            self._bridge.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
