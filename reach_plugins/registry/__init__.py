"""Registries: who offers which capability, where its instances run, whether they are alive.

``open_registry(url)`` picks a backend by URL scheme:

* ``memory://`` — in-process (:class:`MemoryRegistry`), the embedded default;
* ``file://agents.yaml`` or a bare ``*.yaml`` / ``*.yml`` path — agents from a
  YAML file that reloads on change (:class:`FileRegistry`);
* ``etcd://host:port[/prefix]`` — shared by many processes (:mod:`reach_plugins.registry.etcd`);
  needs the ``etcd`` extra.

A backend module lives in this package and exposes
``from_url(url, *, clock, endpoints, snapshot) -> Registry``; adding a scheme is one line in
``_SCHEMES``. Every backend passes ``tests/registry_conformance.py``. Every
backend admits records (written, loaded or read back) under the
:class:`~reach_plugins.endpoints.EndpointPolicy` it is given (any network by default).
"""

from __future__ import annotations

import importlib
from typing import Final

from reach_plugins.endpoints import ANY_NETWORK, EndpointPolicy
from reach_plugins.errors import ConfigError
from reach_plugins.registry.base import Clock, Registry, RegistryEvent, RegistryView
from reach_plugins.registry.file import FileRegistry
from reach_plugins.registry.memory import MemoryRegistry

_SCHEMES: Final[dict[str, tuple[str, str | None]]] = {
    "memory": ("reach_plugins.registry.memory", None),
    "file": ("reach_plugins.registry.file", None),
    "etcd": ("reach_plugins.registry.etcd", "etcd"),
}
"""scheme -> (backend module exposing ``from_url``, the extra its dependencies come with)."""

_FORMS: Final = "memory://, file://PATH.yaml (or a bare PATH.yaml), etcd://HOST:PORT[/PREFIX]"


def open_registry(
    url: str | Registry,
    *,
    clock: Clock | None = None,
    endpoints: EndpointPolicy = ANY_NETWORK,
    snapshot: bool = True,
) -> Registry:
    """Return ``url`` itself when it is already a registry (it keeps its own policy), else open the backend its
    scheme names, admitting records under ``endpoints``.

    ``snapshot``: a reader (router, gateway, node) needs the current state before it can route, so a backend that
    loads it from a server (etcd) does so before returning and raises ``BackendUnavailable`` when it cannot. A
    writer that only registers itself (an agent, issue 25) passes False: it returns at once, so the agent starts and
    serves while the registry is down (reads still wait for the registry; an etcd URL's ``preload`` option wins)."""
    if not isinstance(url, str):
        return url
    scheme, sep, _ = url.partition("://")
    if not sep and url.endswith((".yaml", ".yml")):
        return FileRegistry(url, clock=clock, endpoints=endpoints)
    if not sep or scheme not in _SCHEMES:
        raise ConfigError(f"unknown registry URL {url!r}; supported forms: {_FORMS}")
    module_name, extra = _SCHEMES[scheme]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f'registry URL {url!r} needs the {extra!r} extra: pip install "reach-plugins[{extra}]"'
            if extra
            else f"registry backend {module_name} failed to import: {exc}"
        ) from exc
    registry: Registry = module.from_url(url, clock=clock, endpoints=endpoints, snapshot=snapshot)
    return registry


__all__ = [
    "FileRegistry",
    "MemoryRegistry",
    "Registry",
    "RegistryEvent",
    "RegistryView",
    "open_registry",
]
