"""Verify a Reach token: signature against the issuer's JWKS, expiry, issuer, audience, chain.

Keys come from a :class:`KeySource`: the issuer's ring in-process, or
:class:`RemoteJwks` (the issuer's ``/.well-known/jwks.json``, cached, fetched
again when a token names an unknown ``kid`` — that is how a key rotation
reaches every agent without a restart). A token already verified is kept
(bounded) until it expires, so the common case — the caller's cached token,
again — costs a dict lookup and a clock read instead of a signature check.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final, Protocol

import jwt

from reach_plugins.errors import ConfigError, InvalidToken, TokenClockSkew, TokenDenied
from reach_plugins.security.claims import MAX_CHAIN, Claims
from reach_plugins.security.keys import ALGORITHM
from reach_plugins.security.urls import secure_url_problem

LEEWAY: Final = 30.0
"""Seconds of clock skew tolerated on ``exp``, ``nbf`` and ``iat`` (checked here, on the verifier's clock, not by
PyJWT's): clocks a little apart never refuse a fresh token."""
_REQUIRED: Final = ["iss", "sub", "aud", "exp", "jti"]


class KeySource(Protocol):
    """The public keys a verifier trusts, by ``kid``."""

    def key(self, kid: str) -> Any: ...

    async def refresh(self) -> None: ...


class RemoteJwks:
    """An issuer's JWKS fetched over HTTP(S), refreshed every ``ttl`` and on an unknown ``kid`` (at most every 5 s)."""

    def __init__(
        self, url: str, *, ttl: float = 300.0, min_interval: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        problem = secure_url_problem(url)
        if problem is not None:
            raise ConfigError(f"JWKS URL {url!r}: {problem} (https://issuer/.well-known/jwks.json)")
        self.url, self.ttl, self.min_interval = url, ttl, min_interval
        self._clock = clock
        self._keys: dict[str, Any] = {}
        self._fetched = -float("inf")
        self._lock = asyncio.Lock()

    def key(self, kid: str) -> Any:
        return self._keys.get(kid) if self._clock() - self._fetched < self.ttl else None

    async def refresh(self) -> None:
        async with self._lock:
            if self._clock() - self._fetched < self.min_interval:
                return
            import aiohttp

            try:
                async with (
                    aiohttp.ClientSession(trust_env=False) as session,
                    session.get(self.url, timeout=aiohttp.ClientTimeout(total=5), allow_redirects=False) as reply,
                ):
                    document = await reply.json(content_type=None) if reply.status == 200 else None
            except (aiohttp.ClientError, TimeoutError, ValueError):
                document = None
            self._fetched = self._clock()
            if isinstance(document, dict):
                self._keys = parse_jwks(document)


def parse_jwks(document: dict[str, Any]) -> dict[str, Any]:
    """``kid -> public key`` for the signing keys of a JWKS document (others are skipped)."""
    keys: dict[str, Any] = {}
    for entry in document.get("keys") or []:
        if not isinstance(entry, dict) or entry.get("alg", ALGORITHM) != ALGORITHM or not entry.get("kid"):
            continue
        try:
            keys[str(entry["kid"])] = jwt.PyJWK(entry, algorithm=ALGORITHM).key
        except jwt.PyJWTError:
            continue
    return keys


def _header(token: str) -> dict[str, Any]:
    """The JOSE header, read directly (PyJWT's ``get_unverified_header`` costs as much as a third of a check)."""
    try:
        encoded = token.split(".", 1)[0]
        header = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
    except (ValueError, UnicodeDecodeError):
        header = None
    if not isinstance(header, dict):
        raise InvalidToken("the X-Reach-Token is not a JWT (its header does not decode)")
    return header


class TokenVerifier:
    """Checks tokens of ``issuer`` signed by a key of ``keys``; ``verify(token, audience=name)`` per call."""

    def __init__(
        self,
        *,
        issuer: str,
        keys: KeySource,
        leeway: float = LEEWAY,
        max_chain: int = MAX_CHAIN,
        cache_size: int = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.issuer = issuer
        self.keys = keys
        self.leeway = leeway
        self.max_chain = max_chain
        self._clock = clock
        self._cache_size = cache_size
        self._verified: OrderedDict[str, Claims] = OrderedDict()
        self.clock_offset: float | None = None
        """Seconds the issuer's clock is ahead of this one, as last seen (a signed token's ``iat`` minus now)."""

    async def verify(self, token: str | None, *, audience: str | None = None) -> Claims:
        """The token's claims; ``InvalidToken`` (401) or ``TokenDenied`` (403) naming what is wrong."""
        if not token:
            raise InvalidToken(
                "missing X-Reach-Token header: this agent accepts only calls carrying a token from the Reach issuer "
                "(give the client tokens=..., or call through the gateway)"
            )
        claims = self._verified.get(token)
        if claims is None:
            claims = await self._check(token)
            self._remember(token, claims)
        elif claims.expires_at + self.leeway < self._clock():
            del self._verified[token]
            raise self._expired(claims.expires_at, self._clock())
        if audience is not None and claims.audience != audience:
            raise TokenDenied(
                f"the token is for agent {claims.audience!r}, not {audience!r}: tokens are bound to one target and "
                "never forwarded; an agent reaching further exchanges its token at the issuer"
            )
        return claims

    def _remember(self, token: str, claims: Claims) -> None:
        self._verified[token] = claims
        if len(self._verified) > self._cache_size:
            self._verified.popitem(last=False)

    async def _check(self, token: str) -> Claims:
        header = _header(token)
        if header.get("alg") != ALGORITHM:
            raise InvalidToken(f"the token is not signed with {ALGORITHM}, the only algorithm of Reach tokens")
        kid = str(header.get("kid") or "")
        key = self.keys.key(kid)
        if key is None:
            await self.keys.refresh()
            key = self.keys.key(kid)
        if key is None:
            raise InvalidToken(f"the token was signed by a key issuer {self.issuer!r} does not publish")
        try:
            payload = jwt.decode(
                token,
                key,
                algorithms=[ALGORITHM],
                issuer=self.issuer,
                options={
                    "require": _REQUIRED,
                    "verify_aud": False,
                    "verify_exp": False,
                    "verify_iat": False,
                    "verify_nbf": False,
                },
            )
            claims = Claims.from_payload(payload)
            self._check_times(payload, claims)
        except jwt.InvalidIssuerError:
            raise InvalidToken(f"the token was not issued by {self.issuer!r}") from None
        except (jwt.PyJWTError, ValueError, KeyError, TypeError) as exc:
            raise InvalidToken(f"the token is invalid: {exc}") from None
        if len(claims.chain) > self.max_chain or claims.subject in claims.chain:
            raise TokenDenied(f"the token's chain {' -> '.join(claims.chain)} is too long or loops")
        return claims

    def _check_times(self, payload: dict[str, Any], claims: Claims) -> None:
        """``exp``, ``nbf`` and ``iat`` against this clock, each with :attr:`leeway`; records :attr:`clock_offset`.

        Runs only on a signed token, so a forged one can neither pass nor move the offset.
        """
        now = self._clock()
        issued = payload.get("iat")
        if issued is not None:
            self.clock_offset = float(issued) - now
            if float(issued) - self.leeway > now:
                raise TokenClockSkew(
                    f"the token was issued at {float(issued):.0f}, {float(issued) - now:.0f} s ahead of this agent's "
                    f"clock ({now:.0f}, leeway {self.leeway:g} s): the clocks are apart; nothing was executed"
                )
        not_before = payload.get("nbf")
        if not_before is not None and float(not_before) - self.leeway > now:
            raise TokenClockSkew(
                f"the token is not valid before {float(not_before):.0f}; this agent's clock reads "
                f"{now:.0f} (leeway {self.leeway:g} s); nothing was executed"
            )
        if claims.expires_at + self.leeway < now:
            raise self._expired(claims.expires_at, now)

    def _expired(self, expires_at: float, now: float) -> TokenClockSkew:
        return TokenClockSkew(
            f"the token expired at {expires_at:.0f} (unix time) and this agent's clock reads {now:.0f} (leeway "
            f"{self.leeway:g} s): get a new one, or, if it was fresh, this agent's clock is off; nothing was executed"
        )
