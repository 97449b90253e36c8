"""The shared transport suite, run against each DirectTransport engine and a caller's own httpx client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from transport_conformance import TransportConformance

from transports.direct import DirectTransport


class TestAiohttpEngine(TransportConformance):
    """The default engine."""

    @pytest.fixture
    async def transport(self) -> AsyncIterator[DirectTransport]:
        async with DirectTransport() as transport:
            yield transport


class TestHttpxEngine(TransportConformance):
    """The httpx engine, with clients built from each agent's pool settings."""

    @pytest.fixture
    async def transport(self) -> AsyncIterator[DirectTransport]:
        async with DirectTransport(engine="httpx") as transport:
            yield transport


class TestCallersHttpxClient(TransportConformance):
    """A caller's own httpx client: its pool and settings are the caller's."""

    @pytest.fixture
    async def transport(self) -> AsyncIterator[DirectTransport]:
        limits = httpx.Limits(max_connections=2)
        async with httpx.AsyncClient(limits=limits) as client, DirectTransport(client=client) as transport:
            yield transport
