"""Media parts in a streamed reply travel in chunks over direct SSE, the gateway and the node, within their limit."""

from __future__ import annotations

import base64
import json
import socket
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from hop_support import write_config
from raw_upstream import RawUpstream
from test_gateway_mcp_features import call, session
from test_multimodal import BLOB, LIMIT, TENANTS, TRANSPORTS, b64, client_over, png, studio

from reach_plugins import MediaPart, ReachClient, errors
from reach_plugins.agent import BackgroundServer
from reach_plugins.gateway import create_app
from reach_plugins.protocols.mcp_media import content_of_media, media_of_content
from reach_plugins.transport import StreamEvent
from reach_plugins.wire.media_stream import CHUNK_BYTES, MediaAssembler, sse_frames
from reach_plugins.wire.proto import reach_pb2 as pb
from reach_plugins.wire.proto import reach_pb2_grpc as pb_grpc
from reach_plugins.wire.sse import encode_sse
from transports.grpcnode import GrpcNodeTransport

MB = 1_000_000


async def _events(client: ReachClient, size: int) -> list[StreamEvent]:
    return [event async for event in client.stream("film", {"size": size}, timeout_ms=15_000)]


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
async def test_a_streamed_1_mb_part_arrives_whole_between_the_text_events(tmp_path: Path, transport: str) -> None:
    """A handler's text, 1 MB part, text reach the caller in that order, the part byte for byte as one event."""
    async with client_over(transport, tmp_path) as client:
        events = await _events(client, MB)
    assert [event.kind for event in events] == ["data", "media", "data", "end"]
    assert [events[0].data, events[2].data] == ["before", "after"]
    part = events[1].media
    assert part is not None and part.data == BLOB[:MB]
    assert (part.media_type, part.name) == ("image/x-raw", "frame.raw")


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
async def test_a_part_past_the_agents_own_limit_is_refused_before_it_is_sent(tmp_path: Path, transport: str) -> None:
    """The agent refuses its handler's part past the capability's max_media_bytes: the text before it arrives, then
    a media_too_large error naming the limit and what to raise."""
    async with client_over(transport, tmp_path) as client:
        events = await _events(client, LIMIT + 1)
    assert [event.kind for event in events] == ["data", "error"]
    assert events[1].error is not None
    refused = errors.from_wire(events[1].error)
    assert isinstance(refused, errors.MediaTooLarge)
    assert str(LIMIT) in refused.message and "max_media_bytes" in refused.message


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
async def test_a_part_past_the_callers_limit_ends_the_stream_by_name(tmp_path: Path, transport: str) -> None:
    """Where the caller's config declares less than the agent sends, the receiving side (client, gateway, node)
    refuses the part from its announced size, before any chunk is held: MediaTooLarge naming the limit."""
    small = 256 << 10
    async with client_over(transport, tmp_path, film_limit=small) as client:
        events = await _events(client, MB)
    assert [event.kind for event in events] == ["data", "error"]
    assert events[1].error is not None
    refused = errors.from_wire(events[1].error)
    assert isinstance(refused, errors.MediaTooLarge)
    assert str(small) in refused.message and "max_media_bytes" in refused.message


# --------------------------------------------------------------------------- a sender that breaks the sequence


def _raw_stream(frames: bytes) -> RawUpstream:
    """An upstream answering every request with these SSE frames (after one text event), then closing."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    answered = head + encode_sse('"before"', "data") + frames  # built once: the server allocates nothing per answer

    def answer(conn: socket.socket) -> None:
        conn.sendall(answered)

    return RawUpstream(answer)


def _start(**fields: Any) -> bytes:
    return encode_sse(json.dumps({"media_type": "image/png", **fields}), "media")


def _chunk(data: bytes) -> bytes:
    return encode_sse(base64.b64encode(data).decode(), "media.chunk")


END = encode_sse("", "media.end") + encode_sse("", "end")
BAD_SEQUENCES = {
    "chunk without start": _chunk(b"x" * 10) + END,
    "end short of the size": _start(size=100) + _chunk(b"x" * 10) + END,
    "chunk past the size": _start(size=10) + _chunk(b"x" * 11) + END,
    "text inside a part": _start(size=10) + encode_sse('"oops"', "data") + END,
    "chunk not base64": _start(size=10) + encode_sse("!!!!", "media.chunk") + END,
}


@pytest.mark.parametrize("sequence", sorted(BAD_SEQUENCES))
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
async def test_a_bad_chunk_sequence_is_an_invalid_response(tmp_path: Path, transport: str, sequence: str) -> None:
    """A chunk without a start, a size that does not match, text inside a part or a chunk that is not base64 ends
    the stream with invalid_response over each transport, after the text that came first."""
    upstream = _raw_stream(BAD_SEQUENCES[sequence])
    try:
        async with client_over(transport, tmp_path, url=f"http://127.0.0.1:{upstream.port}") as client:
            events = await _events(client, MB)
    finally:
        upstream.close()
    assert [event.kind for event in events] == ["data", "error"]
    assert events[1].error is not None and events[1].error.type == "invalid_response", events[1].error


async def test_a_sender_that_lies_about_the_size_is_stopped_within_it(tmp_path: Path) -> None:
    """A part announcing 64 KiB then sending 8 MiB of chunks is refused at the first chunk past 64 KiB: the client's
    memory grows by far less than what was sent (the rest is never read into a part)."""
    frames = _start(size=CHUNK_BYTES) + _chunk(BLOB[:CHUNK_BYTES]) * 128 + END
    upstream = _raw_stream(frames)
    try:
        async with client_over("direct", tmp_path, url=f"http://127.0.0.1:{upstream.port}") as client:
            tracemalloc.start()
            try:
                events = await _events(client, MB)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
    finally:
        upstream.close()
    assert [event.kind for event in events] == ["data", "error"]
    assert events[1].error is not None and "more than the 65536 bytes" in events[1].error.message
    assert peak < 2 << 20, peak


def test_an_assembler_holds_at_most_the_limit_and_one_copy() -> None:
    """A start past the limit is refused holding nothing; a part within it becomes bytes without a second copy."""
    assembler = MediaAssembler(limit=MB, capability="film")
    with pytest.raises(errors.MediaTooLarge, match="max_media_bytes"):
        assembler.start({"media_type": "image/png", "size": MB + 1})
    assert assembler.held == 0 and not assembler.open
    part = MediaPart(media_type="image/png", data=BLOB[:MB], name="a.png")
    got = _reassembled(MediaAssembler(limit=MB, capability="film"), part)
    assert got == part


def _reassembled(assembler: MediaAssembler, part: MediaPart) -> MediaPart | None:
    found = None
    for frame in sse_frames(part):
        lines = frame.decode().splitlines()
        event, data = lines[0].removeprefix("event: "), lines[1].removeprefix("data: ").removeprefix("data:")
        found = assembler.feed_sse(event, data)
    return found


# --------------------------------------------------------------------------- a node that breaks the sequence


class _BadNode(pb_grpc.ReachNodeServicer):
    """A node whose stream sends a text chunk, then ``replies``."""

    def __init__(self, replies: list[pb.StreamReply]) -> None:
        self.replies = replies

    async def Stream(self, request: pb.ReachCall, context: Any) -> AsyncIterator[pb.StreamReply]:
        yield pb.StreamReply(data=b'"before"')
        for reply in self.replies:
            yield reply


@asynccontextmanager
async def _bad_node(replies: list[pb.StreamReply]) -> AsyncIterator[str]:
    server = grpc.aio.server()
    pb_grpc.add_ReachNodeServicer_to_server(_BadNode(replies), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


def _config(tmp_path: Path) -> Path:
    studio = {"endpoints": ["http://127.0.0.1:9"], "capabilities": [{"name": "film", "max_media_bytes": LIMIT}]}
    return write_config(tmp_path / "agents.yaml", {"studio": studio}, TENANTS)


GRPC_SEQUENCES = {
    "chunk without start": ([pb.StreamReply(media_chunk=b"x"), pb.StreamReply(end=True)], "invalid_response"),
    "size mismatch": (
        [
            pb.StreamReply(media_start=pb.MediaStart(media_type="image/png", size=5)),
            pb.StreamReply(media_chunk=b"xx"),
            pb.StreamReply(media_end=True),
        ],
        "invalid_response",
    ),
    "past the limit": (
        [pb.StreamReply(media_start=pb.MediaStart(media_type="image/png", size=LIMIT + 1))],
        "media_too_large",
    ),
}


@pytest.mark.parametrize("sequence", sorted(GRPC_SEQUENCES))
async def test_a_bad_chunk_sequence_from_a_node_is_refused(tmp_path: Path, sequence: str) -> None:
    """From a node, a chunk without a start or a size mismatch is invalid_response; a start past the limit is
    media_too_large, before any chunk."""
    replies, kind = GRPC_SEQUENCES[sequence]
    config = f"file://{_config(tmp_path)}"
    async with _bad_node(replies) as target, ReachClient(config, GrpcNodeTransport(target), tenant="demo") as client:
        events = await _events(client, MB)
    assert [event.kind for event in events] == ["data", "error"]
    assert events[1].error is not None and events[1].error.type == kind, events[1].error


# --------------------------------------------------------------------------- the gateway's /mcp


def test_mcp_content_and_media_parts_map_both_ways_in_one_place() -> None:
    """Parts written as MCP content (image, audio, blob resource, resource_link) read back as the same parts."""
    parts = [
        MediaPart(media_type="image/png", data=png()),
        MediaPart(media_type="audio/wav", data=BLOB[:300]),
        MediaPart(media_type="application/zip", data=BLOB[:50], name="file:///x.zip"),
        MediaPart(media_type="text/csv", url="http://127.0.0.1:9/table.csv", name="table"),
    ]
    items = content_of_media(parts)
    assert [item["type"] for item in items] == ["image", "audio", "resource", "resource_link"]
    assert media_of_content(items) == parts


def test_the_gateways_mcp_answers_a_reach_replys_media_as_mcp_content(tmp_path: Path) -> None:
    """tools/call of a capability returning an image is an image item; a stream's text and part are a text item
    and an image item (its bytes base64, its type as mimeType)."""
    with BackgroundServer(studio().app) as agent:
        descriptor = studio().descriptor(agent.url).model_dump(mode="json", exclude_defaults=True)
        config = tmp_path / "agents.yaml"
        config.write_text(yaml.safe_dump({"agents": [descriptor]}))
        with BackgroundServer(create_app(config, allow_open=True), proxy_headers=False) as gateway:
            url = f"{gateway.url}/mcp"
            headers = session(url)
            drawn = call(url, headers, "tools/call", {"name": "draw", "arguments": {}})["result"]
            filmed = call(url, headers, "tools/call", {"name": "film", "arguments": {"size": 1000}})["result"]
    assert drawn["content"] == [{"type": "image", "data": b64(png(2, 2)), "mimeType": "image/png"}]
    assert filmed["content"] == [
        {"type": "text", "text": "beforeafter"},
        {"type": "image", "data": b64(BLOB[:1000]), "mimeType": "image/x-raw"},
    ]
