"""The server side of a reach, shared by the gateway and the node: route, then the one core, then the next hop.

It composes exactly what :class:`~reach_plugins.client.client.ReachClient` composes —
a :class:`~reach_plugins.routing.Router` and the core
:class:`~reach_plugins.core.Pipeline` around a transport — with two
request-scoped routing rules only a server has: pins sent by the caller
(:class:`~reach_plugins.routing.pinning.TargetedRouter`) and ``internal_only`` by
source address (:class:`~reach_plugins.server.access.SourceRule`). Retries,
breakers, dedup and limits are the core's; nothing here re-implements them.

The next hop is :class:`HopTransport`: DirectTransport for ``http(s)://``
endpoints, and the Reach node at ``host:port`` for an instance whose endpoint
is ``grpc://host:port`` (node-to-node forwarding).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.attempts.quotas import Quotas
from reach_plugins.config.loader import (
    NO_SECRETS_POLICY,
    SecretsPolicy,
    TenantConfig,
    resolve_credential,
    token_envs,
)
from reach_plugins.config.quotas import QuotaConfig
from reach_plugins.errors import UnknownCapability
from reach_plugins.model import AgentDescriptor, Instance, LoopSettings, ReachRequest, ReachResponse, ReliefPolicy
from reach_plugins.policy.outliers import Standing
from reach_plugins.registry import FileRegistry
from reach_plugins.registry.base import Registry
from reach_plugins.registry.routetable import RouteTable, watch_task
from reach_plugins.routing import Router
from reach_plugins.routing.index import Offer
from reach_plugins.routing.pinning import TargetedRouter
from reach_plugins.routing.policy import tenant_denial
from reach_plugins.routing.probes import Prober
from reach_plugins.routing.status import InstanceStatus, judge
from reach_plugins.server.access import SourceRule
from reach_plugins.stores.urls import open_store
from reach_plugins.transport import BaseTransport, Call, Credential, EventStream, Reply, Transport
from reach_plugins.wire.headers import HEADER_SOURCE, PREFER, SOURCE, TARGET, UNKNOWN_SOURCE, VIA

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from reach_plugins.stores.dedup import DedupStore
    from reach_plugins.telemetry.trace import TraceSink

NODE_SCHEME = "grpc://"


class HopTransport(BaseTransport):
    """DirectTransport to agents; :class:`~transports.grpcnode.GrpcNodeTransport` to ``grpc://`` instances.

    A forwarded call drops the caller's pins (they name instances of *this*
    server's registry) and adds ``node_id`` to the ``reach.via`` chain, which
    the next node checks to stop forwarding loops. The next node is reached
    with the tenant's credential for that "agent" (say, the tenant's token).
    """

    owns_retries = False

    def __init__(self, direct: Transport | None = None, *, node_id: str | None = None) -> None:
        if direct is None:
            from transports.direct import DirectTransport

            direct = DirectTransport()
        self._direct = direct
        self._node_id = node_id
        self._nodes: dict[str, Transport] = {}

    def _next(self, call: Call) -> tuple[Transport, Call]:
        endpoint = call.instance.endpoint
        if not endpoint.startswith(NODE_SCHEME):
            return self._direct, call
        target = endpoint.removeprefix(NODE_SCHEME).rstrip("/")
        node = self._nodes.get(target)
        if node is None:
            from transports.grpcnode import GrpcNodeTransport

            node = self._nodes[target] = GrpcNodeTransport(target, use_credential=True)
        metadata = {k: v for k, v in call.request.metadata.items() if k not in (TARGET, PREFER)}
        if self._node_id:
            chain = metadata.get(VIA)
            metadata[VIA] = f"{chain},{self._node_id}" if chain else self._node_id
        headers = {**call.headers, HEADER_SOURCE: metadata.get(SOURCE, UNKNOWN_SOURCE)}
        return node, replace(call, request=call.request.model_copy(update={"metadata": metadata}), headers=headers)

    async def send(self, call: Call) -> Reply:
        transport, call = self._next(call)
        return await transport.send(call)

    async def stream(self, call: Call) -> EventStream:
        transport, call = self._next(call)
        async for event in transport.stream(call):
            yield event

    async def aclose(self) -> None:
        for transport in [self._direct, *self._nodes.values()]:
            await transport.aclose()
        self._nodes.clear()


class Forwarder:
    """Runs requests received by a server through router + core + next hop, on behalf of their tenant."""

    def __init__(
        self,
        registry: Registry,
        *,
        tenants: Mapping[str, TenantConfig],
        transport: Transport | None = None,
        store: DedupStore | str | None = None,
        environ: Mapping[str, str] = os.environ,
        secrets: SecretsPolicy = NO_SECRETS_POLICY,
        tracer_provider: TracerProvider | None = None,
        route_ttl: float = 1.0,
        default_timeout: float = 30.0,
        node_id: str | None = None,
        owns_registry: bool = False,
        sink: TraceSink | None = None,
        probes: bool = True,
        direct: Transport | None = None,
        quotas: QuotaConfig | None = None,
        loops: LoopSettings | None = None,
        relief: ReliefPolicy | None = None,
    ) -> None:
        self.registry = registry
        self._owns_registry = owns_registry
        self.tenants = tenants
        self._environ = environ
        self._secrets = secrets
        self._tenant_tokens = token_envs(tenants)
        """The tenants' own token variables: never sent as an agent's secret, whatever a descriptor names."""
        self.table = RouteTable(registry, ttl=route_ttl)
        self.router = Router(
            self.table, tenants=tenants, is_available=self._available, standing=self._standing, relief=relief
        )
        self.rule = SourceRule(self.router, self.table, tenants)
        self.transport = transport if transport is not None else HopTransport(direct, node_id=node_id)
        self._owned_store = open_store(store) if isinstance(store, str) else None
        """A store opened here from a URL (``redis://``: idempotency shared by every worker), closed here too."""
        self.quotas = Quotas(quotas) if quotas is not None else None
        """The fleet's quotas (``quotas:`` of the config): every request this server forwards draws from them."""
        self.pipeline = Pipeline(
            router=TargetedRouter(self.rule),
            transport=self.transport,
            store=self._owned_store if isinstance(store, str) else store,
            credentials=self._credential,
            tracer_provider=tracer_provider,
            default_timeout=default_timeout,
            sink=sink,
            quotas=self.quotas,
            loops=loops,
            turns=self.router.relief,
        )
        self._watch: asyncio.Task[None] | None = None
        self.prober = Prober.shared(self.table) if probes else None
        """Active health probes of the instances behind this server (:mod:`reach_plugins.routing.probes`)."""

    def _available(self, agent: str, instance: str) -> bool:
        """The router's health hook: the breaker admits calls, no ejection, the probes found it up."""
        prober = self.prober
        return self.pipeline.is_available(agent, instance) and (prober is None or prober.available(agent, instance))

    def _standing(self, agent: str, instance: str) -> Standing:
        """The router's outlier port: the instance's share of its weight against its peers (the pipeline judges)."""
        return self.pipeline.standing(agent, instance)

    def _credential(self, agent: AgentDescriptor, tenant: str | None) -> Credential:
        """The tenant's own credential for ``agent`` (else the agent's): never another tenant's."""
        config = self.tenants.get(tenant) if tenant is not None else None
        return resolve_credential(
            agent, config, self._environ, secrets=self._secrets, tenant_tokens=self._tenant_tokens
        )

    async def start(self) -> None:
        """Follow registry changes (the route table then never waits out its TTL); poll a YAML file registry."""
        if isinstance(self.registry, FileRegistry):
            await self.registry.start()
        if self._watch is None:
            self._watch = watch_task(self.table, self.registry)
            if self.prober is not None:
                self.prober.acquire()

    async def run(self, request: ReachRequest) -> ReachResponse:
        try:
            return await self.pipeline.run(request)
        except UnknownCapability as exc:
            raise self._unknown(request, exc) from None

    async def stream(self, request: ReachRequest) -> EventStream:
        try:
            async for event in self.pipeline.stream(request):
                yield event
        except UnknownCapability as exc:
            raise self._unknown(request, exc) from None

    def _unknown(self, request: ReachRequest, exc: UnknownCapability) -> UnknownCapability:
        """``exc`` with its "closest known" names cut to capabilities the caller may see from where it is."""
        source = request.metadata.get(SOURCE) if request.metadata else None
        seen = {c["name"] for agent in self.visible(request.tenant, source) for c in agent["capabilities"]}
        return UnknownCapability(exc.capability, known=[name for name in exc.known if name in seen])

    def visible(self, tenant: str | None, source: str | None) -> list[dict[str, Any]]:
        """The agents ``tenant`` may reach from ``source``: capabilities and what routing would decide about each
        instance now (:mod:`reach_plugins.routing.status`), never endpoints."""
        probe = ReachRequest(capability="-", tenant=tenant, metadata={SOURCE: source or UNKNOWN_SOURCE})
        outside = self.rule.outside(probe)
        now = self.registry.clock()
        listed = []
        for name, agent in sorted(self.table.agents().items()):
            offer = Offer(agent, agent.capabilities[0], name, 0, 1) if agent.capabilities else None
            if offer is None or tenant_denial(offer, tenant, self.tenants) is not None:
                continue
            if agent.internal_only and outside:
                continue
            instances = [self.status(i, now, tenant).as_json() for i in self.table.instances(name).values()]
            capabilities = [
                {
                    "name": c.name,
                    "description": c.description,
                    "params_schema": c.params_schema,
                    "return_schema": c.return_schema,
                    "scope_tags": list(c.scope_tags),
                }
                for c in agent.capabilities
            ]
            listed.append(
                {"name": name, "description": agent.description, "capabilities": capabilities, "instances": instances}
            )
        return listed

    def loops(self, tenant: str | None, source: str | None) -> list[dict[str, Any]]:
        """The dependency loops this server sees now, between agents ``tenant`` may reach from ``source``."""
        seen = {agent["name"] for agent in self.visible(tenant, source)}
        return [pair.as_json() for pair in self.pipeline.loops.pairs() if {pair.first, pair.second} <= seen]

    def status(self, inst: Instance, now: float, tenant: str | None = None) -> InstanceStatus:
        """What this server's router would decide about ``inst`` now (``now``: the registry's clock), and why;
        with ``tenant``, that tenant's breaker (else the worst of the tenants')."""
        key = (inst.agent, inst.instance_id)
        prober = self.prober
        return judge(
            inst,
            now,
            alive=self.table.is_alive(inst, now),
            probe=prober.book.last(*key) if prober is not None else None,
            probe_now=prober.now() if prober is not None else 0.0,
            guarded=self.pipeline.guarded(*key, tenant),
            standing=self.pipeline.standing(*key),
            pins=self.router.sessions.active.get(key, 0),
        )

    async def aclose(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
            if self.prober is not None:
                await self.prober.release()
        await self.pipeline.aclose()
        if self.quotas is not None:
            await self.quotas.aclose()
        if self._owned_store is not None:
            await self._owned_store.aclose()
        await self.transport.aclose()
        if self._owns_registry:
            await self.registry.aclose()
