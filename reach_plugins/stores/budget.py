"""The one bound of every in-memory store: ``Budget(max_entries=..., max_bytes=...)``, and the LRU table under it.

A store keeps at most ``max_entries`` entries whose sizes add up to at most
``max_bytes``; past either bound the least recently used entry *of the tenant
holding the most* goes first (the most bytes when the bytes bound is passed, the
most entries when the entries bound is), so one tenant's flood pushes out its own
entries, never another tenant's idempotency record or session. An
entry larger than ``max_bytes`` alone is refused with :class:`EntryTooLarge`
(keeping it would evict everything else and still break the bound). An
entry's size is its key's encoding plus its value as JSON (:func:`json_size`),
an estimate that needs no pickling. :class:`BoundedStore` is the base of every
in-memory store and cannot be built without a budget; the public constructors
(``ReachClient(store="memory://")``, ``ReachAgent(idempotency="memory://")``)
open stores with :data:`DEFAULT_BUDGET` unless given one (``ReachAgent(idempotency_budget=...)``).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from pydantic import BaseModel

from reach_plugins.errors import ConfigError, EntryTooLarge
from reach_plugins.stores.keys import ScopedKey

V = TypeVar("V")

MIB: Final = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """How much a store may hold: entries and bytes, both required."""

    max_entries: int
    max_bytes: int

    def __post_init__(self) -> None:
        for name, value in (("max_entries", self.max_entries), ("max_bytes", self.max_bytes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"a store budget's {name} must be a positive integer, got {value!r}")


DEFAULT_BUDGET: Final = Budget(max_entries=10_000, max_bytes=64 * MIB)
"""What a store opened from a URL (``memory://``) or by a public constructor gets: 10,000 entries, 64 MiB."""


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact JSON (a pydantic model as its JSON dump; anything else via ``str``)."""
    if isinstance(value, BaseModel):
        return len(value.model_dump_json().encode())
    return len(json.dumps(value, separators=(",", ":"), default=str).encode())


class LruTable(Generic[V]):
    """Entries by :class:`ScopedKey`, least recently used first out, within a :class:`Budget`.

    ``on_evict`` hears every entry pushed out by the bounds (not those popped by their owner). Past a bound the
    heaviest tenant pays: its least recently used entry goes (finding the heaviest is linear in the tenants
    holding entries, a handful in practice).
    """

    def __init__(self, budget: Budget, what: str, on_evict: Callable[[ScopedKey, V], None] | None = None) -> None:
        self.budget = budget
        self.what = what
        self._on_evict = on_evict
        self._entries: OrderedDict[ScopedKey, tuple[V, int]] = OrderedDict()
        self._tenants: dict[str, _Share] = {}
        """Per tenant: its keys in use order, and their bytes."""
        self.bytes = 0
        """Sizes of the entries held, added up."""

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[ScopedKey]:
        return iter(list(self._entries))

    def get(self, key: ScopedKey) -> V | None:
        """The value (marked most recently used), or None."""
        found = self._entries.get(key)
        if found is None:
            return None
        self._entries.move_to_end(key)
        self._tenants[key[0]].keys.move_to_end(key)
        return found[0]

    def peek(self, key: ScopedKey) -> V | None:
        """The value without touching its place."""
        found = self._entries.get(key)
        return None if found is None else found[0]

    def put(self, key: ScopedKey, value: V, size: int | None = None) -> None:
        """Keep ``value`` (``size`` bytes, else its key and JSON), evicting the oldest past the bounds.

        Raises :class:`EntryTooLarge` (and keeps nothing new) when the entry alone is over ``max_bytes``.
        """
        total = len(key[0]) + len(key[1]) + len(key[2]) + 2 + (json_size(value) if size is None else size)
        if total > self.budget.max_bytes:
            raise EntryTooLarge(
                f"{self.what} entry {key.id!r} of tenant {key.tenant!r} is {total} bytes, over the store's "
                f"max_bytes={self.budget.max_bytes}; keep it smaller or give the store a larger Budget"
            )
        self._drop(key)
        self._entries[key] = (value, total)
        share = self._tenants.get(key[0])
        if share is None:
            share = self._tenants[key[0]] = _Share()
        share.keys[key] = None
        share.bytes += total
        self.bytes += total
        self._shrink()

    def pop(self, key: ScopedKey) -> V | None:
        """Remove and return an entry (no eviction hook: its owner took it)."""
        found = self._drop(key)
        return None if found is None else found[0]

    def _drop(self, key: ScopedKey) -> tuple[V, int] | None:
        found = self._entries.pop(key, None)
        if found is None:
            return None
        self.bytes -= found[1]
        share = self._tenants[key[0]]
        del share.keys[key]
        share.bytes -= found[1]
        if not share.keys:
            del self._tenants[key[0]]
        return found

    def oldest(self) -> tuple[ScopedKey, V] | None:
        """The least recently used entry, left in place."""
        for key, (value, _) in self._entries.items():
            return key, value
        return None

    def values(self) -> Iterator[V]:
        return (value for value, _ in list(self._entries.values()))

    def clear(self) -> None:
        self._entries.clear()
        self._tenants.clear()
        self.bytes = 0

    def _shrink(self) -> None:
        budget, entries, tenants = self.budget, self._entries, self._tenants
        while len(entries) > budget.max_entries or self.bytes > budget.max_bytes:
            if self.bytes > budget.max_bytes:
                heaviest = max(tenants.values(), key=lambda share: share.bytes)
            else:
                heaviest = max(tenants.values(), key=lambda share: len(share.keys))
            key = next(iter(heaviest.keys))
            found = self._drop(key)
            assert found is not None
            if self._on_evict is not None:
                self._on_evict(key, found[0])


@dataclass(slots=True)
class _Share:
    """One tenant's part of an :class:`LruTable`."""

    keys: OrderedDict[ScopedKey, None] = field(default_factory=OrderedDict)
    bytes: int = 0


class BoundedStore:
    """Base of every in-memory store: built only with a :class:`Budget`, its entries held in :attr:`table`."""

    table: LruTable[Any]

    def __init__(self, *, budget: Budget) -> None:
        if not isinstance(budget, Budget):
            raise ConfigError(
                f"{type(self).__name__} needs budget=Budget(max_entries=..., max_bytes=...), got {budget!r}"
            )
        self.budget = budget

    @property
    def entries(self) -> int:
        """How many entries the store holds."""
        return len(self.table)

    @property
    def bytes(self) -> int:
        """How many bytes the store's entries take, by its estimate."""
        return self.table.bytes
