"""Which label values a metric may carry: the names a server knows, and a cap on how many series there are.

A label value is a series in every scrape, for as long as the process runs.
Capability and tenant names arrive in requests, so a server's metrics that
took them as they come would grow with every name an attacker invents (a
flood of 2,500 refused requests once made a gateway's ``/metrics`` 6.1 MB and
38,043 series, 3 s per scrape). A :class:`Vocabulary` lets through only what
its directory (the server's route table: agents, their capabilities and
instances) and its tenant list name; anything else is counted as
:data:`UNKNOWN`. Tenant names can be :data:`HIDDEN` altogether (a scrape
nobody authenticates must not list the customers). Whatever gets through,
at most ``max_series`` label sets are kept; the rest are counted under
:data:`OTHER`, with one warning.

Without a directory (a client library's own metrics) names pass unchanged and
only the cap applies.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from reach_plugins.errors import ConfigError
from reach_plugins.telemetry.spans import ATTR_AGENT, ATTR_CAPABILITY, ATTR_INSTANCE, ATTR_TENANT

if TYPE_CHECKING:
    from reach_plugins.registry.base import RegistryView

log = logging.getLogger("reach_plugins.telemetry")

UNKNOWN: Final = "unknown"
"""The value of a capability, agent, instance or tenant label that names nothing the server knows."""
OTHER: Final = "other"
"""Every label value of a label set past the series cap."""
HIDDEN: Final = "hidden"
"""The tenant label where tenant names are not shown (a scrape without a token)."""
MAX_SERIES: Final = 10_000
"""Default cap on label sets, summed over every instrument of one metrics registry."""


_Key = tuple[str, tuple[tuple[str, Any], ...]]
"""An instrument's name and one label set."""


@dataclass(frozen=True, slots=True)
class _Known:
    revision: int
    names: Mapping[str, frozenset[str]]
    """Attribute -> the values it may take."""


class Vocabulary:
    """The label values a server's metrics may show, and the cap on their number (one per metrics registry).

    ``directory`` returns the server's registry view (a callable because a
    server's route table exists only once its forwarder does); ``tenants``
    are the configured tenant names (``None``: tenants are not checked);
    ``show_tenants=False`` writes every tenant as :data:`HIDDEN`.
    """

    def __init__(
        self,
        directory: Callable[[], RegistryView] | None = None,
        *,
        tenants: Collection[str] | None = None,
        show_tenants: bool = True,
        max_series: int = MAX_SERIES,
    ) -> None:
        if max_series < 1:
            raise ConfigError(f"max_series must be at least 1, got {max_series}")
        self._directory = directory
        self._fixed: Mapping[str, frozenset[str]] = {ATTR_TENANT: frozenset(tenants)} if tenants is not None else {}
        self._show_tenants = show_tenants
        self.max_series = max_series
        self._known: _Known | None = None
        self._lock = threading.Lock()
        self._seen: set[_Key] = set()
        self._memo: dict[_Key, tuple[int, Mapping[str, Any]]] = {}
        """What a label set as it came was recorded as, at a directory revision (at most 2 x ``max_series`` kept)."""
        self.overflowed = False
        """Whether some label set was counted under :data:`OTHER` (warned about once)."""

    @property
    def revision(self) -> int:
        """The directory's revision (0 without one): label sets worked out at another revision are stale."""
        return self._directory().revision if self._directory is not None else 0

    @property
    def series(self) -> int:
        """Label sets admitted so far (at most ``max_series``)."""
        return len(self._seen)

    def labels(self, instrument: str, attributes: Mapping[str, Any] | None) -> Mapping[str, Any]:
        """``attributes`` of one measurement of ``instrument`` as they may be recorded: known names, under the cap."""
        if not attributes:
            return {}
        revision = self.revision
        try:
            asked: _Key = (instrument, tuple(attributes.items()))
            memo = self._memo.get(asked)
        except TypeError:  # a sequence value (a list): worked out each time
            return self._worked_out(instrument, attributes)
        if memo is not None and memo[0] == revision:
            return memo[1]
        shown = self._worked_out(instrument, attributes)
        if asked in self._memo or len(self._memo) < 2 * self.max_series:
            self._memo[asked] = (revision, shown)
        return shown

    def _worked_out(self, instrument: str, attributes: Mapping[str, Any]) -> dict[str, Any]:
        names = self._names()
        return self._capped(instrument, {key: self._shown(names, key, value) for key, value in attributes.items()})

    def _shown(self, names: Mapping[str, frozenset[str]], key: str, value: Any) -> Any:
        if not value:
            return value
        if key == ATTR_TENANT and not self._show_tenants:
            return HIDDEN
        if key not in names:
            return value
        return value if value in names[key] else UNKNOWN

    def _names(self) -> Mapping[str, frozenset[str]]:
        """Attribute -> the values it may take (re-read when the directory's revision moves); others pass as is."""
        if self._directory is None:
            return self._fixed
        view = self._directory()
        known = self._known
        if known is None or known.revision != view.revision:
            agents = view.agents()
            names = {
                ATTR_CAPABILITY: frozenset(cap.name for agent in agents.values() for cap in agent.capabilities),
                ATTR_AGENT: frozenset(agents),
                ATTR_INSTANCE: frozenset(instance for name in agents for instance in view.instances(name)),
            }
            self._known = known = _Known(view.revision, {**names, **self._fixed})
        return known.names

    def _capped(self, instrument: str, attributes: dict[str, Any]) -> dict[str, Any]:
        try:
            key = (instrument, tuple(attributes.items()))
            hash(key)
        except TypeError:  # a sequence value (a list): admitted by its tuple, recorded as it came
            key = (instrument, tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in attributes.items()))
        with self._lock:
            if key in self._seen:
                return attributes
            if len(self._seen) < self.max_series:
                self._seen.add(key)
                return attributes
            first = not self.overflowed
            self.overflowed = True
        if first:
            log.warning(
                "metrics hold %d label sets, their cap: later new ones are counted under %r (raise max_series)",
                self.max_series,
                OTHER,
            )
        return dict.fromkeys(attributes, OTHER)


def metrics_token(variable: str | None, environ: Mapping[str, str]) -> str | None:
    """The bearer token ``/metrics`` requires, read from the environment variable ``variable`` names (None: none)."""
    if variable is None:
        return None
    token = environ.get(variable)
    if not token:
        raise ConfigError(f"environment variable {variable} is not set; it holds the token /metrics scrapes present")
    return token
