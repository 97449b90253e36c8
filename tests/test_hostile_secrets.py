"""Redaction by construction: distinctive secrets planted in every credential kind never reach a caller.

A fault matrix (malformed HTTP, a status line that is not HTTP, a reset after
the request, a hang past the deadline, a refused connection, a 500, a
redirect) x credential kinds (header, bearer, query) runs through the direct
client and through the gateway. Every answer, exception, span (attributes,
events, status), JSON trace line and log line is scanned for the secrets.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hop_support import free_port
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from raw_upstream import RawUpstream

from reach_plugins import ReachClient
from reach_plugins.agent import BackgroundServer
from reach_plugins.errors import ReachError
from reach_plugins.gateway import create_app
from reach_plugins.telemetry.trace import JsonLinesSink
from transports.direct import DirectTransport

SECRETS = {"header": "SeCrEt-hdr-7f3a9c", "bearer": "SeCrEt-brr-91c2e4", "query": "SeCrEt-qry-5d88b1"}
ENVIRON = {"GW_TOKEN": "tok-gw", **{f"SECRET_{kind.upper()}": value for kind, value in SECRETS.items()}}


def _garbage(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\r\n")


def _not_http(conn: socket.socket) -> None:
    conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")


def _reset(conn: socket.socket) -> None:
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _hang(conn: socket.socket) -> None:
    conn.recv(1)  # until the client gives up and closes


def _error500(conn: socket.socket) -> None:
    body = b'{"detail": "internal"}'
    conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


def _redirect(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:9/elsewhere\r\nContent-Length: 0\r\n\r\n")


FAULTS: dict[str, Callable[[socket.socket], None]] = {
    "garbage": _garbage,
    "nothttp": _not_http,
    "reset": _reset,
    "hang": _hang,
    "error500": _error500,
    "redirect": _redirect,
}


def _auth(kind: str) -> dict[str, str]:
    auth = {"type": kind, "value_env": f"SECRET_{kind.upper()}"}
    if kind == "header":
        auth["key"] = "X-Api-Key"
    if kind == "query":
        auth["key"] = "api_key"
    return auth


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    upstreams = {fault: RawUpstream(behave) for fault, behave in FAULTS.items()}
    agents: list[dict[str, Any]] = [
        {
            "name": f"{fault}-{kind}",
            "endpoints": [f"http://127.0.0.1:{upstream.port}"],
            "capabilities": [f"cap_{fault}_{kind}"],
            "retry": {"max_attempts": 1},
        }
        for fault, upstream in upstreams.items()
        for kind in SECRETS
    ]
    agents.append(
        {"name": "refused-any", "endpoints": [f"http://127.0.0.1:{free_port()}"], "capabilities": ["cap_refused"]}
    )
    credentials = {agent["name"]: _auth(agent["name"].rpartition("-")[2]) for agent in agents}
    credentials["refused-any"] = _auth("query")
    tenants = {"demo": {"token_env": "GW_TOKEN", "agents": "*", "credentials": credentials}}
    path = tmp_path_factory.mktemp("secrets") / "agents.yaml"
    path.write_text(yaml.safe_dump({"agents": agents, "tenants": tenants}))
    yield path
    for upstream in upstreams.values():
        upstream.close()


CAPABILITIES = [f"cap_{fault}_{kind}" for fault in FAULTS for kind in SECRETS] + ["cap_refused"]


class Seen:
    """Everything a caller (or an operator reading caller-facing telemetry) could see."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.texts: list[str] = []

    def span_texts(self) -> list[str]:
        texts = []
        for span in self.spans.get_finished_spans():
            texts.append(json.dumps(dict(span.attributes or {}), default=str))
            texts.append(span.status.description or "")
            texts.extend(json.dumps(dict(event.attributes or {}), default=str) + event.name for event in span.events)
        return texts


def _hits(texts: list[str]) -> list[tuple[str, str]]:
    return [(secret, text[:300]) for text in texts for secret in SECRETS.values() if secret in text]


def _log_texts(caplog: pytest.LogCaptureFixture) -> list[str]:
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return [formatter.format(record) for record in caplog.records]


@pytest.mark.parametrize("engine", ["aiohttp", "httpx"])
async def test_direct_client_leaks_no_secret_in_any_fault(
    config: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, engine: str
) -> None:
    """Direct transport (both engines), every fault x credential kind: 0 secrets in answers, spans, traces, logs."""
    caplog.set_level(logging.DEBUG)
    seen = Seen()
    sink = JsonLinesSink(tmp_path / "traces.jsonl")
    client = ReachClient(
        f"file://{config}",
        DirectTransport(engine=engine),
        tenant="demo",
        environ=ENVIRON,
        sink=sink,
        tracer_provider=seen.provider,
    )
    try:
        for capability in CAPABILITIES:
            try:
                response = await client.reach(capability, {"q": 1}, timeout_ms=400)
                seen.texts.append(response.model_dump_json())
                assert response.status != "success", capability
            except ReachError as exc:
                seen.texts.append(f"{exc!r} {exc} {exc.message} {exc.details!r}")
    finally:
        await client.aclose()
        sink.close()
    traces = (tmp_path / "traces.jsonl").read_text().splitlines()
    assert len(traces) == len(CAPABILITIES)
    assert _hits(seen.texts + seen.span_texts() + traces + _log_texts(caplog)) == []


async def test_gateway_leaks_no_secret_in_any_fault(config: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Through the gateway, every fault x credential kind: 0 secrets in answers, spans and logs; no agent address."""
    caplog.set_level(logging.DEBUG)
    seen = Seen()
    app = create_app(config, environ=ENVIRON, tracer_provider=seen.provider)
    with BackgroundServer(app) as gateway:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
            for capability in CAPABILITIES:
                answer = await http.post(
                    "/v1/reach",
                    json={"capability": capability, "payload": {"q": 1}, "deadline_ms": 400},
                    headers={"Authorization": "Bearer tok-gw"},
                )
                seen.texts.append(answer.text)
                assert answer.status_code != 500, answer.text
    assert len(seen.spans.get_finished_spans()) >= len(CAPABILITIES)
    assert _hits(seen.texts + seen.span_texts() + _log_texts(caplog)) == []
    endpoints = {url for agent in yaml.safe_load(config.read_text())["agents"] for url in agent["endpoints"]}
    assert [text for text in seen.texts for url in endpoints if url.removeprefix("http://") in text] == []
