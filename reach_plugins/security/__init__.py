"""Trust (DESIGN.md 11.4): per-hop tokens, trust levels, endpoint policy, the L3 content audit.

Per-hop tokens are Ed25519-signed JWTs (PyJWT), 5 minutes by default and 15 at most, bound to one target agent
(``aud``), carried in ``X-Reach-Token``::

    issuer = TokenIssuer(KeyRing.load(["issuer.pem"]), issuer="reach")
    client = ReachClient(registry=..., tokens=LocalTokens(issuer))          # or RemoteTokens("https://issuer")
    agent = ReachAgent("orders", tokens=issuer.verifier())                  # or TokenVerifier(keys=RemoteJwks(...))

Trust levels: endpoint policy (:class:`EndpointPolicy`, a value passed to whatever admits records), the
client's L1/L3 guard (:mod:`.trust_guard`), the L3 content audit (:mod:`.audit`).
"""

from __future__ import annotations

from reach_plugins.endpoints import ANY_NETWORK, SCHEMES, EndpointPolicy, endpoint_problem, parse_networks
from reach_plugins.errors import AuditRefused, InvalidToken, TokenDenied
from reach_plugins.security.audit import AuditEvent, AuditHook, AuditTransport, url_hook
from reach_plugins.security.claims import DEFAULT_TTL, MAX_TTL, Claims
from reach_plugins.security.issuer import Issued, TokenIssuer
from reach_plugins.security.keys import KeyRing, SigningKey
from reach_plugins.security.source import LocalTokens, RemoteTokens, TokenCache, TokenSource, default_issuer
from reach_plugins.security.token_transport import TokenTransport
from reach_plugins.security.trust_guard import TrustGuard, trust_problem
from reach_plugins.security.verifier import KeySource, RemoteJwks, TokenVerifier
from reach_plugins.wire.headers import HEADER_TOKEN

__all__ = [
    "ANY_NETWORK",
    "DEFAULT_TTL",
    "HEADER_TOKEN",
    "MAX_TTL",
    "SCHEMES",
    "AuditEvent",
    "AuditHook",
    "AuditRefused",
    "AuditTransport",
    "Claims",
    "EndpointPolicy",
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
    "TrustGuard",
    "default_issuer",
    "endpoint_problem",
    "parse_networks",
    "trust_problem",
    "url_hook",
]
