"""Per-hop tokens (DESIGN.md 11.4): an issuer, JWKS, verification, and the caller's token sources.

    issuer = TokenIssuer(KeyRing.load(["issuer.pem"]), issuer="reach")
    client = ReachClient(registry=..., tokens=LocalTokens(issuer))          # or RemoteTokens("https://issuer")
    agent = ReachAgent("orders", tokens=issuer.verifier())                  # or TokenVerifier(keys=RemoteJwks(...))

Tokens are Ed25519-signed JWTs (PyJWT), 5 minutes by default and 15 at
most, bound to one target agent (``aud``), carried in ``X-Reach-Token``.
"""

from __future__ import annotations

from reach_plugins.tokens.claims import DEFAULT_TTL, HEADER_TOKEN, MAX_TTL, Claims
from reach_plugins.tokens.errors import InvalidToken, TokenDenied
from reach_plugins.tokens.issuer import Issued, TokenIssuer
from reach_plugins.tokens.keys import KeyRing, SigningKey
from reach_plugins.tokens.source import LocalTokens, RemoteTokens, TokenCache, TokenSource, default_issuer
from reach_plugins.tokens.transport import TokenTransport
from reach_plugins.tokens.verifier import KeySource, RemoteJwks, TokenVerifier

__all__ = [
    "DEFAULT_TTL",
    "HEADER_TOKEN",
    "MAX_TTL",
    "Claims",
    "InvalidToken",
    "Issued",
    "KeyRing",
    "KeySource",
    "LocalTokens",
    "RemoteJwks",
    "RemoteTokens",
    "SigningKey",
    "TokenCache",
    "TokenDenied",
    "TokenIssuer",
    "TokenSource",
    "TokenTransport",
    "TokenVerifier",
    "default_issuer",
]
