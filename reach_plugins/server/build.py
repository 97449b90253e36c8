"""The forwarder and access rules a server of ours runs with, from its config file (gateway and node alike)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from reach_plugins.config.loader import load_config
from reach_plugins.endpoints import EndpointPolicy
from reach_plugins.errors import ConfigError
from reach_plugins.registry import FileRegistry, Registry, open_registry
from reach_plugins.security.issuer import TokenIssuer
from reach_plugins.server.access import Access
from reach_plugins.server.forwarder import Forwarder
from reach_plugins.server.issuer_role import agent_transport, build_issuer

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from reach_plugins.security.audit import AuditHook
    from reach_plugins.stores.dedup import DedupStore
    from reach_plugins.telemetry.trace import TraceSink


def build_forwarder(
    config: str | os.PathLike[str],
    *,
    registry: Registry | str | None = None,
    environ: Mapping[str, str] = os.environ,
    tracer_provider: TracerProvider | None = None,
    node_id: str | None = None,
    route_ttl: float = 1.0,
    sink: TraceSink | None = None,
    allow_open: bool = False,
    issuer: TokenIssuer | None = None,
    via: str | None = None,
    audit: AuditHook | str | None = None,
    store: DedupStore | str | None = None,
) -> tuple[Forwarder, Access]:
    """The forwarder and access rules a server runs with.

    Tenants (tokens, allow-lists, networks, credentials) come from ``config``
    and are read once at start. Agents come from ``registry`` when given,
    else from ``config`` itself, which is then reloaded when it changes. A
    config without tenants would serve anyone as any tenant: refused unless
    ``allow_open``. Agents are reached with a token of ``issuer`` each (by
    default one signing with ``$REACH_ISSUER_KEYS``, else a key of this
    process), marked ``via``; L3 agents only with ``audit`` set. Idempotency
    keys are held in ``store`` (a ``redis://`` URL shares them between processes).
    Agent endpoints obey the networks ``$REACH_ENDPOINT_NETWORKS`` in ``environ`` names (read here, once), in the
    file and in a registry opened from a URL.
    """
    path = Path(config)
    endpoints = EndpointPolicy.from_environ(environ)
    loaded = load_config(path, endpoints=endpoints)
    tenants = loaded.tenants
    if not tenants and not allow_open:
        raise ConfigError(
            f"{path}: no 'tenants:' section, so the server would serve anyone as any tenant it names; "
            "add tenants with token_env, or start it open on purpose with --allow-open (allow_open=True)"
        )
    access = Access(tenants, environ)
    source = (
        FileRegistry(path, endpoints=endpoints) if registry is None else open_registry(registry, endpoints=endpoints)
    )
    forwarder = Forwarder(
        source,
        tenants=tenants,
        environ=environ,
        secrets=loaded.secrets,
        tracer_provider=tracer_provider,
        node_id=node_id,
        route_ttl=route_ttl,
        owns_registry=registry is None or isinstance(registry, str),
        direct=agent_transport(issuer or build_issuer(tenants, environ=environ), via=via, audit=audit),
        sink=sink,
        store=store,
        quotas=loaded.quotas,
        loops=loaded.loops,
        relief=loaded.relief,
    )
    return forwarder, access
