"""The operations page: agents and instances with live health, recent reaches and their route decisions, error rates
and p95 per capability, usage per tenant (issue 28, deliverable 2).

``GET /ops`` is a static page (``ops_page.html``, no external assets, no data in it) filled from ``GET /ops/feed``
and ``GET /ops/trace?id=...``; all of them need the operator token (the bearer that guards ``/metrics``,
``--metrics-token-env``), which a browser is asked for once (:class:`OpsPage`). The feed never carries a secret:
no tokens, no credential values, no request parameters or results, and endpoints without userinfo or query.
:func:`fleet` is the one place the instance view is read: the router's own judgement (``routing/status.py``, as
``/v1/agents`` and ``reach agents`` show it). The gateway keeps its recent reaches in :class:`Recent` (a bounded
trace sink beside the metrics sink); ``reach ops`` (a direct-transport fleet) feeds it from the clients' trace file.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import math
import os
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from importlib.resources import files
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import uvicorn
from rich.console import Console
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from reach_plugins.endpoints import EndpointPolicy
from reach_plugins.errors import ConfigError, ReachError, Unauthenticated
from reach_plugins.model import ReachTrace
from reach_plugins.registry import open_registry
from reach_plugins.server.forwarder import Forwarder
from reach_plugins.server.layer import Inbound, ServerApp, ServerRoute, Stage, refusal
from reach_plugins.server.uvicorn import uvicorn_config
from reach_plugins.telemetry.prometheus import scrape_allowed
from reach_plugins.telemetry.traceview import read_traces, trace_tree
from reach_plugins.telemetry.usage import summarise

RECENT: Final = 500
"""Reaches the page's figures are computed over (the newest ones)."""
TAIL_BYTES: Final = 4 << 20
"""At most this much of a followed trace file is read at a time (its newest part)."""
SHOWN: Final = 50
"""Reaches listed on the page."""


class Recent:
    """The newest reaches, bounded, as a :class:`TraceSink` (the gateway fans its traces out to it).

    With ``follow`` it also reads the traces other processes append to that JSON-lines file (``reach ops``).
    """

    def __init__(
        self,
        *,
        size: int = RECENT,
        follow: Path | None = None,
        tail_bytes: int = TAIL_BYTES,
    ) -> None:
        if size < 1:
            raise ConfigError(f"Recent keeps at least 1 reach, got size={size}")
        self._traces: deque[ReachTrace] = deque(maxlen=size)
        self._follow = follow
        self._offset = 0
        self._tail = tail_bytes

    def emit(self, trace: ReachTrace) -> None:
        self._traces.append(trace)

    def traces(self) -> list[ReachTrace]:
        """Oldest first, after reading what was appended to the followed file since the last look."""
        if self._follow is not None and self._follow.exists():
            self._read(self._follow)
        return list(self._traces)

    def _read(self, path: Path) -> None:
        """The whole lines appended since the last look, within the file's last ``tail_bytes``."""
        size = path.stat().st_size
        if size < self._offset:
            self._offset = 0  # rotated or truncated: read the new file from its start
        start = max(self._offset, size - self._tail)
        with path.open("rb") as handle:
            handle.seek(start)
            chunk = handle.read(size - start)
        complete, newline, _ = chunk.rpartition(b"\n")
        if not newline:
            return
        self._offset = start + len(complete) + 1
        lines = complete.decode("utf-8", errors="replace").splitlines()
        self._traces.extend(read_traces(iter(lines)))  # a first line cut by the tail bound does not parse: skipped

    def find(self, request_id: str) -> ReachTrace | None:
        return next((t for t in reversed(self.traces()) if t.request_id == request_id), None)


def shown_endpoint(endpoint: str) -> str:
    """An endpoint as operators see it: scheme, host, port and path; never userinfo, query or fragment."""
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port is not None else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def fleet(forwarder: Forwarder, load: Mapping[tuple[str, str], int]) -> list[dict[str, Any]]:
    """Every agent and instance with what routing decides about it now (the page's one read of instance health):
    the router's own judgement (:meth:`Forwarder.status`), its first reason as ``why``, and ``load``, the
    instance's share of recent reaches."""
    now = forwarder.registry.clock()
    agents = []
    for name, agent in sorted(forwarder.table.agents().items()):
        instances = []
        for instance in sorted(forwarder.table.instances(name).values(), key=lambda i: i.instance_id):
            judged = forwarder.status(instance, now)
            probe = judged.probe
            instances.append(
                {
                    "instance_id": instance.instance_id,
                    "endpoint": shown_endpoint(instance.endpoint),
                    "status": instance.status,
                    "lease": judged.lease_alive,
                    "breaker": judged.breaker,
                    "probe": None if probe is None else not probe.down,
                    "available": judged.available,
                    "why": judged.reason,
                    "pins": judged.pins,
                    "recent_calls": load.get((name, instance.instance_id), 0),
                }
            )
        capabilities = [capability.name for capability in agent.capabilities]
        agents.append({"name": name, "capabilities": capabilities, "instances": instances})
    return agents


def p95(values: list[float]) -> float:
    """The 95th percentile by the nearest-rank method (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def figures(traces: list[ReachTrace]) -> dict[str, Any]:
    """Error rate and p95 per capability, usage per tenant and the recent reaches (newest first), of ``traces``."""
    per: dict[str, list[ReachTrace]] = {}
    for trace in traces:
        per.setdefault(trace.capability, []).append(trace)
    capabilities = [
        {
            "capability": name,
            "calls": len(group),
            "errors": sum(t.status != "success" for t in group),
            "error_rate": sum(t.status != "success" for t in group) / len(group),
            "p95_ms": p95([t.duration_ms for t in group]),
        }
        for name, group in sorted(per.items())
    ]
    tenants: dict[str, dict[str, Any]] = {}
    for row in summarise(traces):
        total = tenants.setdefault(row.tenant, {"tenant": row.tenant, "calls": 0, "succeeded": 0, "tokens": 0})
        total["calls"] += row.calls
        total["succeeded"] += row.succeeded
        total["tokens"] += row.tokens
    recent = [
        {
            "request_id": t.request_id,
            "capability": t.capability,
            "tenant": t.tenant,
            "status": t.status,
            "started_at": t.started_at,
            "duration_ms": t.duration_ms,
            "agent": t.route.agent if t.route else None,
            "instance": t.route.instance if t.route else None,
            "reason": t.route.reason if t.route else None,
            "attempts": len(t.attempts),
        }
        for t in reversed(traces[-SHOWN:])
    ]
    return {
        "window": len(traces),
        "capabilities": capabilities,
        "tenants": [tenants[name] for name in sorted(tenants)],
        "recent": recent,
    }


def replay(trace: ReachTrace) -> str:
    """The request as ``reach trace`` draws it (route decision, attempts, events), as plain text."""
    console = Console(file=io.StringIO(), width=120, record=True, color_system=None)
    console.print(trace_tree(trace))
    return console.export_text()


class OpsPage:
    """The page's routes over a forwarder and its recent reaches, every one behind the operator token.

    A browser asked for ``GET /ops`` prompts for credentials (HTTP Basic: any user name, the token as password) and
    is given an HttpOnly, SameSite=Strict cookie holding a keyed digest of the token, never the token, which its
    feeds then present; the page's script never sees either.
    """

    def __init__(self, forwarder: Forwarder, recent: Recent, *, token: str | None) -> None:
        self.forwarder = forwarder
        self.recent = recent
        self.token = token
        self._session = hmac.new(token.encode(), b"reach-ops-session", hashlib.sha256).hexdigest() if token else None

    async def operator(self, request: Request, headers: Mapping[str, str]) -> None:
        """The auth rule of every route of the page: the operator token as a bearer, a Basic password or its
        cookie; with no token configured, nobody."""
        if self.token is None or self._session is None:
            raise Unauthenticated(
                "the operations page needs an operator token: start the server with --metrics-token-env VAR "
                "(the bearer /metrics asks for) and sign in with its value"
            )
        authorization = headers.get("authorization")
        cookie = request.cookies.get(COOKIE, "")
        if not (
            hmac.compare_digest(cookie.encode(), self._session.encode())
            or scrape_allowed(self.token, authorization)
            or hmac.compare_digest(basic_password(authorization).encode(), self.token.encode())
        ):
            raise Unauthenticated(
                "the operations page needs the operator token: as the password your browser asks for, or as "
                "'Authorization: Bearer <token>'"
            )

    async def page(self, inbound: Inbound) -> Response:
        assert self._session is not None  # the auth rule let the caller in
        answer = HTMLResponse(_resource("ops_page.html"), headers=_HEADERS)
        answer.set_cookie(COOKIE, self._session, max_age=SESSION, path="/ops", httponly=True, samesite="strict")
        return answer

    @staticmethod
    def _ask(exc: ReachError, stage: Stage) -> Response:
        """The refusal of ``GET /ops``: the layer's, asking a browser for the token (HTTP Basic)."""
        answer = refusal(exc, stage)
        answer.headers["WWW-Authenticate"] = 'Basic realm="reach operations (password: the operator token)"'
        return answer

    async def feed(self, inbound: Inbound) -> Response:
        traces = self.recent.traces()
        load: dict[tuple[str, str], int] = {}
        for trace in traces:
            if trace.route is not None:
                key = (trace.route.agent, trace.route.instance)
                load[key] = load.get(key, 0) + 1
        body = {"agents": fleet(self.forwarder, load), **figures(traces)}
        return JSONResponse(body, headers={"Cache-Control": "no-store"})

    async def trace(self, inbound: Inbound) -> Response:
        request_id = inbound.request.query_params.get("id", "")
        found = self.recent.find(request_id)
        if found is None:
            body = {"error": f"no recent reach {request_id!r}; the page lists the newest {SHOWN}"}
            return JSONResponse(body, status_code=404)
        return JSONResponse({"request_id": found.request_id, "text": replay(found)})

    def routes(self) -> list[ServerRoute]:
        return [
            ServerRoute("/ops", ("GET",), self.page, auth=self.operator, refuse=self._ask),
            ServerRoute("/ops/feed", ("GET",), self.feed, auth=self.operator),
            ServerRoute("/ops/trace", ("GET",), self.trace, auth=self.operator),
        ]


def basic_password(authorization: str | None) -> str:
    """The password of an ``Authorization: Basic`` header, else "" (never a valid token)."""
    scheme, _, encoded = (authorization or "").strip().partition(" ")
    if scheme.lower() != "basic":
        return ""
    try:
        return base64.b64decode(encoded.strip(), validate=True).decode().partition(":")[2]
    except (ValueError, UnicodeDecodeError):
        return ""


def _resource(name: str) -> str:
    return files("reach_plugins.gateway").joinpath(name).read_text(encoding="utf-8")


COOKIE: Final = "reach-ops"
SESSION: Final = 8 * 3600
"""Seconds a browser's sign-in lasts."""
_CSP: Final = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:"
)
"""The page loads nothing from anywhere else."""
_HEADERS: Final = {"Cache-Control": "no-store", "Content-Security-Policy": _CSP, "X-Frame-Options": "DENY"}


def ops_app(forwarder: Forwarder, recent: Recent, *, token: str | None) -> ServerApp:
    """The page alone, for a direct-transport fleet (``reach ops``): the forwarder only watches and probes."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await forwarder.start()
        try:
            yield
        finally:
            await forwarder.aclose()

    return ServerApp(OpsPage(forwarder, recent, token=token).routes(), lifespan=lifespan)


def serve_ops(
    registry: str,
    host: str = "127.0.0.1",
    port: int = 8070,
    *,
    token_env: str,
    trace_file: Path,
    environ: Mapping[str, str] = os.environ,
) -> None:
    """``reach ops``: the page of a direct-transport fleet, the agents of ``registry`` probed from here and the reaches
    its clients write to ``trace_file``, behind the operator token in ``$token_env``, under uvicorn until interrupted.
    """
    token = environ.get(token_env)
    if not token:
        raise ConfigError(f"environment variable {token_env} is not set; it holds the operator token the page asks for")
    endpoints = EndpointPolicy.from_environ(environ)
    forwarder = Forwarder(open_registry(registry, endpoints=endpoints), tenants={}, owns_registry=True)
    app = ops_app(forwarder, Recent(follow=trace_file), token=token)
    uvicorn.Server(uvicorn_config(app, host=host, port=port)).run()
