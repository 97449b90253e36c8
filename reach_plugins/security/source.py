"""Where a caller gets the token for its target: :class:`LocalTokens` (an in-process issuer) or :class:`RemoteTokens`.

Both cache a token per (target, tenant, received token) until shortly before it
expires, and share one fetch between concurrent misses. A miss that needs no
await (an in-process issuer signing for a tenant) is signed inline: a caller
spreading calls over 1,000 agents misses once per agent, and a task plus a
shielded wait per miss cost more than the signature itself. Inside a served
handler (:func:`~reach_plugins.security.held.received`) they *exchange* the
received token for one bound to the chain instead of asking as the tenant:
in-process the presenter is the agent being served (:func:`~reach_plugins.security.context.current`);
over HTTP it authenticates with its own bearer (``RemoteTokens(url, bearer=the agent's issuer token)``).
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Protocol

from reach_plugins.errors import WIRE_CODES, BackendUnavailable, ConfigError, InvalidToken, ReachError, TokenDenied
from reach_plugins.security.claims import DEFAULT_TTL, MAX_TTL
from reach_plugins.security.context import current
from reach_plugins.security.held import received
from reach_plugins.security.issuer import TokenIssuer
from reach_plugins.security.keys import KeyRing
from reach_plugins.security.urls import secure_url_problem

_Key = tuple[str, str | None, str | None]


class TokenSource(Protocol):
    """``await tokens.token(agent, tenant)``: a token whose audience is ``agent``; ``trust`` is that agent's trust
    level, which a gateway's issuer writes into the token (an L3 agent's token is never exchanged)."""

    async def token(self, audience: str, tenant: str | None, *, trust: str | None = None) -> str: ...


class TokenCache:
    """Tokens by key, reused until ``margin`` before expiry (10 % of their life, at most 30 s); sans-IO."""

    def __init__(self, *, clock: Callable[[], float] = time.time, max_entries: int = 10_000) -> None:
        self._clock = clock
        self._max = max_entries
        self._tokens: dict[_Key, tuple[str, float]] = {}

    def get(self, key: _Key) -> str | None:
        found = self._tokens.get(key)
        if found is None or self._clock() >= found[1]:
            return None
        return found[0]

    def put(self, key: _Key, token: str, expires_at: float) -> None:
        now = self._clock()
        margin = min(30.0, max(0.0, expires_at - now) * 0.1)
        if len(self._tokens) >= self._max:
            self._tokens = {k: v for k, v in self._tokens.items() if v[1] > now}
            if len(self._tokens) >= self._max:
                self._tokens.pop(next(iter(self._tokens)))
        self._tokens[key] = (token, expires_at - margin)


class _Cached(ABC):
    """Cache + single flight around ``_fetch``; ``_at_once`` answers a miss without awaiting when it can."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._cache = TokenCache(clock=clock)
        self._flights: dict[_Key, asyncio.Future[tuple[str, float]]] = {}

    async def token(self, audience: str, tenant: str | None, *, trust: str | None = None) -> str:
        held = received()
        key = (audience, tenant, held)
        found = self._cache.get(key)
        if found is not None:
            return found
        signed = self._at_once(audience, tenant, held, trust)
        if signed is not None:
            self._cache.put(key, *signed)
            return signed[0]
        flight = self._flights.get(key)
        if flight is None:
            flight = self._flights[key] = asyncio.ensure_future(self._fetch(audience, tenant, held, trust))
            flight.add_done_callback(lambda _: self._flights.pop(key, None))
        token, expires_at = await asyncio.shield(flight)
        self._cache.put(key, token, expires_at)
        return token

    def _at_once(
        self, audience: str, tenant: str | None, held: str | None, trust: str | None
    ) -> tuple[str, float] | None:
        """A new token made without awaiting (and when it expires), or ``None`` when only ``_fetch`` can make one."""
        return None

    @abstractmethod
    async def _fetch(self, audience: str, tenant: str | None, held: str | None, trust: str | None) -> tuple[str, float]:
        """A new token for ``audience`` and when it expires (wall clock): each source says where it comes from."""


class LocalTokens(_Cached):
    """Tokens from an issuer living in this process (the embedded default; the gateway's own role)."""

    def __init__(self, issuer: TokenIssuer | None = None, *, via: str | None = None) -> None:
        self.issuer = issuer or default_issuer()
        self._via = via
        super().__init__(self.issuer.clock)

    def _at_once(
        self, audience: str, tenant: str | None, held: str | None, trust: str | None
    ) -> tuple[str, float] | None:
        """A tenant's token is signed here and now (an exchange verifies the received token first: it awaits)."""
        if held is not None:
            return None
        issued = self.issuer.for_tenant(tenant, audience, via=self._via, trust=trust)
        return issued.token, issued.expires_at

    async def _fetch(self, audience: str, tenant: str | None, held: str | None, trust: str | None) -> tuple[str, float]:
        assert held is not None, "a tenant's token is signed at once (_at_once)"
        served = current()
        presenter = served.agent if served is not None else ""
        issued = await self.issuer.exchange(held, audience=audience, presenter=presenter)
        return issued.token, issued.expires_at


def _refusal(code: Any, status: int) -> type[ReachError]:
    """The class an issuer's refusal names by its code; a code-less answer is read from the HTTP status."""
    if isinstance(code, str) and code in WIRE_CODES:
        return WIRE_CODES[code]
    return InvalidToken if status == InvalidToken.http_status else TokenDenied


class RemoteTokens(_Cached):
    """Tokens from a ``reach issuer`` (or a gateway's issuer role) at ``url``, asked with ``bearer``: a tenant's token,
    or, for an agent that exchanges what it received, that agent's own issuer token."""

    def __init__(self, url: str, *, bearer: str | None = None, timeout: float = 5.0) -> None:
        problem = secure_url_problem(url)
        if problem is not None:
            raise ConfigError(f"issuer URL {url!r}: {problem}")
        self.url = url.rstrip("/") + "/v1/tokens"
        self._bearer = bearer
        self._timeout = timeout
        self._session: Any = None
        super().__init__(time.time)

    async def _fetch(self, audience: str, tenant: str | None, held: str | None, trust: str | None) -> tuple[str, float]:
        import aiohttp

        body: dict[str, Any] = {"audience": audience}
        headers = {"Authorization": f"Bearer {self._bearer}"} if self._bearer else {}
        if held is not None:
            body["subject_token"] = held
        elif tenant is not None:
            body["tenant"] = tenant
        if self._session is None:
            self._session = aiohttp.ClientSession(trust_env=False)
        try:
            async with self._session.post(
                self.url, json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=self._timeout)
            ) as reply:
                answer = await reply.json(content_type=None)
                status = reply.status
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise BackendUnavailable(f"the token issuer at {self.url} did not answer: {exc!r}") from None
        if status != 200 or not isinstance(answer, dict) or "token" not in answer:
            error = answer.get("error") if isinstance(answer, dict) else None
            error = error if isinstance(error, dict) else {}
            message = f"the token issuer refused a token for {audience!r}: {error.get('message') or f'HTTP {status}'}"
            raise _refusal(error.get("type"), status).from_wire(message, None)
        try:
            lifetime = min(float(answer.get("expires_in", DEFAULT_TTL)), MAX_TTL)
        except (TypeError, ValueError):
            lifetime = DEFAULT_TTL
        return str(answer["token"]), time.time() + lifetime

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


_DEFAULT: TokenIssuer | None = None


def default_issuer() -> TokenIssuer:
    """This process's in-process issuer: the embedded default, no setup.

    It signs with the keys in ``$REACH_ISSUER_KEYS`` when set (so processes started with the same keys, the
    gateway's issuer role included, accept each other's tokens), else with a fresh key of this process.
    """
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = TokenIssuer(KeyRing.load(), issuer="reach")
    return _DEFAULT
