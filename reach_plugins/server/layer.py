"""One server layer under every HTTP route: authenticate, read a bounded body in time, parse strictly, then serve.

A route of ours is declared, never hand-mounted: a :class:`ServerRoute` names
its path and methods, who may call it (an :data:`Authenticate` rule, or
:data:`OPEN` said out loud for health, metrics, JWKS and the agent card), how
much body it takes (:class:`~reach_plugins.server.inbound.InputLimits`) and
what the body must be (a pydantic model, :data:`JSON` for any strict JSON
value, or ``None`` for no body). :class:`ServerApp` is the only way our apps
build their route lists, so a handler only ever sees an :class:`Inbound` that
went through the steps in this order: the caller is known before a byte of
the body is read, the body is cut at its byte and time budgets, and it is
decoded and validated before the surface sees it. A refusal at any step is
the route's ``refuse`` answer (a 4xx JSON naming the problem by default).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Lifespan, Receive, Scope, Send

from reach_plugins.errors import BodyTooLarge, ConfigError, MediaTooLarge, ReachError
from reach_plugins.security.claims import Claims
from reach_plugins.server.inbound import BodyPlaces, InputLimits, loads, read_body, require_json, single_headers
from reach_plugins.wire.body import invalid
from reach_plugins.wire.redact import without_addresses

Stage = Literal["auth", "read", "parse", "serve"]
"""Where a refusal arose: before the body (``auth``), reading it (``read``), decoding it (``parse``), or in the
handler (``serve``: a ReachError it raised)."""


class _Open:
    """The auth rule of a route anyone may call (health, readiness, metrics, JWKS, the agent card)."""

    def __repr__(self) -> str:
        return "OPEN"


class _Json:
    """The body model of a route taking any strict JSON value (JSON-RPC messages, checked by their surface)."""

    def __repr__(self) -> str:
        return "JSON"


OPEN: Final = _Open()
JSON: Final = _Json()
Authenticate = Callable[[Request, Mapping[str, str]], Awaitable[Any]]
"""``(request, its single-valued lowercase headers) -> caller`` (a tenant, token claims); raises a ReachError."""
BodyModel = type[BaseModel] | _Json | None
Refuse = Callable[[ReachError, Stage], Response]
Around = Callable[[Request, Callable[[], Awaitable[Response]]], Awaitable[Response]]
"""The surface's accounting around a whole route (in-flight count, latency, its crash answer)."""


@dataclass(frozen=True, slots=True)
class Inbound:
    """A request that went through the layer: its caller (what the auth rule returned) and its parsed body."""

    request: Request
    headers: Mapping[str, str]
    caller: Any
    body: Any
    """An instance of the route's body model, the JSON value for :data:`JSON`, ``None`` without a body."""


Handler = Callable[[Inbound], Awaitable[Response]]


def refusal(exc: ReachError, stage: Stage) -> Response:
    """The default refusal: the error's status and ``{"error": {type, message}}`` (no backend's address)."""
    error = {"type": exc.error_type, "message": without_addresses(exc.message)}
    return JSONResponse({"error": error}, status_code=exc.http_status)


@dataclass(frozen=True, slots=True)
class ServerRoute:
    """One route as declared: path, methods, auth rule, body limits and model, and the surface's handler."""

    path: str
    methods: tuple[str, ...]
    handler: Handler
    auth: Authenticate | _Open
    body: BodyModel = None
    limits: InputLimits = field(default_factory=InputLimits)
    large: BodyPlaces | None = None
    """Places for large bodies shared by the routes of one server, per tenant (:meth:`InputLimits.places`)."""
    json_only: bool = False
    """The body must be declared ``Content-Type: application/json`` (checked right after the caller)."""
    refuse: Refuse = refusal
    around: Around | None = None

    def __post_init__(self) -> None:
        if not self.methods:
            raise ConfigError(f"route {self.path}: declare the HTTP methods it serves")
        if self.auth is OPEN and self.body is not None:
            raise ConfigError(f"route {self.path}: an open route takes no body; give it an auth rule")

    @property
    def open(self) -> bool:
        return self.auth is OPEN

    async def serve(self, request: Request) -> Response:
        """The layer's steps in order, then the handler (inside ``around`` when the surface gave one)."""
        if self.around is None:
            return await self._serve(request)
        return await self.around(request, lambda: self._serve(request))

    async def _serve(self, request: Request) -> Response:
        try:
            headers = single_headers(request.scope["headers"])
            caller = None if isinstance(self.auth, _Open) else await self.auth(request, headers)
            if self.json_only:
                require_json(headers)
        except ReachError as exc:
            return self._unread(self.refuse(exc, "auth"))
        if self.body is None:
            return await self._handle(Inbound(request, headers, caller, None))
        limits = self.limits
        large = None if self.large is None else self.large.of(_tenant(caller))
        try:
            raw = await read_body(
                request.stream(), headers, limit=limits.bound, timeout=limits.body_timeout, large=large
            )
        except BodyTooLarge as exc:
            return self._unread(self.refuse(_too_large(exc, limits), "read"))
        except ReachError as exc:
            return self._unread(self.refuse(exc, "read"))
        try:
            body = self._parse(raw)
        except ReachError as exc:
            return self.refuse(exc, "parse")
        return await self._handle(Inbound(request, headers, caller, body))

    async def _handle(self, inbound: Inbound) -> Response:
        try:
            return await self.handler(inbound)
        except ReachError as exc:
            return self.refuse(exc, "serve")

    def _unread(self, response: Response) -> Response:
        """A refusal before the body was read whole ends the connection, so the rest is never read."""
        if self.body is not None:
            response.headers["Connection"] = "close"
        return response

    def _parse(self, raw: bytes) -> Any:
        value = loads(raw, max_depth=self.limits.max_depth)
        if not isinstance(self.body, type):
            return value
        try:
            return self.body.model_validate(value)
        except ValidationError as exc:
            raise invalid(exc) from None


def _too_large(exc: BodyTooLarge, limits: InputLimits) -> BodyTooLarge:
    """On a route carrying media, a body past its bound is a :class:`MediaTooLarge` saying what to raise."""
    if not limits.max_media:
        return exc
    return MediaTooLarge(
        f"{exc.message}: {limits.max_body} bytes of JSON plus {limits.max_media} media bytes as base64; "
        "send large media by url, or raise the server's max_media_bytes"
    )


def _tenant(caller: Any) -> str | None:
    """The tenant whose large-body places a caller waits for: a tenant name, or the tenant of token claims."""
    if isinstance(caller, Claims):
        return caller.tenant
    return caller if isinstance(caller, str) else None


class LayerRoute(Route):
    """The Starlette route of a :class:`ServerRoute`: its endpoint is the layer, never the bare handler."""

    def __init__(self, declared: ServerRoute) -> None:
        super().__init__(declared.path, declared.serve, methods=list(declared.methods))
        self.declared = declared


class ServerApp(Starlette):
    """Starlette whose routes are all :class:`LayerRoute`; ``hot`` (a ``POST`` path) skips the router's walk."""

    def __init__(
        self, routes: Sequence[ServerRoute], *, lifespan: Lifespan[Any] | None = None, hot: str | None = None
    ) -> None:
        for route in routes:
            if not isinstance(route, ServerRoute):
                raise ConfigError(f"{route!r} is not a ServerRoute: every route of ours is declared through the layer")
        mounted: list[BaseRoute] = [LayerRoute(route) for route in routes]
        super().__init__(routes=mounted, lifespan=lifespan)
        found = [r for r in routes if r.path == hot and "POST" in r.methods]
        self._hot = found[0] if found else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hot = self._hot
        if (
            hot is not None
            and scope["type"] == "http"
            and scope["path"] == hot.path
            and scope["method"] == "POST"
            and not scope.get("root_path")
        ):
            response = await hot.serve(Request(scope, receive))
            await response(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def declared_routes(app: Starlette) -> list[ServerRoute]:
    """The declarations behind ``app``'s routes; ``ConfigError`` for a route mounted outside the layer."""
    found: list[ServerRoute] = []
    for route in app.routes:
        if not isinstance(route, LayerRoute):
            raise ConfigError(f"route {getattr(route, 'path', route)!r} was mounted outside the server layer")
        found.append(route.declared)
    return found
