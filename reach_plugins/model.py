"""The records every part shares: who offers what, where it runs, what is asked, what came back.

Field names listed in DESIGN.md section 3 are a contract: other processes and
outside checks read them. Config-facing models refuse unknown keys so a typo
in a YAML file fails loudly instead of being ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from reach_plugins.endpoints import endpoint_problem
from reach_plugins.errors import WIRE_CODES, DeadlineExceeded, OutcomeUnknown, ReachError, RemoteError
from reach_plugins.ids import new_request_id
from reach_plugins.jsonsafe import json_problem
from reach_plugins.media import MediaPart
from reach_plugins.units import Duration, Ratio

NAME_PATTERN = r"^[a-z][a-z0-9_.\-]*$"
"""Capability and agent names: lowercase letters, digits, ``_``, ``-`` and ``.``.

Semantic ``verb_object`` names (``query_order``, ``extract_clause``) are what the
docs recommend: the semantic matcher ranks on them.
"""
_NAME = re.compile(NAME_PATTERN)

HealthPath = Annotated[str, StringConstraints(pattern=r"^/[^\x00-\x20\x7f?#]*$", max_length=256)]
"""A URL path probed on an agent's endpoint: starts with ``/``, no spaces, control characters, query or fragment."""

HeaderText = Annotated[str, StringConstraints(pattern=r"^[^\x00-\x1f\x7f]*$", max_length=1024)]
"""Text that travels in a header (session, tenant, intent, idempotency key): no control characters."""

Protocol = Literal["reach", "openai-compatible", "raw-http", "a2a", "mcp"]
DangerLevel = Literal["low", "medium", "high"]
InstanceStatus = Literal["ready", "draining", "down"]
Priority = Literal["online", "batch"]
ErrorType = Literal[
    "business",
    "transient",
    "timeout",
    "rejected",
    "backpressure",
    "invalid_response",
    "circuit_open",
    "rate_limited",
    "cancelled",
]


def _check_name(value: str, what: str) -> str:
    if not _NAME.match(value):
        raise ValueError(
            f"{what} {value!r} must be a lowercase identifier (letters, digits, '_', '-', '.'), "
            "starting with a letter; verb_object names such as 'query_order' route best"
        )
    return value


class Strict(BaseModel):
    """Base for config-facing records: unknown keys are an error, never ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- policies


class Timeouts(Strict):
    """Three tiers: fail fast on connect, wait long for an answer, cut a silent stream."""

    connect: Duration = 3.0
    ttfbt: Duration | None = None
    """Time to first byte of the answer (the seeds' ``ttfbt``); ``None`` means only ``response`` applies."""
    response: Duration = 120.0
    total: Duration | None = None
    """Default whole-request budget when the caller gives no ``timeout_ms``."""
    stream_idle: Duration = 15.0


class RetryPolicy(Strict):
    """Full-jitter exponential backoff: ``sleep = U(0, min(max_wait, base_wait * 2**n))``."""

    max_attempts: int = Field(default=3, ge=1, le=10)
    strategy: Literal["full_jitter"] = "full_jitter"
    base_wait: Duration = 0.2
    max_wait: Duration = 3.0
    budget_max_tokens: float = Field(default=20.0, gt=0)
    """Retry budget size per target agent (gRPC retry throttling ``maxTokens``).

    A retry takes a token, a retry that succeeds gives back two: flaky agents
    (up to about 40 % independent failures) keep every retry, while a dead
    one stops getting retries after ten failed ones (see ``core.budget``).
    """
    budget_token_ratio: float = Field(default=0.2, gt=0)
    """Tokens a successful first attempt adds. No retries at half full or below."""


class RateLimit(Strict):
    """Token bucket per agent with a bounded wait, then ``RateLimited``."""

    qps: float = Field(gt=0)
    burst: int | None = Field(default=None, ge=1)
    max_wait: Duration = 3.0


class CircuitBreakerConfig(Strict):
    """Time-sliding window breaker per instance (60 s, 30 %); open 5 s, doubling on each re-open up to 60 s."""

    window: Duration = 60.0
    buckets: int = Field(default=10, ge=1)
    error_threshold: Ratio = 0.3
    min_calls: int = Field(default=10, ge=1)
    slow_call_duration: Duration | None = None
    slow_call_threshold: Ratio = 1.0
    open_wait: Duration = 5.0
    """How long the first opening lasts: short, so a short fault stays short (DESIGN 11.3)."""
    half_open_probes: int = Field(default=3, ge=1)
    max_open_wait: Duration = 60.0
    """Cap of the open time, which doubles on each consecutive re-open (a failed half-open probe)."""


class ConsistencyPolicy(Strict):
    """Eject an instance whose replies stop matching their requests (seed 001, section 2.2).

    Each reply is scored against its request (embedding cosine of the request's intent and payload text
    with the reply's text); an instance with ``max_low_rate`` or more of its last ``window`` replies
    below ``min_similarity`` (at least ``min_replies`` scored) is ejected for ``eject_for`` seconds,
    doubling on each consecutive ejection up to ``max_eject``, then probed with one call.
    """

    min_similarity: float = Field(default=0.1, ge=-1.0, le=1.0)
    window: int = Field(default=20, ge=1)
    min_replies: int = Field(default=5, ge=1)
    max_low_rate: Ratio = 0.5
    eject_for: Duration = 30.0
    max_eject: Duration = 300.0


class Hedging(Strict):
    """Hedged attempts (gRPC's hedging policy, "The Tail at Scale"): when the first attempt has not answered after
    a latency percentile of its capability, a second one goes to another instance; the first answer wins.

    Only for calls that may run twice: capabilities declared ``safe`` (reads), or keyed calls to an agent that
    declares shared idempotency (every instance checks the key). Never for an unkeyed write.
    """

    percentile: float = Field(default=0.95, gt=0.0, lt=1.0)
    """The hedge waits this percentile of the capability's recent successful latencies."""
    min_delay: Duration = 0.01
    max_delay: Duration = 1.0
    """The delay until ``min_samples`` latencies are known, and the cap of the percentile."""
    min_samples: int = Field(default=20, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> Hedging:
        if self.min_delay > self.max_delay:
            raise ValueError(f"hedging min_delay {self.min_delay} is above max_delay {self.max_delay}")
        return self


OnLoop = Literal["alert", "shed"]
"""What a loop does: ``alert`` (log and count only) or ``shed`` (also refuse the newer direction)."""


class LoopSettings(Strict):
    """The ``loops:`` config section (:mod:`reach_plugins.policy.dependency`): window, two-way threshold, action."""

    enabled: bool = True
    """On by default; ``false`` turns the alerts off (and the pipeline logs a warning saying so)."""
    window: Duration = 300.0
    """Seconds of the sliding window (the seed's 5 minutes)."""
    buckets: int = Field(default=60, ge=1, le=3600)
    """Buckets the window slides by (60: the window moves in ``window / 60`` steps)."""
    threshold: float = Field(default=1.0, gt=0)
    """Reaches per second, each way, at or above which a pair is a loop."""
    max_edges: int = Field(default=10_000, ge=2)
    """Directed edges kept; the least recently reached goes first."""
    on_loop: OnLoop = "alert"


class ReliefPolicy(Strict):
    """The ``relief:`` config section (:mod:`reach_plugins.routing.relief`): when an instance gives conversations
    back — above ``threshold`` load for ``hold`` seconds, ``share`` of those idle for ``idle`` seconds or more, then
    again after another ``hold`` if it is still hot."""

    enabled: bool = True
    """On by default; ``false`` keeps every conversation where it was pinned."""
    threshold: float = Field(default=0.8, gt=0, le=1)
    """The instance's load (0..1, as its heartbeats report it) from which it counts as hot."""
    hold: Duration = Field(default=30.0, ge=0)
    share: float = Field(default=0.25, gt=0, le=1)
    """The part of a hot instance's idle conversations moved at a time (rounded up)."""
    idle: Duration = Field(default=60.0, ge=0)
    check_every: Duration = Field(default=1.0, ge=0)
    """Seconds between two looks at the instances' loads (the look is O(instances))."""


class PoolConfig(Strict):
    """Connection pool per agent; 64 / 90 s is what the seeds settled on under load."""

    max_conns: int = Field(default=64, ge=1)
    idle_timeout: Duration = 90.0


class Routing(Strict):
    """Static routing preferences: ``priority`` 1 is tried before 2; within a priority the cheapest ``cost`` with a
    healthy instance takes new work; offers of equal priority and cost share it by ``weight`` (and load)."""

    weight: int = Field(default=100, ge=0)
    priority: int = Field(default=1, ge=0)
    cost: float = Field(default=0.0, ge=0)


class HealthCheck(Strict):
    """How liveness is judged: heartbeats every ``interval``, down after ``missed_heartbeats``; active probes.

    Active probes (:mod:`reach_plugins.routing.probes`, seed 003 section 5.2): ``GET {endpoint}/healthz``
    (answered 200 within a second) every ``probe_interval``, ``GET {endpoint}{path}`` every ``ready_interval``;
    ``refusals_to_down`` consecutive failed liveness probes (refused, reset, timed out, not 200) mark an instance
    down at once.
    """

    path: HealthPath = "/readyz"
    """What the probes GET: the agent's readiness (DESIGN section 4: ``/readyz`` can take work, ``/healthz`` is
    only alive); any path that answers 200 while the agent can take work will do."""
    interval: Duration = 10.0
    missed_heartbeats: int = Field(default=3, ge=1)
    probe: bool = True
    probe_interval: Duration = 5.0
    ready_interval: Duration = 30.0
    refusals_to_down: int = Field(default=2, ge=1)


class Idempotency(Strict):
    """Agent-wide idempotency: key template and dedup window."""

    key_from: str | None = None
    window: Duration = 300.0
    shared: bool = False
    """Every instance checks keys in one shared store (the agent SDK with ``idempotency="redis://..."``):
    after a lost answer a keyed call may go to any instance of this agent, not only the one that had it."""


class Auth(Strict):
    """How to authenticate to an agent. Secrets are references (``*_env``), never literals."""

    type: Literal["none", "header", "query", "bearer", "cert"] = "none"
    key: str | None = None
    """Header or query parameter name (``Authorization``, ``api_key``)."""
    value_env: str | None = None
    """Environment variable that holds the secret value."""
    ca_file: str | None = None
    client_cert: str | None = None
    client_cert_env: str | None = None
    client_key: str | None = None
    """Path of the client key file (a path, not the key)."""
    client_key_env: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> Auth:
        if self.type in ("header", "query") and not self.key:
            raise ValueError(f"auth type {self.type!r} needs 'key' (the header or parameter name)")
        if self.type in ("header", "query", "bearer") and not self.value_env:
            raise ValueError(f"auth type {self.type!r} needs 'value_env' naming the variable holding the secret")
        if self.type == "cert" and not (self.client_cert or self.client_cert_env):
            raise ValueError("auth type 'cert' needs 'client_cert' (a file) or 'client_cert_env'")
        return self


# --------------------------------------------------------------------------- descriptors


class Capability(Strict):
    """One thing an agent can do, named ``verb_object``, with the schemas of its input and output."""

    name: str
    description: str = ""
    params_schema: dict[str, Any] | None = None
    return_schema: dict[str, Any] | None = None
    scope_tags: list[str] = Field(default_factory=list)
    danger_level: DangerLevel = "low"
    require_approval: bool = False
    idempotency_key: str | None = None
    """Template such as ``${params.wo_number}``: the business key that makes a retry safe."""
    retryable: bool = True
    safe: bool = False
    """Running it twice changes nothing (a read): it may be hedged without an idempotency key."""
    hedging: Hedging | None = None
    """Overrides the agent's ``hedging`` for this capability."""
    max_concurrency: int | None = Field(default=None, ge=1)
    cost: float | None = Field(default=None, ge=0)
    """Relative cost of a call; overrides the agent's ``routing.cost``: cheapest healthy first within a tier."""
    input_tokens_required: int | None = Field(default=None, ge=1)
    """The largest input this capability takes, in estimated tokens (the payload's JSON at about four characters
    a token): the router skips it for a larger request and refuses with ``InputTooLong`` when nobody is left."""
    max_media_bytes: int = Field(default=0, ge=0)
    """The most media bytes (images, audio: :class:`~reach_plugins.media.MediaPart`) one request or reply carries;
    servers refuse more with ``MediaTooLarge`` before decoding them. 0 (the default) takes none: a server reads a
    body up to 1 MiB plus the base64 of the largest limit its capabilities declare, so media is opted into."""
    retry: RetryPolicy | None = None
    timeouts: Timeouts | None = None
    consistency: ConsistencyPolicy | None = None
    """Opt in to reply consistency checks (:mod:`reach_plugins.policy.consistency`)."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _check_name(value, "capability name")

    @property
    def needs_approval(self) -> bool:
        return self.require_approval or self.danger_level == "high"


def _check_endpoint(url: str) -> str:
    """The structural endpoint rule every record obeys, built, loaded or read (http/https/grpc, no userinfo, not
    link-local); the operator's allowed networks are an ``EndpointPolicy`` applied by whatever admits records."""
    problem = endpoint_problem(url)
    if problem is not None:
        raise ValueError(problem)
    return url


class Instance(Strict):
    """A running copy of an agent. ``last_heartbeat`` ``None`` means static (not heartbeat-tracked)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: str
    instance_id: str
    endpoint: str
    status: InstanceStatus = "ready"
    load: float = Field(default=0.0, ge=0.0, le=1.0)
    heartbeat_seq: int = 0
    last_heartbeat: float | None = None
    metadata: dict[str, str] = Field(default_factory=dict)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        return _check_endpoint(value)


class AgentDescriptor(Strict):
    """Everything the reach layer knows about one agent (DESIGN.md section 3)."""

    name: str
    version: str = ""
    namespace: str = "default"
    description: str = ""
    protocol: Protocol = "reach"
    endpoints: list[str] = Field(default_factory=list)
    instances: list[Instance] = Field(default_factory=list)
    capabilities: list[Capability] = Field(default_factory=list)
    intents: list[str] = Field(default_factory=list)
    auth: Auth = Field(default_factory=Auth)
    pool: PoolConfig = Field(default_factory=PoolConfig)
    routing: Routing = Field(default_factory=Routing)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    rate_limit: RateLimit | None = None
    circuit_breaker: CircuitBreakerConfig = Field(default_factory=CircuitBreakerConfig)
    idempotency: Idempotency = Field(default_factory=Idempotency)
    hedging: Hedging | None = None
    """Hedged attempts for the capabilities that may take them (off unless given)."""
    internal_only: bool = False
    tenants: list[str] | None = None
    """Tenants allowed to reach this agent; ``None`` means every tenant the tenant table allows."""
    trust_level: Literal["L1", "L2", "L3"] = Field(default="L2", validation_alias=AliasChoices("trust_level", "trust"))
    """L1 mutual TLS + token, L2 token (default), L3 gateway only and audited (DESIGN.md 11.4); YAML ``trust:``."""
    health_check: HealthCheck = Field(default_factory=HealthCheck)
    protocol_options: dict[str, Any] = Field(default_factory=dict)
    """Adapter settings (request template, response mapping for ``raw-http``...)."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _check_name(value, "agent name")

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, value: list[str]) -> list[str]:
        return [_check_endpoint(url) for url in value]

    @field_validator("capabilities", mode="before")
    @classmethod
    def _plain_names(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"name": item} if isinstance(item, str) else item for item in value]
        return value

    @model_validator(mode="after")
    def _unique_capabilities(self) -> AgentDescriptor:
        seen: set[str] = set()
        for cap in self.capabilities:
            if cap.name in seen:
                raise ValueError(f"capability {cap.name!r} is listed twice")
            seen.add(cap.name)
        return self

    def capability(self, name: str) -> Capability | None:
        return next((cap for cap in self.capabilities if cap.name == name), None)

    def static_instances(self) -> list[Instance]:
        """Instances named by ``endpoints`` (ids ``{name}-0``, ``{name}-1``...) plus registered ones."""
        listed = [
            Instance(agent=self.name, instance_id=f"{self.name}-{i}", endpoint=url)
            for i, url in enumerate(self.endpoints)
        ]
        return listed + list(self.instances)


# --------------------------------------------------------------------------- requests


class Hop(BaseModel):
    """One step of a chain of reaches: which agent served which capability."""

    model_config = ConfigDict(frozen=True)

    agent: str
    capability: str

    def __str__(self) -> str:
        return f"{self.agent}/{self.capability}"

    @classmethod
    def parse(cls, text: str) -> Hop:
        agent, _, capability = text.strip().partition("/")
        if not agent or not capability:
            raise ValueError(f"a hop is written 'agent/capability', got {text!r}")
        return cls(agent=agent, capability=capability)


class ReachRequest(BaseModel):
    """A request addressed to a capability, not to a URL."""

    model_config = ConfigDict(frozen=True)

    request_id: str = Field(default_factory=new_request_id)
    capability: str
    action: str | None = None
    payload: dict[str, Any] = Field(default_factory=dict)
    session_id: HeaderText | None = None
    tenant: HeaderText | None = None
    intent: HeaderText | None = None
    idempotency_key: HeaderText | None = None
    deadline: float | None = None
    """Absolute deadline, seconds since the epoch (it crosses processes)."""
    timeout_ms: int | None = Field(default=None, gt=0)
    hops: list[Hop] = Field(default_factory=list)
    priority: Priority = "online"
    retried_upstream: bool = False
    """Set when a layer above owns retries for this request: this layer must not retry it."""
    scope_tags: list[str] = Field(default_factory=list)
    """Required tags: only capabilities carrying all of them qualify."""
    metadata: dict[str, str] = Field(default_factory=dict)
    media: list[MediaPart] = Field(default_factory=list)
    """Binary parts beside the JSON payload (images, audio, files), by value or by URL."""

    @field_validator("payload")
    @classmethod
    def _json_can_carry(cls, payload: dict[str, Any]) -> dict[str, Any]:
        """NaN and Infinity have no JSON form: refused before anything is sent, rather than altered on the wire."""
        problem = json_problem(payload)
        if problem is not None:
            raise ValueError(problem)
        return payload


class ErrorInfo(BaseModel):
    """What went wrong, in the wire shape ``{"type", "message"}``."""

    model_config = ConfigDict(frozen=True)

    type: ErrorType | str
    message: str
    retry_after: float | None = None


class CandidateScore(BaseModel):
    """One candidate the router looked at, with its score or why it was skipped."""

    model_config = ConfigDict(frozen=True)

    agent: str
    instance: str | None = None
    score: float | None = None
    skipped: str | None = None


class RouteDecision(BaseModel):
    """Why a request went where it went."""

    model_config = ConfigDict(frozen=True)

    capability: str
    candidates: list[CandidateScore] = Field(default_factory=list)
    agent: str
    instance: str
    endpoint: str
    reason: str
    affinity: Literal["none", "new", "pinned", "restored", "degraded"] = "none"
    context_restore: bool = False
    degraded: bool = False
    elapsed_us: float = 0.0
    outliers: dict[str, str] = Field(default_factory=dict)
    """Candidates judged outliers against their peers (``agent/instance`` -> why): a cut weight, or ejected."""
    relieved_from: str | None = None
    """``agent/instance`` a conversation was moved off because it stayed hot (hot-spot relief), else None."""


class Attempt(BaseModel):
    """One try at one instance."""

    model_config = ConfigDict(frozen=True)

    number: int
    agent: str
    instance: str
    endpoint: str
    started_at: float
    duration_ms: float
    outcome: Literal[
        "success", "business", "handler_failed", "transient", "timeout", "invalid_response", "backpressure", "cancelled"
    ]
    error: str | None = None
    retry_delay_ms: float | None = None
    breaker_state: str | None = None
    delivery: Literal["answered", "not_delivered", "unknown"] = "answered"
    """``not_delivered``: the agent certainly never saw it; ``unknown``: sent, then no answer (DESIGN 11.1)."""

    @property
    def delivered(self) -> bool:
        """Whether the agent may have executed this attempt."""
        return self.delivery != "not_delivered"


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One finished attempt as the attempt path reports it (the fields of :class:`Attempt`, built cheaply on the
    hot path; the model is built only when a trace is)."""

    number: int
    agent: str
    instance: str
    endpoint: str
    started_at: float
    duration_ms: float
    outcome: str
    error: str | None
    retry_delay_ms: float | None
    breaker_state: str
    delivery: str


class ReachTrace(BaseModel):
    """The trajectory of one request: route decision, every attempt, final status."""

    request_id: str
    capability: str
    tenant: str | None = None
    session_id: str | None = None
    route: RouteDecision | None = None
    attempts: list[Attempt] = Field(default_factory=list)
    dedup_hit: bool = False
    events: list[dict[str, Any]] = Field(default_factory=list)
    status: str = "pending"
    error: ErrorInfo | None = None
    started_at: float = 0.0
    duration_ms: float = 0.0
    usage: dict[str, int] | None = None
    """Tokens the agent reported for this request (OpenAI-compatible ``usage``), for ``telemetry.usage``."""


class ReachResponse(BaseModel):
    """The outcome of a request that reached at least one agent (or a stored duplicate)."""

    request_id: str
    status: Literal["success", "fail", "timeout"]
    data: Any = None
    error: ErrorInfo | None = None
    agent: str | None = None
    instance: str | None = None
    attempts: int = 0
    cost_ms: float = 0.0
    context_restore: bool = False
    degraded: bool = False
    media: list[MediaPart] = Field(default_factory=list)
    """Binary parts the agent returned beside ``data``."""
    trace: ReachTrace | None = None

    @property
    def ok(self) -> bool:
        return self.status == "success"

    def raise_for_status(self) -> ReachResponse:
        """Raise the matching :mod:`reach_plugins.errors` exception unless the request succeeded."""
        if self.status != "success":
            raise error_for_response(self)
        return self


def error_for_response(response: ReachResponse) -> ReachError:
    """The exception that matches a failed response (``raise_for_status``): raising from a response lives here."""
    info = response.error
    if info is None:
        kind = DeadlineExceeded.code if response.status == "timeout" else RemoteError.code
        message = f"request {response.request_id} ended with status {response.status}"
    else:
        kind, message = info.type, info.message
    if kind == OutcomeUnknown.code:  # may come with status "timeout": the answer is lost, not merely late
        return OutcomeUnknown(message)
    if kind == DeadlineExceeded.code or response.status == "timeout":
        return DeadlineExceeded(message, response.trace.attempts if response.trace else ())
    return WIRE_CODES.get(kind, RemoteError).from_wire(message, info.retry_after if info else None)
