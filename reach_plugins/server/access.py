"""Who may reach what through a gateway or a node: bearer tokens per tenant, and ``internal_only`` by address.

The router already enforces each tenant's allow-list and the naming rule of
``internal_only`` agents. What only a server knows is where the caller
connects from: :class:`SourceRule` hides ``internal_only`` agents from a
caller whose source address lies outside its tenant's ``networks``. The
addresses of earlier hops travel in ``X-Reach-Source`` and every one of them
must lie inside: a caller can add addresses (lower its trust), never remove
the one the server sees. An unknown source (a unix socket) is outside.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection, Mapping

from reach_plugins.config.loader import TenantConfig
from reach_plugins.errors import ConfigError, PermissionDenied, Unauthenticated
from reach_plugins.model import ReachRequest
from reach_plugins.registry.base import RegistryView
from reach_plugins.routing import Route
from reach_plugins.routing.pinning import PinningRouter
from reach_plugins.wire.headers import SOURCE


def digest(token: str) -> bytes:
    """Tokens are looked up by digest, so the lookup time says nothing about how much of a guess matched."""
    return hashlib.sha256(token.encode()).digest()


def bearer_of(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (any case of the scheme), else None."""
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


class Access:
    """Bearer token -> tenant, with the tokens read from the environment variables the tenants name.

    Without a tenant table the server is open: requests run under the tenant
    they name (meant for development; say so loudly in front of it).
    """

    def __init__(self, tenants: Mapping[str, TenantConfig], environ: Mapping[str, str] = os.environ) -> None:
        self.tenants = tenants
        self._by_digest: dict[bytes, str] = {}
        self._tokens: dict[str, str] = {}
        for name, tenant in tenants.items():
            if tenant.token_env is None:
                raise ConfigError(
                    f"tenant {name!r} has no token_env, so no caller could ever authenticate as it: add "
                    "'token_env: VARIABLE' (the environment variable holding its bearer token), or remove the tenant"
                )
            token = environ.get(tenant.token_env)
            if not token:
                raise ConfigError(
                    f"tenant {name!r}: environment variable {tenant.token_env} is not set or empty; "
                    "set it to the bearer token this tenant presents"
                )
            key = digest(token)
            if key in self._by_digest:
                raise ConfigError(f"tenants {self._by_digest[key]!r} and {name!r} share one token; give each its own")
            self._by_digest[key] = name
            self._tokens[name] = token

    @property
    def open(self) -> bool:
        """No tenant table: every caller is trusted with the tenant it names."""
        return not self.tenants

    def token(self, tenant: str | None) -> str | None:
        """The bearer token of ``tenant`` (what a node presents when it forwards on the tenant's behalf)."""
        return self._tokens.get(tenant) if tenant is not None else None

    def authenticate(self, authorization: str | None, claimed: str | None) -> str | None:
        """The caller's tenant. ``Unauthenticated`` without a valid token; ``PermissionDenied`` for a foreign claim."""
        if self.open:
            return claimed
        if not authorization:
            raise Unauthenticated(
                "missing 'Authorization: Bearer <token>' header; each tenant presents the token named by its token_env"
            )
        token = bearer_of(authorization)
        if token is None:
            raise Unauthenticated("the Authorization header must read 'Bearer <token>'")
        tenant = self._by_digest.get(digest(token))
        if tenant is None:
            raise Unauthenticated("the bearer token belongs to no tenant of this server")
        if claimed and claimed != tenant:
            raise PermissionDenied(f"the token belongs to tenant {tenant!r}, but the request names tenant {claimed!r}")
        return tenant


def _inside(tenant: TenantConfig | None, address: str) -> bool:
    if tenant is None:
        return False
    try:
        return tenant.allows_address(address)
    except ValueError:
        return False


class SourceRule:
    """Hide ``internal_only`` agents from callers outside their tenant's networks (``reach.source`` metadata).

    It serves servers only, so a request without a source address is outside
    (fail closed). The internal agents offering each capability are cached
    per registry revision, so the check costs a dict lookup on the hot path.
    """

    def __init__(self, router: PinningRouter, view: RegistryView, tenants: Mapping[str, TenantConfig]) -> None:
        self.router = router
        self._view = view
        self._tenants = tenants
        self._revision = -1
        self._cache: dict[str, tuple[frozenset[tuple[str, str]], bool]] = {}

    def route(self, request: ReachRequest, *, exclude: Collection[tuple[str, str]] = ()) -> Route:
        hidden = self._hidden(request)
        if hidden:
            exclude = hidden.union(exclude)
        return self.router.route(request, exclude=exclude)

    def candidates(self, request: ReachRequest, *, limit: int | None = None) -> list[Route]:
        hidden = self._hidden(request)
        if not hidden:
            return self.router.candidates(request, limit=limit)
        routes = [r for r in self.router.candidates(request) if (r.agent.name, r.instance.instance_id) not in hidden]
        return routes[:limit] if limit is not None else routes

    def pinned(
        self, request: ReachRequest, agent: str, instance_id: str, *, exclude: Collection[tuple[str, str]] = ()
    ) -> Route | None:
        """The inner router's O(1) answer for a caller's pin, unless that instance is hidden from this request."""
        if (agent, instance_id) in self._hidden(request):
            return None
        return self.router.pinned(request, agent, instance_id, exclude=exclude)

    def outside(self, request: ReachRequest) -> bool:
        """Whether any address the request came through lies outside its tenant's networks (or is unknown)."""
        chain = request.metadata.get(SOURCE) if request.metadata else None
        if not chain:
            return True
        tenant = self._tenants.get(request.tenant) if request.tenant is not None else None
        return not all(_inside(tenant, address) for address in chain.split(","))

    def _hidden(self, request: ReachRequest) -> frozenset[tuple[str, str]]:
        hidden, only_internal = self._internal(request.capability)
        if not hidden or not self.outside(request):
            return frozenset()
        if only_internal:
            raise PermissionDenied(
                f"capability {request.capability!r} may be reached only from inside tenant {request.tenant!r}'s "
                "networks, and this request came from outside them; ask the operator of this server"
            )
        return hidden

    def _internal(self, capability: str) -> tuple[frozenset[tuple[str, str]], bool]:
        """(instances of internal_only agents offering ``capability``, whether only such agents offer it)."""
        view = self._view
        if view.revision != self._revision:
            self._cache.clear()
            self._revision = view.revision
        found = self._cache.get(capability)
        if found is None:
            offering = [agent for agent in view.agents().values() if agent.capability(capability) is not None]
            internal = [agent.name for agent in offering if agent.internal_only]
            keys = frozenset((name, instance) for name in internal for instance in view.instances(name))
            found = self._cache[capability] = (keys, bool(internal) and len(internal) == len(offering))
        return found
