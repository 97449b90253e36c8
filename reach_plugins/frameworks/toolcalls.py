"""What the enhancer trades with framework adapters (a tool call in, a decision, a result out) and the tool mapper.

None of it knows a framework. An adapter (LangChain, LlamaIndex, Dify) fills a
:class:`ToolCall` from its host's call, asks the enhancer for a
:class:`Decision`, runs the local tool or lets the enhancer reach, and turns
the :class:`ToolResult` back into its host's message. Failures become
:func:`error_text`: a sentence the model can act on, not a stack trace.
:class:`ToolMapper` decides which capability, if any, a tool stands for.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

from reach_plugins.errors import (
    ApprovalRequired,
    BusinessError,
    ConfigError,
    DeadlineExceeded,
    HandlerFailed,
    InvalidPayload,
    LoopDetected,
    NoHealthyAgent,
    PermissionDenied,
    RateLimited,
    ReachError,
    Retryable,
    SessionClosed,
    UnknownCapability,
    is_retryable,
)
from reach_plugins.matching import CapabilityMatcher, Embedder, EmbedFunction, default_embedder
from reach_plugins.matching.matcher import DEFAULT_TIMEOUT, MatchResult, identifier
from reach_plugins.matching.ranking import DEFAULT_WEIGHTS, CapacityRanking, Contender, FreeCapacityOf
from reach_plugins.model import NAME_PATTERN, Capability, Hop, ReachResponse
from reach_plugins.registry.base import RegistryView
from reach_plugins.routing.capacity import FreeCapacity
from reach_plugins.security.verifier import TokenVerifier

Policy = Literal["remote_first", "remote_only", "local_only"]
OnError = Literal["message", "raise"]
MatchMode = Literal["exact", "semantic"]
"""``match=``: ``exact`` (the default) routes a tool only by ``capability_map`` or its own name; ``semantic`` also
by the meaning of its name and description, at the stated ``min_similarity``."""
Rule = Literal[
    "map",
    "exact",
    "semantic",
    "capacity",
    "ambiguous",
    "below_threshold",
    "filtered",
    "unmapped",
    "off",
    "degraded",
    "high_danger",
]
"""How a tool was mapped: ``map`` (``capability_map``), ``exact`` name, ``semantic`` match, ``capacity`` (a near tie
broken by free capacity, :mod:`reach_plugins.matching.ranking`); or why it was not (``high_danger``: the closest
capability is ``danger_level: high``, which meaning alone never reaches)."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call as the model made it, plus what the host framework knows about its context."""

    name: str
    args: Mapping[str, Any] = field(default_factory=dict)
    call_id: str | None = None
    description: str = ""
    session_key: str | None = None
    """The conversation (LangGraph ``thread_id``): affinity key, liveness key, ``gen_ai.conversation.id``."""
    hops: tuple[Hop, ...] | None = None
    """The chain this call continues; ``None`` takes it from the request being served (``security.context``)."""
    has_local: bool = True
    """Whether a local tool exists to run instead (``False`` for proxy tools of remote-only capabilities)."""


@dataclass(frozen=True, slots=True)
class Resolution:
    """Which capability a tool maps to, by which rule, and the matcher's evidence (users ask why)."""

    tool: str
    capability: str | None
    rule: Rule
    detail: str = ""
    contenders: tuple[Contender, ...] = ()
    """A near tie ranked by similarity and free capacity: each contender's two parts and score, best first."""


@dataclass(frozen=True, slots=True)
class Decision:
    """Where one call goes: ``remote`` to ``capability``, or the local tool; ``reason`` says why."""

    remote: bool
    capability: Capability | None
    resolution: Resolution
    reason: str


@dataclass(frozen=True, slots=True)
class RouteInfo:
    """Where a remote call went and how it went (the adapters attach it to the tool's result)."""

    capability: str
    request_id: str | None
    """``None`` when no request was made (no agent could take it)."""
    agent: str | None = None
    instance: str | None = None
    attempts: int = 0
    affinity: str = "none"
    context_restore: bool = False
    degraded: bool = False
    cost_ms: float = 0.0
    delivered: bool = True
    """False when no attempt reached an agent (refused connection, no healthy agent, open breaker)."""
    fallback: str | None = None
    """Why the local tool ran instead of the agent (``remote_first``, nothing delivered), else ``None``."""
    ranking: tuple[dict[str, Any], ...] = ()
    """When free capacity broke a near tie: each contender's ``capability``, ``similarity``, ``capacity`` and
    ``score``, best first (JSON-ready, as the adapters' artifacts carry it)."""

    @classmethod
    def of(cls, response: ReachResponse, capability: str) -> RouteInfo:
        trace = response.trace
        route = trace.route if trace is not None else None
        attempts = trace.attempts if trace is not None else []
        return cls(
            capability=capability,
            request_id=response.request_id,
            agent=response.agent,
            instance=response.instance,
            attempts=response.attempts,
            affinity=route.affinity if route is not None else "none",
            context_restore=response.context_restore,
            degraded=response.degraded,
            cost_ms=round(response.cost_ms, 3),
            delivered=response.ok or not attempts or any(attempt.delivered for attempt in attempts),
        )

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def ranked_by(self, resolution: Resolution) -> RouteInfo:
        """This record with the ranking that chose the capability, when capacity chose it."""
        if resolution.rule != "capacity":
            return self
        ranking = tuple(
            {"capability": c.capability, "similarity": c.similarity, "capacity": c.capacity, "score": c.score}
            for c in resolution.contenders
        )
        return replace(self, ranking=ranking)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The outcome of a remote call: ``content`` is what the model reads, success or not."""

    call: ToolCall
    capability: str | None
    content: str
    data: Any = None
    error: ReachError | None = None
    route: RouteInfo | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def fallback(self) -> str | None:
        """Why the adapter should run the local tool now (the reach was not delivered), else ``None``."""
        return self.route.fallback if self.route is not None else None


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """A call to a dangerous capability waiting for a human's yes or no."""

    tool: str
    capability: Capability
    args: Mapping[str, Any]
    call_id: str | None = None
    session_key: str | None = None
    asked_by: str | None = None
    """The target agent's request when it asks its caller for the approval (``None``: this caller's policy asks)."""

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary to show the human (the LangGraph interrupt's value)."""
        return {
            "type": "reach_approval",
            "tool": self.tool,
            "capability": self.capability.name,
            "description": self.capability.description,
            "danger_level": self.capability.danger_level,
            "args": dict(self.args),
            "tool_call_id": self.call_id,
            "conversation": self.session_key,
            "asked_by": self.asked_by,
            "resume_with": {"approved": True},
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    """An approver's answer beyond yes or no: the arguments a reviewer edited, or why they rejected it."""

    approved: bool
    args: Mapping[str, Any] | None = None
    """Send these arguments instead of the model's (an edit); ``None`` keeps them."""
    reason: str = ""


Approver = Callable[[PendingApproval], "bool | Verdict | Awaitable[bool | Verdict]"]
"""Decides whether a dangerous call may be sent; ``True`` (or an approving :class:`Verdict`) sends it."""


@dataclass(frozen=True, slots=True)
class ServeSpec:
    """How an agent built with ``auto_register=True`` is served: its name, what it offers, where it listens."""

    name: str
    capabilities: Sequence[Capability | str]
    """What other agents may reach it for; a bare name takes one ``message`` string argument."""
    description: str = ""
    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free port."""
    tokens: TokenVerifier | Literal["open"] | None = None
    """What the served agent accepts, as ``ReachAgent(tokens=)``: by default tokens of this process's issuer."""


@dataclass(frozen=True, slots=True)
class ProxySpec:
    """A capability no local tool covers, described so a framework can offer it to the model as a tool."""

    name: str
    description: str
    params_schema: dict[str, Any]
    capability: str


ANY_OBJECT: dict[str, Any] = {"type": "object", "additionalProperties": True}
"""Arguments of a capability that declares no ``params_schema``: any JSON object."""


def proxy_spec(capability: Capability) -> ProxySpec:
    """The tool the model sees for ``capability``."""
    description = capability.description or f"Reach another agent for {capability.name.replace('_', ' ')}."
    schema = capability.params_schema if capability.params_schema is not None else ANY_OBJECT
    return ProxySpec(capability.name, description, dict(schema), capability.name)


@dataclass(frozen=True, slots=True)
class Exposure:
    """Which capabilities without a local tool the model may see as proxy tools (opt-in: none by default).

    ``names`` match a capability by name or by one of its scope tags;
    ``predicate`` picks by any field. A capability with ``danger_level:
    high`` is exposed only when its own name is listed: a tag or a predicate
    never brings a dangerous tool to the model.
    """

    names: frozenset[str] = frozenset()
    predicate: Callable[[Capability], bool] | None = None

    @classmethod
    def of(cls, option: ExposeOption) -> Exposure:
        """The rule for ``expose=`` (a string alone is refused: it would be read letter by letter)."""
        if option is None:
            return cls()
        if isinstance(option, Exposure):
            return option
        if isinstance(option, str):
            raise ConfigError(f"expose= takes a list of capability names or scope tags, not a string: [{option!r}]")
        if callable(option):
            return cls(predicate=option)
        names = frozenset(option)
        if not all(isinstance(name, str) and name for name in names):
            raise ConfigError("expose= items must be capability names or scope tags (non-empty strings)")
        return cls(names=names)

    def __call__(self, capability: Capability) -> bool:
        """Whether the model may see ``capability`` as a tool."""
        if capability.name in self.names:
            return True
        if capability.danger_level == "high":
            return False
        if not self.names.isdisjoint(capability.scope_tags):
            return True
        return self.predicate is not None and self.predicate(capability)


ExposeOption = Iterable[str] | Callable[[Capability], bool] | Exposure | None
"""``expose=``: capability names or scope tags, a predicate, or ``None`` (no proxy tools; the default)."""


def content_of(data: Any) -> str:
    """What the model reads from a reply: text as is, a chat agent's ``reply_content``, anything else as JSON."""
    if isinstance(data, str):
        return data
    if isinstance(data, Mapping) and isinstance(data.get("reply_content"), str):
        return str(data["reply_content"])
    return json.dumps(data, ensure_ascii=False, default=str)


_ADVICE: tuple[tuple[type[ReachError], str], ...] = (
    (SessionClosed, "The conversation is closed, so nothing was sent; do not call other tools."),
    (ApprovalRequired, "Nothing was sent; do not call it again unless the user approves it."),
    (LoopDetected, "It would loop back through agents already in this chain; answer without it."),
    (InvalidPayload, "Correct the arguments and call it again."),
    (BusinessError, "The agent refused; check the arguments or ask the user for what is missing."),
    (UnknownCapability, "No agent offers it; answer without it."),
    (PermissionDenied, "This tenant may not use it; answer without it."),
    (NoHealthyAgent, "No agent can take it right now; try again later or answer without it."),
    (RateLimited, "Too many calls right now; wait before trying again."),
    (DeadlineExceeded, "It did not answer in time; try again later or answer without it."),
    (Retryable, "It failed this time and may pass if called again."),
    (HandlerFailed, "It ran and failed, and may have acted: do not call it again the same way; tell the user."),
)


def error_record(error: ReachError) -> dict[str, Any]:
    """A failure as data for code to act on: the error's wire code, class, message and whether a retry may help."""
    return {
        "type": error.code,
        "class": type(error).__name__,
        "message": error.message,
        "retryable": is_retryable(error),
    }


def error_text(tool: str, capability: str | None, error: ReachError) -> str:
    """A message the model can act on: what failed, why, and what to do next."""
    advice = next((text for kind, text in _ADVICE if isinstance(error, kind)), "Try again later or answer without it.")
    via = f" (capability {capability!r})" if capability and capability != tool else ""
    return f"Error: tool {tool!r}{via} failed: {error.message.rstrip('. ')}. {advice}"


MatcherOption = CapabilityMatcher | Embedder | EmbedFunction | Literal[False] | None
"""With ``match="semantic"``: a ready matcher, an embedder to build one with, or ``None`` for the default embedder.
``False`` (exact names only) is what ``match="exact"`` does anyway."""
_MAX_CACHED = 4096
_NAME = re.compile(NAME_PATTERN)


class ToolMapper:
    """Which capability of a registry each tool reaches: ``capability_map``, then the exact name, then meaning.

    A local tool runs locally unless the user said otherwise: meaning is
    consulted only with ``match="semantic"`` and a stated ``min_similarity``
    (a near miss once sent ``get_order_status`` to ``query_order`` and the
    local code never ran), and it never routes to a ``danger_level: high``
    capability, which needs the map or its exact name.

    A near tie by meaning (several capabilities within the matcher's margin)
    is ranked by ``capacity_weights`` of similarity and free capacity
    (:class:`~reach_plugins.matching.ranking.CapacityRanking`; ``None`` leaves
    it a tie); ``capacity`` reads free capacity (by default from the registry,
    :class:`~reach_plugins.routing.capacity.FreeCapacity`).

    The catalogue is rebuilt (and the decisions forgotten) when the registry's
    revision moves, so an agent registered later is found; decisions are
    cached per ``(tool, description)`` otherwise, except ranked ties: load
    moves between calls, so they are ranked again on every call.
    """

    def __init__(
        self,
        view: RegistryView,
        *,
        capability_map: Mapping[str, str | None] | None = None,
        match: MatchMode = "exact",
        min_similarity: float | None = None,
        matcher: MatcherOption = None,
        scope_tags: Sequence[str] = (),
        capacity_weights: Sequence[float] | None = DEFAULT_WEIGHTS,
        capacity: FreeCapacityOf | None = None,
    ) -> None:
        check_choice("match", match, MatchMode)
        capability_map = capability_map or {}
        for tool, target in capability_map.items():
            if target is not None and not _NAME.match(target):
                raise ConfigError(
                    f"capability_map[{tool!r}] = {target!r} is not a capability name (lowercase verb_object such "
                    "as 'query_order'); map a tool to None to keep it local"
                )
        self.view = view
        self.capability_map = dict(capability_map)
        self.matcher = _matcher(match, min_similarity, matcher)
        self.ranking = (
            CapacityRanking(capacity_weights, margin=self.matcher.margin)
            if self.matcher is not None and capacity_weights is not None
            else None
        )
        self.capacity: FreeCapacityOf = capacity or FreeCapacity(view)
        self.scope_tags = tuple(scope_tags)
        self._lock = threading.Lock()
        self._revision: int | None = None
        self._catalogue: dict[str, Capability] = {}
        self._resolved: dict[tuple[str, str], Resolution] = {}

    def catalogue(self) -> Mapping[str, Capability]:
        """Every capability the registry offers, by name; one several agents offer needs approval if any says so."""
        if self.view.revision == self._revision:
            return self._catalogue
        with self._lock:
            revision = self.view.revision
            found: dict[str, Capability] = {}
            for agent in list(self.view.agents().values()):
                for capability in agent.capabilities:
                    first = found.setdefault(capability.name, capability)
                    if capability.needs_approval and not first.needs_approval:
                        found[capability.name] = first.model_copy(update={"require_approval": True})
            if self.matcher is not None:
                self.matcher.update(found.values())
            self._catalogue, self._resolved, self._revision = found, {}, revision
            return found

    def explain(self, tool: str, description: str = "", *, wait: bool = True) -> Resolution:
        """The capability ``tool`` maps to (or ``None``), the rule that decided, and the evidence.

        ``wait=False`` is the routing path: the model gets its time budget, then the decision degrades.
        """
        catalogue = self.catalogue()
        resolved = self._resolved
        found = resolved.get((tool, description))
        if found is None:
            found = self._resolve(tool, description, catalogue, wait)
            if found.rule == "degraded" or found.contenders:
                return found  # the model was slow or failed, or load decided: ask again next time
            with self._lock:
                if len(resolved) >= _MAX_CACHED:
                    resolved.clear()
                resolved[tool, description] = found
        return found

    def uncovered(
        self,
        local: Iterable[str | tuple[str, str]],
        *,
        exclude: Iterable[str] = (),
        exposed: Callable[[Capability], bool] = lambda capability: True,
    ) -> list[ProxySpec]:
        """Proxy specs for the ``exposed`` capabilities no ``local`` tool (name, or name and description) maps to."""
        pairs = [(item, "") if isinstance(item, str) else item for item in local]
        covered = {name for name, _ in pairs} | {self.explain(*pair).capability for pair in pairs} | set(exclude)
        tags = set(self.scope_tags)
        return [
            proxy_spec(capability)
            for name, capability in sorted(self.catalogue().items())
            if name not in covered and tags <= set(capability.scope_tags) and exposed(capability)
        ]

    def _resolve(self, tool: str, description: str, catalogue: Mapping[str, Capability], wait: bool) -> Resolution:
        if tool in self.capability_map:
            target = self.capability_map[tool]
            return Resolution(tool, target, "map", f"capability_map sends it to {target or 'the local tool'}")
        if self.matcher is None:
            return self._exact(tool, catalogue)
        match = self.matcher.match(tool, description, scope_tags=self.scope_tags, wait=wait)
        ranked = self.ranking.rank(match, self.capacity) if self.ranking is not None else None
        if ranked is not None:
            chosen = Resolution(tool, ranked.capability, ranked.reason, f"{match}; {ranked}", ranked.contenders)
        else:
            chosen = Resolution(tool, match.capability, match.reason, str(match))
        return _not_dangerous(chosen, match, catalogue)

    def _exact(self, tool: str, catalogue: Mapping[str, Capability]) -> Resolution:
        """``match="exact"``: the capability named like the tool (``queryOrder`` is ``query_order``), or none."""
        name, tags = identifier(tool), set(self.scope_tags)
        for capability in catalogue.values():
            if identifier(capability.name) == name and tags <= set(capability.scope_tags):
                return Resolution(tool, capability.name, "exact", "same name")
        return Resolution(
            tool,
            None,
            "unmapped",
            f"no capability named {tool!r} and matching by meaning is off (match='exact'): route it with "
            f"capability_map={{{tool!r}: 'capability_name'}}, or opt in with match='semantic', min_similarity=...",
        )


def _not_dangerous(chosen: Resolution, match: MatchResult, catalogue: Mapping[str, Capability]) -> Resolution:
    """``chosen``, unless meaning chose a ``danger_level: high`` capability: then no route, and how to give one."""
    found = catalogue.get(chosen.capability) if chosen.rule in ("semantic", "capacity") and chosen.capability else None
    if found is None or found.danger_level != "high":
        return chosen
    tool = chosen.tool
    return Resolution(
        tool,
        None,
        "high_danger",
        f"{match}; meaning alone never routes to a danger_level: high capability: "
        f"route it with capability_map={{{tool!r}: {found.name!r}}} or name the tool {found.name!r}",
        chosen.contenders,
    )


def _matcher(match: MatchMode, min_similarity: float | None, option: MatcherOption) -> CapabilityMatcher | None:
    """The matcher of ``match="semantic"`` at its stated threshold, else ``None`` (exact names only)."""
    if match == "exact":
        if min_similarity is not None or option not in (None, False):
            raise ConfigError(
                "min_similarity= and matcher= apply only to matching by meaning, which is off by default: "
                "add match='semantic' (or drop them to route by capability_map and exact names)"
            )
        return None
    if option is False:
        raise ConfigError("match='semantic' needs a matcher: drop matcher=False (or use match='exact')")
    if isinstance(option, CapabilityMatcher):
        if min_similarity is not None:
            raise ConfigError(
                "a ready CapabilityMatcher brings its own threshold: pass min_similarity= or matcher=, not both"
            )
        return option
    if min_similarity is None:
        raise ConfigError(
            "match='semantic' needs min_similarity= (the cosine, in [-1, 1], a tool's name and description must "
            "reach to route to a capability; the lexical embedder was tuned at 0.38, MiniLM+lexical at 0.46)"
        )
    embedder = _shared_default() if option is None else option
    return CapabilityMatcher((), embedder=embedder, threshold=min_similarity, timeout=DEFAULT_TIMEOUT)


@functools.cache
def _shared_default() -> Embedder:
    """One default embedder per process: a sentence model's weights are loaded once, not once per enhancer."""
    return default_embedder()


def check_choice(what: str, value: str, allowed: Any) -> None:
    """Refuse a ``value`` outside the ``Literal`` type ``allowed``, listing the choices."""
    choices = get_args(allowed)
    if value not in choices:
        raise ConfigError(f"{what} must be one of {', '.join(map(repr, choices))}, got {value!r}")
