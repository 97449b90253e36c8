"""The one key of per-conversation, per-key and per-task state: ``ScopedKey(tenant, kind, id)``.

Every store (dedup, session liveness, pins, the agent's sessions, served
LangGraph threads, node tickets, snapshots) addresses its entries by this key,
so one tenant's entry can never answer another tenant's request for the same
id. A key cannot be built without a tenant: a request that names none is
scoped to :data:`DEFAULT_TENANT` explicitly (:meth:`ScopedKey.of`), never to
"no tenant". :meth:`ScopedKey.encode` is the one canonical text form, used by
memory and Redis stores alike (a Redis key is the store's prefix plus it, so
the tenant leads every key after the prefix).
"""

from __future__ import annotations

from typing import Final

from reach_plugins.errors import ConfigError

DEFAULT_TENANT: Final = "default"
"""The tenant of a request that names none."""
SEP: Final = "\x1f"
"""Joins the parts of an encoded key (the unit separator: no tenant or kind may hold it)."""


class ScopedKey(tuple[str, str, str]):
    """A store entry's address: whose (``tenant``), what (``kind``, e.g. ``"dedup"``) and which (``id``).

    An immutable, slotted triple (a tuple underneath, so hashing and comparing run in C: the router builds one
    per routed conversation).
    """

    __slots__ = ()

    def __new__(cls, tenant: str, kind: str, id: str) -> ScopedKey:
        if type(tenant) is not str or not tenant or not tenant.isprintable():
            raise _refused("tenant", tenant)
        if type(kind) is not str or not kind or not kind.isprintable():
            raise _refused("kind", kind)
        if type(id) is not str:
            raise ConfigError(f"a store key's id must be a string, got {type(id).__name__}")
        return tuple.__new__(cls, (tenant, kind, id))

    @property
    def tenant(self) -> str:
        return self[0]

    @property
    def kind(self) -> str:
        return self[1]

    @property
    def id(self) -> str:
        return self[2]

    def __repr__(self) -> str:
        return f"ScopedKey(tenant={self[0]!r}, kind={self[1]!r}, id={self[2]!r})"

    @classmethod
    def of(cls, tenant: str | None, kind: str, id: str) -> ScopedKey:
        """The key of ``id`` for ``tenant``, or for :data:`DEFAULT_TENANT` when the request names none."""
        return cls(DEFAULT_TENANT if tenant is None else tenant, kind, id)

    def encode(self) -> str:
        """The canonical text form ``tenant<US>kind<US>id`` (memory tables, Redis keys, pub/sub messages)."""
        return SEP.join(self)

    @classmethod
    def decode(cls, text: str) -> ScopedKey:
        """The key :meth:`encode` wrote."""
        tenant, kind, id = text.split(SEP, 2)
        return cls(tenant, kind, id)


def _refused(field: str, value: object) -> ConfigError:
    return ConfigError(
        f"a store key's {field} must be a non-empty printable string, got {value!r}; "
        f"a request without a tenant is scoped to {DEFAULT_TENANT!r} (ScopedKey.of)"
    )
