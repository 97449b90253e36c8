"""Media parts (images, audio, blobs) cross direct HTTP, the gateway and the node byte for byte, within their limit."""

from __future__ import annotations

import base64
import json
import os
import struct
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from hop_support import TOKENS, write_config
from transport_conformance import make_call

from reach_plugins import MediaPart, ReachClient, errors
from reach_plugins.agent import BackgroundServer, ReachAgent, ReachContext, WithMedia
from reach_plugins.gateway import create_app
from reach_plugins.media import parts_from_wire
from reach_plugins.model import AgentDescriptor
from reach_plugins.node import build_node
from reach_plugins.protocols.a2a_files import file_part, media_of_parts
from reach_plugins.protocols.base import HttpResponse
from reach_plugins.protocols.mcp import McpAdapter
from reach_plugins.protocols.openai import OpenAIAdapter
from reach_plugins.registry import MemoryRegistry
from reach_plugins.transport import Call, Transport
from transports.direct import DirectTransport
from transports.gateway import GatewayTransport
from transports.grpcnode import GrpcNodeTransport

LIMIT = 2 << 20
"""The ``echo_media`` capability's ``max_media_bytes`` (2 MiB): a 1 MB blob fits, 3 MiB does not."""
DRAWN = 1 << 16
"""The ``draw`` capability's ``max_media_bytes``: its reply carries a small PNG."""


def png(width: int = 4, height: int = 3) -> bytes:
    """A real PNG (RGB, every pixel red), built from its chunks."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def studio() -> ReachAgent:
    """An agent that returns the media it got, reversed in order, with a summary of what it saw."""
    agent = ReachAgent("studio", tokens="open")

    @agent.capability("echo_media", max_media_bytes=LIMIT)
    def echo_media(note: str, media: list[MediaPart], ctx: ReachContext) -> WithMedia:
        seen = [{"type": part.media_type, "size": part.size, "name": part.name} for part in media]
        assert [part.size for part in ctx.media] == [part.size for part in media]
        return WithMedia(data={"note": note, "seen": seen}, media=tuple(reversed(media)))

    @agent.capability("draw", max_media_bytes=DRAWN)
    def draw() -> MediaPart:
        return MediaPart(media_type="image/png", data=png(2, 2), name="dot.png")

    @agent.capability("note")
    def note(text: str = "") -> dict[str, str]:
        return {"text": text}

    @agent.capability("film", max_media_bytes=LIMIT)
    async def film(size: int) -> AsyncIterator[str | MediaPart]:
        yield "before"
        yield MediaPart(media_type="image/x-raw", data=BLOB[:size], name="frame.raw")
        yield "after"

    return agent


BLOB = os.urandom(3 << 20)
"""What ``film`` streams the first ``size`` bytes of, between two text events."""


@contextmanager
def served() -> Iterator[str]:
    with BackgroundServer(studio().app) as server:
        yield server.url


TENANTS = {"demo": {"token_env": "DEMO_TOKEN", "agents": "*", "networks": ["127.0.0.0/8"]}}
Route = Callable[[Path], AbstractAsyncContextManager[Callable[[], Transport]]]


@asynccontextmanager
async def _direct(config: Path) -> AsyncIterator[Callable[[], Transport]]:
    yield DirectTransport


@asynccontextmanager
async def _gateway(config: Path) -> AsyncIterator[Callable[[], Transport]]:
    with BackgroundServer(create_app(config, environ=TOKENS), proxy_headers=False) as server:
        yield lambda: GatewayTransport(server.url, token=TOKENS["DEMO_TOKEN"])


@asynccontextmanager
async def _node(config: Path) -> AsyncIterator[Callable[[], Transport]]:
    async with build_node(config, environ=TOKENS) as node:
        yield lambda: GrpcNodeTransport(node.target, token=TOKENS["DEMO_TOKEN"])


TRANSPORTS: dict[str, Route] = {"direct": _direct, "gateway": _gateway, "node": _node}


@asynccontextmanager
async def client_over(
    transport: str, tmp_path: Path, *, film_limit: int = LIMIT, url: str | None = None
) -> AsyncIterator[ReachClient]:
    """A client of tenant demo reaching the studio agent (or the server at ``url``) over ``transport``; the
    config (the client's, the gateway's, the node's) declares ``film_limit`` for ``film``."""
    with served() if url is None else nullcontext(url) as url:
        capabilities = [
            {"name": "echo_media", "max_media_bytes": LIMIT},
            {"name": "draw", "max_media_bytes": DRAWN},
            "note",
            {"name": "film", "max_media_bytes": film_limit},
        ]
        config = write_config(
            tmp_path / "agents.yaml", {"studio": {"endpoints": [url], "capabilities": capabilities}}, TENANTS
        )
        async with TRANSPORTS[transport](config) as make, ReachClient(f"file://{config}", make(), tenant="demo") as c:
            yield c


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
async def test_an_image_and_a_1_mb_blob_come_back_byte_for_byte(tmp_path: Path, transport: str) -> None:
    """A PNG and 1 MB of random bytes sent as media parts return unchanged, in the handler's order, over each."""
    image, blob = png(), os.urandom(1_000_000)
    sent = [
        MediaPart(media_type="image/png", data=image, name="red.png"),
        MediaPart(media_type="application/octet-stream", data=blob),
        MediaPart(media_type="audio/wav", url="http://127.0.0.1:9/clip.wav"),
    ]
    async with client_over(transport, tmp_path) as client:
        response = (await client.reach("echo_media", {"note": "hi"}, media=sent, timeout_ms=10_000)).raise_for_status()
        drawn = (await client.reach("draw", timeout_ms=5000)).raise_for_status()
    assert response.data["seen"] == [
        {"type": "image/png", "size": len(image), "name": "red.png"},
        {"type": "application/octet-stream", "size": 1_000_000, "name": None},
        {"type": "audio/wav", "size": 0, "name": None},
    ]
    assert response.media == list(reversed(sent))
    assert response.media[1].data == blob and response.media[2].data == image
    assert drawn.data is None and [p.data for p in drawn.media] == [png(2, 2)]


@pytest.mark.parametrize("size", [LIMIT + 1, 3 << 20])
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
async def test_media_over_the_capability_limit_is_refused_by_name(tmp_path: Path, transport: str, size: int) -> None:
    """Past a capability's 2 MiB, MediaTooLarge names the limit and max_media_bytes over each transport: one byte
    over (the agent counts the base64 text before decoding it), or a body past its read bound (never read whole)."""
    big = MediaPart(media_type="application/octet-stream", data=os.urandom(size))
    async with client_over(transport, tmp_path) as client:
        attempts = []
        with pytest.raises(errors.MediaTooLarge) as raised:  # the gateway refuses past its own bound itself
            response = await client.reach("echo_media", {"note": "big"}, media=[big], timeout_ms=10_000)
            attempts.append(response.attempts)
            response.raise_for_status()
    assert str(LIMIT) in raised.value.message and "max_media_bytes" in raised.value.message
    assert attempts in ([], [1])


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
async def test_a_capability_that_declared_no_media_refuses_it_by_name(tmp_path: Path, transport: str) -> None:
    """Media is opted into: a capability without ``max_media_bytes`` refuses even a small image over each
    transport, saying to declare it, and its payload-only calls still succeed."""
    async with client_over(transport, tmp_path) as client:
        refused = await client.reach("note", {"text": "x"}, media=[MediaPart(media_type="image/png", data=png())])
        with pytest.raises(errors.MediaTooLarge, match="declare max_media_bytes"):
            refused.raise_for_status()
        plain = (await client.reach("note", {"text": "x"})).raise_for_status()
    assert plain.data == {"text": "x"}


def test_a_server_without_media_capabilities_reads_bodies_of_1_mib_at_most(tmp_path: Path) -> None:
    """With no capability declaring media, the agent's and the gateway's reach bodies are bound by 1 MiB."""
    agent = ReachAgent("plain", tokens="open")

    @agent.capability("note")
    def note(text: str = "") -> dict[str, str]:
        return {"text": text}

    config = write_config(tmp_path / "agents.yaml", {"plain": {"endpoints": ["http://127.0.0.1:9"]}}, TENANTS)
    bodies = {"agent": agent.app, "gateway": create_app(config, environ=TOKENS)}
    for name, app in bodies.items():
        with BackgroundServer(app, proxy_headers=False) as server:
            over = httpx.post(
                f"{server.url}/reach" if name == "agent" else f"{server.url}/v1/reach",
                content=b"{" + b" " * (1 << 20) + b"}",
                headers={
                    "Content-Type": "application/json",
                    "Authorization": f"Bearer {TOKENS['DEMO_TOKEN']}",
                    "X-Tenant": "demo",
                },
            )
        assert over.status_code == 413, (name, over.text)
        assert "media" not in over.json()["error"]["message"], name


def test_a_size_is_checked_before_any_base64_is_decoded() -> None:
    """Parts whose base64 text says more bytes than the limit are refused even when the text is not base64."""
    with pytest.raises(errors.MediaTooLarge, match="at most 10"):
        parts_from_wire([{"media_type": "image/png", "data": "!" * 40}], limit=10, capability="c")
    with pytest.raises(errors.RequestError, match=r"media\.0\.data: not base64"):
        parts_from_wire([{"media_type": "image/png", "data": "!" * 8}], limit=10, capability="c")


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"media_type": "image/png"}, "exactly one of 'data'"),
        ({"media_type": "image/png", "data": b"x", "url": "http://127.0.0.1/x"}, "exactly one of 'data'"),
        ({"media_type": "image/png", "url": "file:///etc/passwd"}, "http:// or https://"),
        ({"media_type": "image/png", "url": "http://u:p@127.0.0.1/x"}, "no user:password@"),
        ({"media_type": "PNG", "data": b"x"}, "String should match pattern"),
    ],
)
def test_a_bad_part_is_refused_with_what_to_fix(fields: dict[str, Any], problem: str) -> None:
    """A part with no source, two sources, a non-web URL, credentials in it or no type/subtype is refused."""
    with pytest.raises(ValueError, match=problem):
        MediaPart(**fields)


# --------------------------------------------------------------------------- the peers' shapes


async def test_a2a_file_parts_round_trip_through_an_sdk_agent(tmp_path: Path) -> None:
    """Over A2A (a ``protocol: a2a`` client to the SDK's A2A server), media go as file parts and come back so."""
    image, blob = png(), os.urandom(200_000)
    sent = [MediaPart(media_type="image/png", data=image, name="red.png"), MediaPart(media_type="audio/wav", data=blob)]
    with served() as url:
        agent = AgentDescriptor(name="studio", protocol="a2a", endpoints=[url], capabilities=["echo_media"])
        registry = MemoryRegistry()
        registry.put_agent(agent)
        async with ReachClient(registry, DirectTransport(), tenant="demo") as client:
            response = await client.reach("echo_media", {"note": "hi"}, media=sent, timeout_ms=10_000)
    response.raise_for_status()
    assert response.media == list(reversed(sent))
    assert '"seen"' in response.data["reply_content"] and "red.png" in response.data["reply_content"]


@pytest.mark.parametrize("dialect", ["1.0", "0.3"])
def test_a2a_file_parts_of_either_dialect_read_back_as_the_parts_written(dialect: Literal["1.0", "0.3"]) -> None:
    """A part by value and one by URL, written as file parts of a dialect, read back equal (text parts skipped)."""
    parts = [MediaPart(media_type="image/png", data=png(), name="a.png"), MediaPart(media_type="text/csv", url=CSV)]
    written = [{"text": "hello"}, *(file_part(part, dialect) for part in parts)]
    assert media_of_parts(written) == parts


CSV = "http://127.0.0.1:9/table.csv"


def _mcp_call() -> Call:
    return make_call("http://127.0.0.1:9/mcp", "render", {"prompt": "a dot"})


def _mcp_reply(content: list[dict[str, Any]]) -> HttpResponse:
    body = {"jsonrpc": "2.0", "id": 1, "result": {"content": content, "isError": False}}
    return HttpResponse(200, {"Content-Type": "application/json"}, json.dumps(body).encode())


def test_mcp_image_audio_and_resource_content_become_media_parts() -> None:
    """A tools/call result's image, audio, blob resource and http resource_link items are the reply's media."""
    image, sound, blob = png(), os.urandom(300), os.urandom(50)
    content = [
        {"type": "text", "text": "here"},
        {"type": "image", "data": base64.b64encode(image).decode(), "mimeType": "image/png"},
        {"type": "audio", "data": base64.b64encode(sound).decode(), "mimeType": "audio/wav"},
        {"type": "resource", "resource": {"uri": "file:///x.bin", "mimeType": "application/zip", "blob": b64(blob)}},
        {"type": "resource", "resource": {"uri": "file:///notes.txt", "mimeType": "text/plain", "text": "notes"}},
        {"type": "resource_link", "uri": CSV, "name": "table", "mimeType": "text/csv"},
    ]
    reply = McpAdapter().parse(_mcp_call(), _mcp_reply(content))
    assert reply.status == "success" and reply.data["reply_content"] == "here"
    assert [(p.media_type, p.data, p.url, p.name) for p in reply.media] == [
        ("image/png", image, None, None),
        ("audio/wav", sound, None, None),
        ("application/zip", blob, None, "file:///x.bin"),
        ("text/csv", None, CSV, "table"),
    ]


def test_mcp_content_with_bytes_that_are_not_base64_is_an_invalid_response() -> None:
    """An image item whose data is not base64 is refused as an invalid response naming the item."""
    with pytest.raises(errors.InvalidResponse, match=r"content\[0\] \(image\)"):
        McpAdapter().parse(_mcp_call(), _mcp_reply([{"type": "image", "data": "not base64!", "mimeType": "image/png"}]))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_openai_content_parts_carry_media_and_reply_audio_comes_back_as_media() -> None:
    """Request media are image_url (data: URL or URL), input_audio and file parts of the user's message after its
    text; a reply's audio is a media part."""
    image, sound, pdf = png(), os.urandom(400), os.urandom(100)
    media = [
        MediaPart(media_type="image/png", data=image),
        MediaPart(media_type="image/jpeg", url="https://127.0.0.1/cat.jpg"),
        MediaPart(media_type="audio/wav", data=sound),
        MediaPart(media_type="application/pdf", data=pdf, name="spec.pdf"),
    ]
    call = make_call("http://127.0.0.1:9/v1", "describe", {"query": "what is this?"}, media=media)
    sent = json.loads(OpenAIAdapter().build(call).body)
    assert sent["messages"][-1]["content"] == [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(image)}"}},
        {"type": "image_url", "image_url": {"url": "https://127.0.0.1/cat.jpg"}},
        {"type": "input_audio", "input_audio": {"data": b64(sound), "format": "wav"}},
        {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{b64(pdf)}", "filename": "spec.pdf"}},
    ]
    message = {"role": "assistant", "content": None, "audio": {"id": "a1", "data": b64(sound), "format": "wav"}}
    body = {"id": "c1", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    reply = OpenAIAdapter().parse(call, HttpResponse(200, {}, json.dumps(body).encode()))
    assert reply.status == "success" and [(p.media_type, p.data) for p in reply.media] == [("audio/wav", sound)]


async def test_the_same_key_with_other_media_is_a_conflict_not_a_replay() -> None:
    """An idempotency key names its media too: resent with the same image it replays, with another it conflicts."""
    first, other = MediaPart(media_type="image/png", data=png()), MediaPart(media_type="image/png", data=png(5, 5))
    with served() as url:
        registry = MemoryRegistry()
        registry.put_agent(AgentDescriptor(name="studio", endpoints=[url], capabilities=["echo_media"]))
        async with ReachClient(registry, DirectTransport(), tenant="demo") as client:
            sent = await client.reach("echo_media", {"note": "a"}, media=[first], idempotency_key="k-1")
            again = await client.reach("echo_media", {"note": "a"}, media=[first], idempotency_key="k-1")
            with pytest.raises(errors.IdempotencyConflict):
                await client.reach("echo_media", {"note": "a"}, media=[other], idempotency_key="k-1")
    assert sent.ok and again.media == sent.media == [first]
