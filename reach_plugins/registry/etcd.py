"""The etcd registry (``etcd://host:port[/prefix]``): agents and live instances shared by every process.

Agents are JSON keys under the prefix (``/reach/`` unless the URL names
another) with no lease; instances are keys bound to the lease of the registry
that wrote them (layout in :mod:`reach_plugins.registry.etcd_mirror`). State is
a :class:`MemoryRegistry` fed by one prefix watch and nothing else, so every
process applies the same changes in the same order and the router reads plain
dicts; a write returns once the watch has applied it (read-your-writes).

Liveness has two layers. Each registry holds one lease (TTL 10 s unless told;
etcd's minimum is 2 s) kept alive every TTL/3: that keepalive is the process's
heartbeat, and when the process dies etcd deletes its instance keys, which every
watcher turns into ``instance_deleted``. ``heartbeat()`` writes
``last_heartbeat``/``load``/``status`` into the instance key, judged at read time
as in every backend (from when the watch showed it, by the reader's clock).
``aclose()`` revokes the lease. A lease etcd revoked while this process lives
(a stall, or etcd resuming from a hang longer than the TTL) is replaced at once
and the process's instances are written again under the new one.

While etcd is unreachable the registry fails static: the view stays as last
seen and heartbeat age stops counting (:mod:`reach_plugins.registry.failstatic`),
so an etcd outage is not an outage of every agent. A hung etcd (SIGSTOP) sends
nothing and closes nothing, so the watch probes it every ``PROBE_INTERVAL`` with
a ``PROBE_TIMEOUT`` (and HTTP/2 keepalive pings open streams): a hang is found
within about 3 s and dated from etcd's last answer. When etcd answers again the
watch resumes and the view reconciles (dead instances' leases expire, new ones
join); a ready instance deleted in the first second (``SETTLE_WINDOW``) is held
``SETTLE`` seconds for its owner to write it again.

After a reconnect the watch resumes from the last applied revision; if etcd
compacted it, or came back with less history than we saw, the registry relists
the prefix and applies the difference as ordinary events. The client is
``aetcd`` (asyncio gRPC; the JSON gateway would need a hand-parsed watch stream
and the same lease calls). ``from_url`` loads a first snapshot before returning
(blocking, bounded by ``timeout``) so a new client can route at once; with
``preload=0`` (or ``open_registry(..., snapshot=False)``, what the agent SDK opens a URL with) it returns at
once with an empty view, filled when etcd answers (an agent that must start, serve and register in the
background while etcd is down).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl, urlsplit

from reach_plugins.endpoints import ANY_NETWORK, EndpointPolicy
from reach_plugins.errors import BackendUnavailable, ConfigError, PermissionDenied, RequestError
from reach_plugins.model import AgentDescriptor, Instance, InstanceStatus
from reach_plugins.registry.base import Clock, RegistryEvent, default_clock
from reach_plugins.registry.etcd_access import URL_OPTIONS as ACCESS_OPTIONS
from reach_plugins.registry.etcd_access import EtcdAccess
from reach_plugins.registry.etcd_lease import OwnLease
from reach_plugins.registry.etcd_mirror import EtcdMirror, Keys
from reach_plugins.registry.failstatic import Reachability
from reach_plugins.registry.memory import check_filed

try:
    from aetcd import transactions as etcd_txn
    from aetcd.exceptions import ClientError, RevisionCompactedError
    from aetcd.utils import prefix_range_end
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError('the etcd registry needs aetcd: pip install "reach-plugins[etcd]"') from exc

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_PORT: Final = 2379
DEFAULT_PREFIX: Final = "/reach/"
DEFAULT_LEASE_TTL: Final = 10
MIN_LEASE_TTL: Final = 2
_URL_OPTIONS: Final = ("lease_ttl", "timeout", "preload")
_CHANNEL_OPTIONS: Final = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 3_000,
    "grpc.http2.max_pings_without_data": 0,
}
"""Reconnect fast; HTTP/2 keepalive pings on open streams (etcd refuses pings more often than every 5 s) so a
connection to a dead peer is closed. A hung etcd is found faster by the watch's probes (PROBE_INTERVAL)."""
PROBE_INTERVAL: Final = 1.0
"""Seconds between the watch's probes: a hung etcd (SIGSTOP) sends no event and closes nothing, so silence is
asked about every second."""
PROBE_TIMEOUT: Final = 2.0
"""A probe not answered within this is an outage: the view fails static from the last answer on (DESIGN 11.3)."""
_RETRY_MIN, _RETRY_MAX = 0.1, 1.0


class EtcdRegistry:
    """A :class:`~reach_plugins.registry.base.Registry` in etcd, shared by every process that opens it.

    The watch starts on ``start()``, on the first async call, or on the first
    read made inside a running event loop; reads before it see the snapshot
    loaded by ``from_url``. Errors talking to etcd raise :class:`BackendUnavailable`.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        prefix: str = DEFAULT_PREFIX,
        lease_ttl: int = DEFAULT_LEASE_TTL,
        timeout: float = 5.0,
        clock: Clock | None = None,
        access: EtcdAccess | None = None,
        endpoints: EndpointPolicy = ANY_NETWORK,
    ) -> None:
        if isinstance(lease_ttl, bool) or not isinstance(lease_ttl, int) or lease_ttl < MIN_LEASE_TTL:
            raise ConfigError(
                f"etcd lease_ttl must be whole seconds >= {MIN_LEASE_TTL} (etcd's minimum), got {lease_ttl!r}"
            )
        if timeout <= 0:
            raise ConfigError(f"etcd timeout must be positive seconds, got {timeout!r}")
        self.host, self.port, self.lease_ttl, self.timeout = host, port, lease_ttl, timeout
        self.access = access or EtcdAccess()
        self.address = f"{host}:{port}"
        self.prefix = "/" + prefix.strip("/") + "/" if prefix.strip("/") else "/"
        self._keys = Keys(self.prefix)
        self.endpoints = endpoints
        self._mirror = EtcdMirror(self._keys, clock or default_clock, endpoints)
        self._cache = self._mirror.cache
        self._reach = Reachability()
        """When the watch was lost: heartbeat age does not count then (fail static, DESIGN 11.3)."""
        self._contact = self.clock()
        """When etcd last answered (registry clock): an outage found later is dated from here."""
        self._client: Any = None
        self._lease = OwnLease(
            ttl=lease_ttl, where=self.address, grant=self._grant, refresh=self._refresh, rewrite=self._rewrite
        )
        self._relist = True
        self._watching = asyncio.Event()
        self._watch_task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def clock(self) -> Clock:
        return self._mirror.clock

    @clock.setter
    def clock(self, clock: Clock) -> None:
        self._mirror.clock = clock

    @property
    def reachable(self) -> bool:
        """Whether etcd answers: False from a lost watch or a missed probe until the watch is back."""
        return self._reach.reachable

    @property
    def tenants(self) -> None:
        """etcd holds agents only: a client takes its tenant table from its own ``tenants=``."""
        return None

    # ------------------------------------------------------------------ read side (sync, from the cache)

    @property
    def revision(self) -> int:
        self._ensure_started()
        return self._cache.revision

    @property
    def health(self) -> int:
        return self._cache.health

    def agents(self) -> Mapping[str, AgentDescriptor]:
        self._ensure_started()
        return self._cache.agents()

    def instances(self, agent: str) -> Mapping[str, Instance]:
        return self._cache.instances(agent)

    def is_alive(self, instance: Instance, now: float) -> bool:
        """Judged as every backend does, except that time while etcd was unreachable does not age a heartbeat."""
        seen = instance.last_heartbeat
        return self._cache.is_alive(instance, now if seen is None else self._reach.heartbeat_time(seen, now))

    def sweep(self) -> list[RegistryEvent]:
        """Emit ``instance_down`` / ``instance_up`` for liveness changes since the last sweep."""
        return self._cache.sweep()

    def watch(self) -> AsyncIterator[RegistryEvent]:
        """Changes from now on, in etcd's order, as every process sees them."""
        self._ensure_started()
        return self._cache.watch()

    async def get(self, name: str) -> AgentDescriptor | None:
        await self.start()
        return await self._cache.get(name)

    async def match(self, capability: str, *, intent: str | None = None) -> list[AgentDescriptor]:
        await self.start()
        return await self._cache.match(capability, intent=intent)

    # ------------------------------------------------------------------ writes

    async def register_agent(self, descriptor: AgentDescriptor) -> None:
        check_filed(descriptor)
        self.endpoints.admit((i.endpoint for i in descriptor.static_instances()), f"agent {descriptor.name!r}")
        client = await self._ready()
        key = self._keys.agent(descriptor.name)
        put = await self._call("register an agent", client.put(key, descriptor.model_dump_json().encode()))
        await self._caught_up(put.header.revision)

    async def deregister_agent(self, name: str) -> None:
        """Delete the agent and every instance key under it, atomically."""
        self._lease.forget(name)
        client = await self._ready()
        instances = self._keys.instances_of(name)
        ops = [
            etcd_txn.Delete(instances, range_end=prefix_range_end(instances)),
            etcd_txn.Delete(self._keys.agent(name)),
        ]
        _, replies = await self._call("deregister an agent", client.transaction(compare=[], success=ops, failure=[]))
        if any(reply.response_delete_range.deleted for reply in replies):
            await self._caught_up(replies[-1].response_delete_range.header.revision)

    async def register_instance(self, instance: Instance) -> None:
        """Write the instance under this registry's lease; refused unless its agent is registered."""
        self.endpoints.admit([instance.endpoint], f"instance {instance.agent}/{instance.instance_id}")
        await self._ready()
        guard, key = self._keys.agent(instance.agent), self._keys.instance(instance.agent, instance.instance_id)
        revision = None
        if instance.agent in self._cache.agents():
            try:
                revision = await self._put_if_exists(guard, key, instance, await self._lease.get())
            except BackendUnavailable as exc:
                if "lease not found" not in str(exc):
                    raise
                self._lease.id = None
                revision = await self._put_if_exists(guard, key, instance, await self._lease.get())
        if revision is None:
            raise RequestError(
                f"cannot register instance {instance.instance_id!r}: agent {instance.agent!r} is not registered; "
                "register the agent first"
            )
        self._lease.wrote(instance, new=True)
        await self._caught_up(revision)

    async def deregister_instance(self, agent: str, instance_id: str) -> None:
        self._lease.forget(agent, instance_id)
        client = await self._ready()
        deleted = await self._call("deregister an instance", client.delete(self._keys.instance(agent, instance_id)))
        if deleted is not None:
            await self._caught_up(deleted.header.revision)

    async def heartbeat(
        self,
        agent: str,
        instance_id: str,
        seq: int,
        *,
        load: float | None = None,
        status: InstanceStatus | None = None,
    ) -> None:
        """Write a newer heartbeat into the instance key (same lease); a stale ``seq`` is ignored."""
        await self._ready()
        current = self._cache.instances(agent).get(instance_id)
        unknown = (
            f"heartbeat for unknown instance {agent}/{instance_id}; register the instance again "
            "(its lease may have expired or it was deregistered)"
        )
        if current is None:
            raise RequestError(unknown)
        if seq <= current.heartbeat_seq:
            return
        if load is not None and not 0.0 <= load <= 1.0:
            raise RequestError(f"heartbeat load must lie in [0, 1], got {load!r} from {agent}/{instance_id}")
        changes: dict[str, object] = {"heartbeat_seq": seq, "last_heartbeat": self.clock()}
        if load is not None:
            changes["load"] = load
        if status is not None:
            changes["status"] = status
        key = self._keys.instance(agent, instance_id)
        lease = self._mirror.lease_of(agent, instance_id)
        record = current.model_copy(update=changes)
        revision = await self._put_if_exists(key, key, record, lease)
        if revision is None:
            raise RequestError(unknown)
        self._lease.wrote(record, new=False)
        await self._caught_up(revision)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the watch (if not yet running) and wait until it is established."""
        if self._closed:
            raise ConfigError(f"etcd registry {self.address}{self.prefix} is closed; open a new one")
        self._ensure_started()
        if self._watching.is_set():
            return
        try:
            async with asyncio.timeout(self.timeout):
                await self._watching.wait()
        except TimeoutError as exc:
            raise BackendUnavailable(
                f"etcd at {self.address} did not answer within {self.timeout:g}s; check that it runs there"
            ) from exc

    async def aclose(self) -> None:
        """Stop watching and keeping alive, revoke the lease (its instances leave now), end watch streams.

        Every step is bounded by the registry's timeout: a watch stream or a channel that does not wind down
        (grpc and aetcd give no such promise) is logged and left behind, never waited on forever.
        """
        self._closed = True
        tasks = self._lease.stop()
        if self._watch_task is not None:
            self._watch_task.cancel()
            tasks.append(self._watch_task)
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=self.timeout)
            if stuck:
                logger.warning(
                    "etcd registry %s: %d task(s) did not stop within %gs", self.address, len(stuck), self.timeout
                )
        self._watch_task = None
        client, self._client = self._client, None
        if client is not None:
            if self._lease.id is not None:
                with contextlib.suppress(BackendUnavailable):
                    await self._call(
                        "revoke the lease", asyncio.wait_for(client.revoke_lease(self._lease.id), self.timeout)
                    )
            try:
                await asyncio.wait_for(client.close(), self.timeout)
            except TimeoutError:
                logger.warning("etcd registry %s: the channel did not close within %gs", self.address, self.timeout)
        self._lease.id = None
        await self._cache.aclose()

    # ------------------------------------------------------------------ etcd calls

    def _connect(self) -> Any:
        if self._client is None:
            self._client = self.access.client(self.host, self.port, timeout=self.timeout, options=_CHANNEL_OPTIONS)
        return self._client

    async def _call(self, what: str, operation: Awaitable[T]) -> T:
        """Await an aetcd call, mapping its errors to :class:`BackendUnavailable`."""
        try:
            return await operation
        except (ClientError, TimeoutError) as exc:
            if "permission denied" in str(exc):
                raise PermissionDenied(
                    f"etcd at {self.address} refused to let this registry's user {what}: permission denied "
                    "(agents may write only their own instance keys; descriptors are the operators')"
                ) from exc
            raise BackendUnavailable(f"etcd at {self.address} could not {what}: {exc or type(exc).__name__}") from exc

    async def _ready(self) -> Any:
        await self.start()
        return self._connect()

    async def _put_if_exists(self, guard: bytes, key: bytes, record: Instance, lease: int) -> int | None:
        """Put ``record`` at ``key`` if ``guard`` exists; the revision written, or None if it did not."""
        client = self._connect()
        put = etcd_txn.Put(key, record.model_dump_json().encode(), lease=lease or None)
        ok, replies = await self._call(
            "write an instance", client.transaction(compare=[etcd_txn.Version(guard) > 0], success=[put], failure=[])
        )
        return int(replies[0].response_put.header.revision) if ok else None

    async def _grant(self) -> int:
        return int((await self._call("grant a lease", self._connect().lease(self.lease_ttl))).id)

    async def _refresh(self, lease: int) -> int:
        reply = await self._call("keep the lease alive", self._connect().refresh_lease(lease))
        return 0 if reply is None else int(reply.TTL)

    async def _rewrite(self, instance: Instance, lease: int) -> bool:
        key = self._keys.instance(instance.agent, instance.instance_id)
        return await self._put_if_exists(self._keys.agent(instance.agent), key, instance, lease) is not None

    async def _caught_up(self, revision: int) -> None:
        """Wait until the watch has applied our own write (bounded: a lagging watch only logs)."""
        if not await self._mirror.caught_up(revision, self.timeout):
            logger.warning("etcd watch at %s has not delivered revision %d yet; the view lags", self.address, revision)

    # ------------------------------------------------------------------ watch -> cache

    def _ensure_started(self) -> None:
        if self._watch_task is not None or self._closed:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self._watch_task = asyncio.create_task(self._watch_forever(), name=f"reach-etcd-watch {self.address}")

    async def _watch_forever(self) -> None:
        delay = _RETRY_MIN
        while not self._closed:
            client = self._connect()
            try:
                await self._resync(client)
                watch = await client.watch_prefix(self._keys.prefix, start_revision=self._mirror.applied + 1)
                self._watching.set()
                self._contact = self.clock()
                self._reach.found(self._contact)
                delay = _RETRY_MIN
                await self._follow(client, watch)
            except RevisionCompactedError:
                logger.info("etcd compacted past revision %d; relisting %s", self._mirror.applied, self.prefix)
                self._relist = True
            except Exception as exc:
                if self._closed:
                    return  # aclose ended the stream (a cancellation aetcd may have turned into an error)
                self._watching.clear()
                first = self._reach.reachable
                self._reach.lost(self._contact if first else self.clock())
                lost = isinstance(exc, (ClientError, TimeoutError))
                self._relist = self._relist or not lost
                logger.log(
                    logging.WARNING if first or not lost else logging.DEBUG,
                    "etcd watch at %s lost (%r), retry in %.1fs; routing keeps the last view meanwhile",
                    self.address,
                    exc,
                    delay,
                    exc_info=not lost,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX)

    async def _follow(self, client: Any, watch: Any) -> None:
        """Apply watch events until the stream ends, or until etcd misses a probe (raising ``TimeoutError``).

        A hung etcd keeps the stream open and silent; a read bounded by PROBE_TIMEOUT every PROBE_INTERVAL tells
        it from a quiet one within a few seconds.
        """
        events = asyncio.ensure_future(self._apply(watch))
        try:
            while True:
                done, _ = await asyncio.wait({events}, timeout=PROBE_INTERVAL)
                if done:
                    return events.result()
                await asyncio.wait_for(client.get(self._keys.prefix + b"\x00"), PROBE_TIMEOUT)
                self._contact = self.clock()
                await self._mirror.expire()
        finally:
            events.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(watch.cancel(), PROBE_TIMEOUT)

    async def _apply(self, watch: Any) -> None:
        async for event in watch:
            self._contact = self.clock()
            parsed = self._keys.parse(event.kv.key) if event.kind == "DELETE" else None
            lease = 0 if parsed is None or parsed[1] is None else self._mirror.lease_of(parsed[0], parsed[1])
            await self._mirror.apply_event(event)
            if parsed is not None and parsed[1] is not None:
                self._lease.deleted(parsed[0], parsed[1], lease)

    async def _resync(self, client: Any) -> None:
        """Relist when asked to, or when etcd is behind what we saw (it lost its data); else resume."""
        if not self._relist:
            probe = await client.get_prefix(self._keys.prefix + b"\x00")
            self._answered()
            if probe.header.revision >= self._mirror.applied:
                return
            logger.warning("etcd at %s restarted without its data; relisting %s", self.address, self.prefix)
        listing = await client.get_prefix(self._keys.prefix)
        self._answered()
        await self._mirror.apply_listing(listing)
        self._relist = False

    def _answered(self) -> None:
        """etcd answered: if that ends an outage, the mirror holds the deletions that follow at once (SETTLE)."""
        if not self._reach.reachable:
            self._mirror.outage_over()

    def _preload(self) -> None:
        """Load the current state now, blocking (on a thread of its own: works inside a running loop too)."""
        with ThreadPoolExecutor(1, thread_name_prefix="reach-etcd-load") as pool:
            pool.submit(asyncio.run, self._load()).result()

    async def _load(self) -> None:
        client = self.access.client(self.host, self.port, timeout=self.timeout)
        try:
            listing = await self._call("read the registry", client.get_prefix(self._keys.prefix))
            await self._mirror.apply_listing(listing)
        finally:
            await client.close()
        self._relist = False

    async def list(self) -> list[AgentDescriptor]:
        """Every registered agent (last in the class: the name shadows ``list`` in annotations)."""
        await self.start()
        return await self._cache.list()


def from_url(
    url: str, *, clock: Clock | None = None, endpoints: EndpointPolicy = ANY_NETWORK, snapshot: bool = True
) -> EtcdRegistry:
    """``etcd://host:port[/prefix][?lease_ttl=10&timeout=5&preload=1]`` -> a registry holding the current snapshot
    (``preload=0``, or ``snapshot=False`` when the URL does not say: an empty one, filled by the watch once etcd
    answers)."""
    parts = urlsplit(url)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(options.keys() - set(_URL_OPTIONS) - set(ACCESS_OPTIONS))
    if "@" in parts.netloc:
        raise ConfigError(
            "etcd registry URL: no user:password@ in the URL (it ends up in logs); use ?user=NAME with the password "
            "in REACH_ETCD_PASSWORD (or password_env=VAR), or a client certificate (?cert=...&key=...)"
        )
    if parts.scheme != "etcd" or not parts.hostname or unknown:
        raise ConfigError(
            f"registry URL {url!r}: write etcd://HOST:PORT[/PREFIX] with optional "
            f"?{'&'.join(f'{name}=...' for name in (*_URL_OPTIONS, *ACCESS_OPTIONS))}"
            + (f" (unknown option {', '.join(unknown)})" if unknown else "")
        )
    try:
        port = parts.port or DEFAULT_PORT
        lease_ttl = int(options.get("lease_ttl", DEFAULT_LEASE_TTL))
        timeout = float(options.get("timeout", 5.0))
        preload = {"1": True, "0": False}[options.get("preload", "1" if snapshot else "0")]
    except KeyError:
        raise ConfigError(f"registry URL {url!r}: preload is 1 (load a snapshot first, the default) or 0") from None
    except ValueError as exc:
        raise ConfigError(f"registry URL {url!r}: {exc}; port and lease_ttl are integers, timeout is seconds") from exc
    prefix = parts.path if parts.path.strip("/") else DEFAULT_PREFIX
    access = EtcdAccess.from_options(options)
    registry = EtcdRegistry(
        parts.hostname,
        port,
        prefix=prefix,
        lease_ttl=lease_ttl,
        timeout=timeout,
        clock=clock,
        access=access,
        endpoints=endpoints,
    )
    if preload:
        registry._preload()
    return registry
