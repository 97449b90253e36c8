"""Trust levels (DESIGN.md 11.4): endpoint policy, the client's L1/L3 guard, the L3 content audit."""

from __future__ import annotations

from reach_plugins.trust.audit import AuditEvent, AuditHook, AuditRefused, AuditTransport, url_hook
from reach_plugins.trust.endpoints import SCHEMES, allow_networks, endpoint_problem, parse_networks, policy_problem
from reach_plugins.trust.guard import TrustGuard, trust_problem

__all__ = [
    "SCHEMES",
    "AuditEvent",
    "AuditHook",
    "AuditRefused",
    "AuditTransport",
    "TrustGuard",
    "allow_networks",
    "endpoint_problem",
    "parse_networks",
    "policy_problem",
    "trust_problem",
    "url_hook",
]
