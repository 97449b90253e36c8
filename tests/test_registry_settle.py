"""The etcd mirror right after an outage, sans-IO: watch events as plain objects, time as fake clocks.

etcd resuming from a hang revokes at once every lease that ran out while it
hung; the processes holding them live on and write their keys again. A ready
instance whose key is deleted in the first SETTLE seconds after the outage
stays routable that long (its owner writes it again, or it is dropped), and a
heartbeat counts from when the watch showed it, whatever the writer's clock.
"""

from __future__ import annotations

from types import SimpleNamespace

from registry_conformance import FakeClock

from reach_plugins.endpoints import ANY_NETWORK
from reach_plugins.model import AgentDescriptor, Instance
from reach_plugins.registry.etcd_mirror import SETTLE, SETTLE_WINDOW, EtcdMirror, Keys

KEYS = Keys("/reach/")


def mirror() -> tuple[EtcdMirror, FakeClock, FakeClock]:
    """An empty mirror, its registry clock and its real-time (settle) clock."""
    clock, monotonic = FakeClock(), FakeClock(100.0)
    made = EtcdMirror(KEYS, clock, ANY_NETWORK, monotonic=monotonic)
    return made, clock, monotonic


def put(key: bytes, record: AgentDescriptor | Instance, revision: int) -> SimpleNamespace:
    kv = SimpleNamespace(key=key, value=record.model_dump_json().encode(), lease=7, mod_revision=revision)
    return SimpleNamespace(kind="PUT", kv=kv)


def delete(key: bytes, revision: int) -> SimpleNamespace:
    return SimpleNamespace(kind="DELETE", kv=SimpleNamespace(key=key, value=b"", lease=0, mod_revision=revision))


def instance(status: str = "ready", seq: int = 0, stamp: float = 1.0) -> Instance:
    return Instance.model_validate(
        {"agent": "orders", "instance_id": "o-1", "endpoint": "http://127.0.0.1:9", "status": status}
        | {"heartbeat_seq": seq, "last_heartbeat": stamp}
    )


async def started(status: str = "ready") -> tuple[EtcdMirror, FakeClock, FakeClock]:
    """A mirror holding agent orders and its heartbeat-tracked instance o-1 in ``status``."""
    made, clock, monotonic = mirror()
    await made.apply_event(put(KEYS.agent("orders"), AgentDescriptor(name="orders", capabilities=["q"]), 1))
    await made.apply_event(put(KEYS.instance("orders", "o-1"), instance(status), 2))
    return made, clock, monotonic


async def test_a_ready_instance_deleted_right_after_an_outage_lingers_until_written_again() -> None:
    """Deleted just after etcd answers again: still routable; written again: kept for good."""
    made, _, monotonic = await started()
    made.outage_over()
    await made.apply_event(delete(KEYS.instance("orders", "o-1"), 3))
    assert "o-1" in made.cache.instances("orders")
    await made.apply_event(put(KEYS.instance("orders", "o-1"), instance(), 4))
    monotonic.advance(SETTLE * 2)
    await made.expire()
    assert "o-1" in made.cache.instances("orders")


async def test_a_lingering_instance_that_does_not_come_back_is_dropped_after_settle() -> None:
    """Not written again within SETTLE of its deletion: dropped, with an instance_deleted event."""
    made, _, monotonic = await started()
    made.outage_over()
    stream = made.cache.watch()
    await made.apply_event(delete(KEYS.instance("orders", "o-1"), 3))
    monotonic.advance(SETTLE - 0.1)
    await made.expire()
    assert "o-1" in made.cache.instances("orders")
    monotonic.advance(0.2)
    await made.expire()
    assert "o-1" not in made.cache.instances("orders")
    assert (await anext(stream)).kind == "instance_deleted"


async def test_deletions_outside_the_settle_window_or_of_draining_instances_are_at_once() -> None:
    """A deletion after SETTLE_WINDOW (a restarted etcd expiring a dead process's lease), or of an instance that
    announced draining, drops it at once."""
    made, _, monotonic = await started()
    made.outage_over()
    monotonic.advance(SETTLE_WINDOW + 0.1)
    await made.apply_event(delete(KEYS.instance("orders", "o-1"), 3))
    assert "o-1" not in made.cache.instances("orders")
    made, _, monotonic = await started("draining")
    made.outage_over()
    await made.apply_event(delete(KEYS.instance("orders", "o-1"), 3))
    assert "o-1" not in made.cache.instances("orders")


async def test_heartbeats_count_from_when_they_are_seen_and_a_relist_keeps_that_time() -> None:
    """The writer's stamp (here 1.0, far in the past) is replaced by the time seen; the same record listed again
    keeps its time; a newer heartbeat takes the time it arrives."""
    made, clock, _ = await started()
    seen = made.cache.instances("orders")["o-1"].last_heartbeat
    assert seen == clock.now
    clock.advance(5)
    await made.apply_event(put(KEYS.instance("orders", "o-1"), instance(), 3))
    assert made.cache.instances("orders")["o-1"].last_heartbeat == seen
    await made.apply_event(put(KEYS.instance("orders", "o-1"), instance(seq=1, stamp=9e9), 4))
    assert made.cache.instances("orders")["o-1"].last_heartbeat == clock.now
    assert made.cache.instances("orders")["o-1"].heartbeat_seq == 1
