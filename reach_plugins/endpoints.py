"""Endpoint policy (DESIGN.md 11.4): where the reach layer may send a tenant's request and credentials.

Two parts, applied in two places:

* the structural rule, a pure check every record applies when it is built
  (:func:`endpoint_problem`, called by the models' validators): ``http``,
  ``https`` or ``grpc``, no userinfo (``user:pass@``), never a link-local
  address (cloud metadata services live there);
* the operator's allowed networks, an :class:`EndpointPolicy` value given to
  whatever admits records — the registries on write and on read, the config
  loader, ``reach agents --load``, gateway and node startup. With networks
  set, only literal addresses inside them pass. The environment
  (``$REACH_ENDPOINT_NETWORKS="10.0.0.0/8,127.0.0.0/8"``) is read once, at the
  edge (the CLI, server startup), by :meth:`EndpointPolicy.from_environ`; no
  module keeps a policy of its own.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from reach_plugins.errors import ConfigError

SCHEMES: Final = frozenset({"http", "https", "grpc"})
ENV_NETWORKS: Final = "REACH_ENDPOINT_NETWORKS"
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def endpoint_problem(url: str) -> str | None:
    """Why ``url`` may never be an agent endpoint (scheme, userinfo, host, link-local), or ``None`` when it may."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        _ = parts.port
    except ValueError as exc:
        return f"endpoint {url!r} is not a URL ({exc})"
    if parts.scheme not in SCHEMES:
        return f"endpoint {url!r}: the scheme must be http, https or grpc, not {parts.scheme or 'missing'!r}"
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        shown = f"{parts.scheme}://***@{parts.netloc.rpartition('@')[2]}"
        return f"endpoint {shown!r} carries userinfo; credentials belong in auth (value_env), never in the URL"
    if not host:
        return f"endpoint {url!r} names no host"
    address = _address(host)
    if address is not None and address.is_link_local:
        return f"endpoint {url!r} is link-local ({address}); agents never live there (metadata services do)"
    return None


def parse_networks(text: str | Iterable[str]) -> tuple[Network, ...]:
    """``"10.0.0.0/8,127.0.0.0/8"`` (or a list) -> networks; ``ConfigError`` naming a bad entry."""
    items = text.split(",") if isinstance(text, str) else list(text)
    networks = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError as exc:
            raise ConfigError(f"allowed network {item!r} is not a CIDR block ({exc})") from None
    return tuple(networks)


@dataclass(frozen=True, slots=True)
class EndpointPolicy:
    """The networks agent endpoints must lie in (``None``: any address the structural rule admits)."""

    networks: tuple[Network, ...] | None = None

    @classmethod
    def limited_to(cls, networks: str | Iterable[str] | None) -> EndpointPolicy:
        """A policy from CIDR text (``"10.0.0.0/8,127.0.0.0/8"`` or a list); ``None`` admits any network."""
        return cls(None if networks is None else parse_networks(networks))

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> EndpointPolicy:
        """The policy ``$REACH_ENDPOINT_NETWORKS`` names (unset or empty: any network); read once, at the edge."""
        return cls.limited_to(environ.get(ENV_NETWORKS) or None)

    def problem(self, url: str) -> str | None:
        """Why ``url`` may not be an endpoint under this policy, or ``None`` when it may."""
        problem = endpoint_problem(url)
        if problem is not None or self.networks is None:
            return problem
        address = _address(urlsplit(url).hostname or "")
        if address is None or not any(address in network for network in self.networks):
            listed = ", ".join(str(n) for n in self.networks) or "none"
            return f"endpoint {url!r} is outside the allowed networks ({listed}); name an address inside them"
        return None

    def admit(self, urls: Iterable[str], whose: str) -> None:
        """Raise ``ConfigError`` naming ``whose`` (``agent 'x'``, ``instance a/i``) unless every URL passes."""
        for url in urls:
            problem = self.problem(url)
            if problem is not None:
                raise ConfigError(f"{whose}: {problem}")


ANY_NETWORK: Final = EndpointPolicy()
"""The policy of a library call that was given none: the structural rule alone."""


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None
