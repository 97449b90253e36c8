"""This process's etcd lease, and the instances it wrote under it.

One lease per registry, granted on first use and kept alive every TTL/3:
that keepalive is the process's heartbeat (etcd deletes the instance keys
when the process dies). When etcd revokes the lease while the process lives
(a stall, or etcd resuming from a hang longer than the TTL, which revokes at
once every lease that ran out meanwhile) the lease is replaced and the
instances are written again under the new one, so they are back within
moments (routers hold them meanwhile, ``etcd_mirror.SETTLE``). A key deleted
while the lease lives was removed on purpose (an operator's eviction) and
stays gone.

The etcd calls come in as callables, so nothing here knows the client:
``grant()`` a new lease id, ``refresh(lease)`` its remaining TTL (<= 0: gone),
``rewrite(instance, lease)`` whether the instance was written (False: its
agent is gone). They raise :class:`BackendUnavailable` when etcd does not answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from reach_plugins.errors import BackendUnavailable
from reach_plugins.model import Instance

logger = logging.getLogger("reach_plugins.registry.etcd")

Grant = Callable[[], Awaitable[int]]
Refresh = Callable[[int], Awaitable[int]]
Rewrite = Callable[[Instance, int], Awaitable[bool]]


class OwnLease:
    """The lease (``id``, None until granted or once lost) and the last record of each instance written under it."""

    def __init__(self, *, ttl: int, where: str, grant: Grant, refresh: Refresh, rewrite: Rewrite) -> None:
        self.ttl, self.where = ttl, where
        self.id: int | None = None
        self._grant, self._refresh, self._rewrite = grant, refresh, rewrite
        self._own: dict[tuple[str, str], Instance] = {}
        self._gone: dict[tuple[str, str], int] = {}
        """Own instance keys seen deleted, with the lease each was under then."""
        self._keepalive: asyncio.Task[None] | None = None
        self._restoring: asyncio.Task[None] | None = None

    async def get(self) -> int:
        """The lease id, granted on first use (or after a loss) and kept alive from then on."""
        if self.id is None:
            self.id = await self._grant()
        if self._keepalive is None:
            self._keepalive = asyncio.create_task(self._keep_alive(), name=f"reach-etcd-lease {self.where}")
        return self.id

    def wrote(self, instance: Instance, *, new: bool) -> None:
        """Remember the record just written (``new``: a registration; else a heartbeat of an instance owned or not)."""
        key = (instance.agent, instance.instance_id)
        if new or key in self._own:
            self._own[key] = instance

    def forget(self, agent: str, instance_id: str | None = None) -> None:
        """This process deregistered the instance (or, without ``instance_id``, every instance of the agent)."""
        for key in [key for key in self._own if key[0] == agent and instance_id in (None, key[1])]:
            del self._own[key]

    def owns(self, agent: str, instance_id: str) -> bool:
        return (agent, instance_id) in self._own

    def deleted(self, agent: str, instance_id: str, lease: int) -> None:
        """etcd deleted an instance key of ours (last seen under ``lease``): write it again if the lease is gone."""
        if (agent, instance_id) in self._own:
            self._gone[agent, instance_id] = lease
            self._restore_soon()

    def stop(self) -> list[asyncio.Task[None]]:
        """Cancel the keepalive and any restore; the tasks, for the caller to wait on (bounded)."""
        tasks = [task for task in (self._keepalive, self._restoring) if task is not None]
        for task in tasks:
            task.cancel()
        self._keepalive = self._restoring = None
        return tasks

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            if self.id is None:
                continue
            try:
                ttl = await self._refresh(self.id)
            except BackendUnavailable as exc:
                logger.warning("%s; this process's instances expire %ds after the last success", exc, self.ttl)
                continue
            if ttl <= 0:
                logger.warning("etcd lease at %s expired: this process's instances are written again", self.where)
                self.id = None
                self._restore_soon()

    def _restore_soon(self) -> None:
        if self._own and (self._restoring is None or self._restoring.done()):
            self._restoring = asyncio.create_task(self._restore(), name=f"reach-etcd-restore {self.where}")

    async def _restore(self) -> None:
        """Write the instances again under a new lease, as long as deletions keep coming in."""
        while True:
            gone, self._gone = self._gone, {}
            try:
                await self._restore_once(gone)
            except BackendUnavailable as exc:
                logger.warning("%s; the instances register again on their next heartbeat", exc)
                return
            if not self._gone:
                return

    async def _restore_once(self, gone: dict[tuple[str, str], int]) -> None:
        if self.id is not None:
            if await self._refresh(self.id) > 0:
                for removed in [key for key, lease in gone.items() if lease == self.id]:
                    self._own.pop(removed, None)  # deleted under the live lease: on purpose
                return
            self.id = None
        lease = await self.get()
        for key, record in list(self._own.items()):
            if not await self._rewrite(record, lease):
                self._own.pop(key, None)
        logger.warning(
            "etcd at %s revoked this process's lease: %d instance(s) written again", self.where, len(self._own)
        )
