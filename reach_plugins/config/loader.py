"""YAML configuration: agents, shared ``defaults:`` that each agent overrides key by key, tenants, quotas.

A top-level ``agents:`` list uses the AgentDescriptor field names; ``defaults:``
holds agent-level blocks (``retry``, ``timeouts``, ``pool``...) deep-merged
under every agent; ``tenants:`` maps a tenant to its token, allow-list, source
networks and its own per-agent credentials; ``quotas:`` holds the fleet's budgets
(:mod:`reach_plugins.config.quotas`). ``examples/agents.yaml`` shows every
field. The seeds' other dialects (``agent:``, ``connectors:``, ``base_url``,
top-level ``tools:``...) are translated by :mod:`reach_plugins.config.shapes`.

Secrets are references only (``value_env``). A literal secret, like every other
mistake, is a :class:`~reach_plugins.errors.ConfigError` whose message names the
file and the path of the key, e.g. ``agents.yaml: agents[2].capabilities[0].name: ...``.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from reach_plugins.config.quotas import QuotaConfig
from reach_plugins.config.shapes import (
    TOP_LEVEL_KEYS,
    Problems,
    Shaped,
    apply_catalogue,
    check_env_name,
    check_literal_secrets,
    check_secret_refs,
    closest,
    collect_agents,
    merge_defaults,
    read_yaml,
    shape_blocks,
    shape_capability,
    validation_problems,
)
from reach_plugins.endpoints import ANY_NETWORK, EndpointPolicy
from reach_plugins.errors import ConfigError
from reach_plugins.matching.ranking import DEFAULT_WEIGHTS, check_weights
from reach_plugins.model import (
    AgentDescriptor,
    Auth,
    Capability,
    CircuitBreakerConfig,
    HealthCheck,
    Hedging,
    Idempotency,
    LoopSettings,
    PoolConfig,
    Protocol,
    ReliefPolicy,
    RetryPolicy,
    Routing,
    Strict,
    Timeouts,
)
from reach_plugins.transport import Credential
from reach_plugins.units import Duration


def _env_name(value: str) -> str:
    return check_env_name(value, "this field")


EnvName = Annotated[str, AfterValidator(_env_name)]
"""The name of an environment variable that holds a secret (never the secret itself)."""


class CredentialRef(Strict):
    """One tenant's own credential for one agent; ``type`` defaults to the agent's auth type."""

    type: Literal["header", "query", "bearer", "cert"] | None = None
    key: str | None = None
    value_env: EnvName | None = None
    client_cert: str | None = None
    client_key: str | None = None
    client_cert_env: EnvName | None = None
    client_key_env: EnvName | None = None

    def gaps(self, auth: Auth) -> list[str]:
        """What this credential lacks to authenticate to an agent whose own auth is ``auth``."""
        kind = self.type or auth.type
        if kind == "none":
            return ["the agent uses no auth: give this credential a 'type' (header, query, bearer or cert)"]
        gaps = []
        if kind in ("header", "query") and not (self.key or auth.key):
            gaps.append(f"a {kind} credential needs 'key' (the header or parameter name)")
        if kind in ("header", "query", "bearer") and not self.value_env:
            gaps.append(f"a {kind} credential needs 'value_env' naming the variable with this tenant's secret")
        if kind == "cert" and not (self.client_cert or self.client_cert_env):
            gaps.append("a cert credential needs 'client_cert' (a file) or 'client_cert_env'")
        return gaps


class TenantConfig(Strict):
    """Who a tenant is, which agents it may reach, from where, and with which credentials."""

    token_env: EnvName | None = None
    """Variable holding the bearer token this tenant presents to a gateway or node."""
    agents: list[str] | Literal["*"]
    """Allow-list of agent names; ``"*"`` (alone or in the list) allows every agent."""
    networks: list[str] = Field(default_factory=list)
    """Source CIDRs allowed to reach ``internal_only`` agents."""
    credentials: dict[str, CredentialRef] = Field(default_factory=dict)
    """This tenant's own downstream credentials, by agent name: never shared with another tenant."""

    @field_validator("agents", mode="before")
    @classmethod
    def _allow_list(cls, value: Any) -> Any:
        if value == "*" or (isinstance(value, list) and "*" in value):
            return "*"
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ValueError(f"agents must be a list of agent names, or '*' for all, got {value!r}")
        return value

    @field_validator("networks")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        return [_network(text) for text in value]

    def allows(self, agent_name: str) -> bool:
        """Whether this tenant may reach ``agent_name``."""
        return self.agents == "*" or agent_name in self.agents

    def allows_address(self, address: str) -> bool:
        """Whether ``address`` lies in one of ``networks`` (no networks: no address qualifies)."""
        ip = ipaddress.ip_address(address)
        return any(ip in ipaddress.ip_network(net) for net in self.networks)


def _network(text: str) -> str:
    try:
        return str(ipaddress.ip_network(text))
    except ValueError as exc:
        try:
            loose = ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise ValueError(f"{text!r} is not a CIDR network such as 10.0.0.0/8 ({exc})") from None
        raise ValueError(f"{text!r} has host bits set; did you mean {loose}?") from None


RESERVED_PREFIX: Final = "REACH_"
"""The library's own environment variables (``REACH_ETCD_PASSWORD``, ``REACH_ISSUER_KEYS``, ...)."""


class SecretsPolicy(Strict):
    """Which environment variables an agent descriptor may name as its secret (``auth.value_env`` and the
    ``*_env`` of a client certificate): the secret is sent to that descriptor's endpoint, so a descriptor must
    not be able to pull any variable of the gateway or node into its auth.

    A tenant's ``token_env`` (the bearer a tenant presents to a gateway or node) is never allowed, nor, unless
    ``env_allow`` or ``env_prefix`` allows it, a variable of the library's own (``REACH_*``: the etcd password,
    the issuer's signing keys). With ``env_prefix`` or ``env_allow`` given, only variables starting with the
    prefix or listed are.
    """

    env_prefix: str | None = None
    """For example ``REACH_SECRET_``: descriptors may name only variables starting with it (or in ``env_allow``)."""
    env_allow: list[EnvName] = Field(default_factory=list)

    def problem(self, name: str, tenant_tokens: Collection[str]) -> str | None:
        """Why a descriptor may not name variable ``name`` (None: it may)."""
        if name in tenant_tokens:
            return (
                f"environment variable {name} holds a tenant's token (its token_env): a descriptor's auth may not "
                "name it, or that token would go to the descriptor's endpoint; give the agent a variable of its own"
            )
        allowed = name in self.env_allow or (self.env_prefix is not None and name.startswith(self.env_prefix))
        if name.startswith(RESERVED_PREFIX) and not allowed:
            return (
                f"environment variable {name} is one of reach-plugins' own ({RESERVED_PREFIX}*: registry password, "
                "signing keys): a descriptor's auth may not name it, or it would go to the descriptor's endpoint; "
                "give the agent a variable of its own (or allow it under secrets: env_allow or env_prefix)"
            )
        if allowed or (self.env_prefix is None and not self.env_allow):
            return None
        must = " or ".join(
            part
            for part in (
                f"start with {self.env_prefix!r}" if self.env_prefix else "",
                f"be one of {self.env_allow}" if self.env_allow else "",
            )
            if part
        )
        return f"environment variable {name} is not allowed for descriptors' secrets (secrets:): it must {must}"


NO_SECRETS_POLICY = SecretsPolicy()
"""Any variable but a tenant's token and the library's own (the default when a config has no ``secrets:`` block)."""


def token_envs(tenants: Mapping[str, TenantConfig]) -> frozenset[str]:
    """The variables holding the tenants' own tokens: never a descriptor's secret."""
    return frozenset(tenant.token_env for tenant in tenants.values() if tenant.token_env)


def _auth_envs(auth: Auth | CredentialRef) -> list[tuple[str, str]]:
    """``(field, variable)`` for each environment variable ``auth`` (an agent's, or a tenant's own) names."""
    named = (("value_env", auth.value_env), ("client_cert_env", auth.client_cert_env))
    return [(key, name) for key, name in (*named, ("client_key_env", auth.client_key_env)) if name]


def unallowed_secrets(
    agents: list[tuple[str, AgentDescriptor]], tenants: Mapping[str, TenantConfig], secrets: SecretsPolicy
) -> Problems:
    """Descriptors naming a variable the operator did not allow as their secret, and tenants' own credentials
    naming a tenant's token (it would be sent downstream as the tenant's key)."""
    reserved = token_envs(tenants)
    problems: Problems = [
        (f"{path}.auth.{key}", problem)
        for path, agent in agents
        for key, name in _auth_envs(agent.auth)
        if (problem := secrets.problem(name, reserved)) is not None
    ]
    problems += [
        (f"tenants.{tenant}.credentials.{agent}.{key}", problem)
        for tenant, config in tenants.items()
        for agent, ref in config.credentials.items()
        for key, name in _auth_envs(ref)
        if (problem := NO_SECRETS_POLICY.problem(name, reserved)) is not None
    ]
    return problems


class AuthDefaults(Strict):
    """A partial ``auth`` for ``defaults:``: each agent completes it (say, with its own ``value_env``)."""

    type: Literal["none", "header", "query", "bearer", "cert"] | None = None
    key: str | None = None
    value_env: EnvName | None = None
    ca_file: str | None = None
    client_cert: str | None = None
    client_cert_env: EnvName | None = None
    client_key: str | None = None
    client_key_env: EnvName | None = None


class RateLimitDefaults(Strict):
    """A partial ``rate_limit`` for ``defaults:`` (``qps`` may be left to each agent)."""

    qps: float | None = Field(default=None, gt=0)
    burst: int | None = Field(default=None, ge=1)
    max_wait: Duration | None = None


class AgentDefaults(Strict):
    """Agent-level blocks shared by every agent; a block an agent gives overrides these key by key."""

    namespace: str | None = None
    protocol: Protocol | None = None
    auth: AuthDefaults | None = None
    pool: PoolConfig | None = None
    routing: Routing | None = None
    timeouts: Timeouts | None = None
    retry: RetryPolicy | None = None
    rate_limit: RateLimitDefaults | None = None
    circuit_breaker: CircuitBreakerConfig | None = None
    idempotency: Idempotency | None = None
    hedging: Hedging | None = None
    internal_only: bool | None = None
    tenants: list[str] | None = None
    trust_level: Literal["L1", "L2", "L3"] | None = None
    health_check: HealthCheck | None = None
    protocol_options: dict[str, Any] | None = None


class MatchingConfig(Strict):
    """``matching:``: how a near tie by meaning is ranked (``ReachEnhancer(capacity_weights=...)`` takes it)."""

    capacity_weights: tuple[float, float] | None = DEFAULT_WEIGHTS
    """Similarity, free capacity (seed 001 section 3.2); ``null`` leaves a near tie ambiguous."""

    @field_validator("capacity_weights")
    @classmethod
    def _weights(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        try:
            return None if value is None else check_weights(value)
        except ConfigError as exc:
            raise ValueError(exc.message) from None  # reported under its path: matching.capacity_weights


class ReachConfig(BaseModel):
    """A loaded configuration: the agents (defaults applied), the tenant table, the defaults themselves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agents: list[AgentDescriptor] = Field(default_factory=list)
    tenants: dict[str, TenantConfig] = Field(default_factory=dict)
    defaults: AgentDefaults = Field(default_factory=AgentDefaults)
    matching: MatchingConfig = Field(default_factory=MatchingConfig)
    tools: dict[str, Capability] = Field(default_factory=dict)
    """Top-level ``tools:`` catalogue: capability declarations merged into agents offering them."""
    secrets: SecretsPolicy = NO_SECRETS_POLICY
    """Which variables descriptors may name as their secrets."""
    quotas: QuotaConfig | None = None
    """Fleet-wide budgets (:mod:`reach_plugins.config.quotas`), applied by every client and server given this file."""
    loops: LoopSettings = Field(default_factory=LoopSettings)
    """``loops:``: dependency-loop alerts (two agents reaching each other too often), on by default."""
    relief: ReliefPolicy = Field(default_factory=ReliefPolicy)
    """``relief:``: hot-spot relief (idle conversations leave an instance that stays hot), on by default."""
    source: str = "<config>"

    @model_validator(mode="after")
    def _consistent(self) -> ReachConfig:
        problems = cross_check([(f"agents[{i}]", agent) for i, agent in enumerate(self.agents)], self.tenants)
        if problems:
            raise ValueError("; ".join(f"{path}: {message}" for path, message in problems))
        return self

    def agent(self, name: str) -> AgentDescriptor:
        """The agent called ``name``; ``ConfigError`` (with the closest names) when there is none."""
        for agent in self.agents:
            if agent.name == name:
                return agent
        raise ConfigError(f"{self.source}: no agent named {name!r}{closest(name, [a.name for a in self.agents])}")

    def tenant(self, name: str) -> TenantConfig:
        """The tenant called ``name``; ``ConfigError`` when the tenant table has no such entry."""
        if name in self.tenants:
            return self.tenants[name]
        raise ConfigError(f"{self.source}: no tenant named {name!r}{closest(name, list(self.tenants))}")


def cross_check(agents: list[tuple[str, AgentDescriptor]], tenants: Mapping[str, TenantConfig]) -> Problems:
    """References between records: unique agent names, tenants naming real agents, credentials that fit."""
    problems: Problems = []
    first: dict[str, str] = {}
    for path, agent in agents:
        if agent.name in first:
            problems.append((f"{path}.name", f"agent name {agent.name!r} is already used by {first[agent.name]}"))
        first.setdefault(agent.name, path)
        for index, tenant_name in enumerate(agent.tenants or []):
            if tenants and tenant_name not in tenants:
                hint = closest(tenant_name, [*tenants])
                problems.append((f"{path}.tenants[{index}]", f"unknown tenant {tenant_name!r}{hint}"))
    by_name = {agent.name: agent for _, agent in agents}
    for name, tenant in tenants.items():
        for index, agent_name in enumerate(tenant.agents if tenant.agents != "*" else []):
            if agent_name not in by_name:
                hint = closest(agent_name, [*by_name])
                problems.append((f"tenants.{name}.agents[{index}]", f"unknown agent {agent_name!r}{hint}"))
        for agent_name, ref in tenant.credentials.items():
            where = f"tenants.{name}.credentials.{agent_name}"
            if agent_name not in by_name:
                hint = closest(agent_name, [*by_name])
                problems.append((where, f"credential for unknown agent {agent_name!r}{hint}"))
            elif not tenant.allows(agent_name):
                problems.append((where, f"tenant {name!r} has a credential for {agent_name!r} but may not reach it"))
            else:
                problems.extend((where, gap) for gap in ref.gaps(by_name[agent_name].auth))
    return problems


def outside(agents: list[tuple[str, AgentDescriptor]], endpoints: EndpointPolicy) -> Problems:
    """Endpoints the policy refuses (the records already obey the structural rule: this is the networks limit)."""
    problems: Problems = []
    for path, agent in agents:
        found = [(f"{path}.endpoints[{n}]", url) for n, url in enumerate(agent.endpoints)]
        found += [(f"{path}.instances[{n}].endpoint", inst.endpoint) for n, inst in enumerate(agent.instances)]
        problems += [(where, problem) for where, url in found if (problem := endpoints.problem(url)) is not None]
    return problems


def load_config(path: str | os.PathLike[str], *, endpoints: EndpointPolicy = ANY_NETWORK) -> ReachConfig:
    """Read and validate a YAML config file, its agents' endpoints under ``endpoints``; every problem is a
    ``ConfigError`` naming the file."""
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot read the config file: {exc}") from exc
    return parse_config(text, source=source, endpoints=endpoints)


def parse_config(
    data: str | Mapping[str, Any], *, source: str = "<string>", endpoints: EndpointPolicy = ANY_NETWORK
) -> ReachConfig:
    """Validate a config given as YAML text or as an already parsed mapping (endpoints under ``endpoints``)."""
    doc = read_yaml(data, source) if isinstance(data, str) else data
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{source}: the top level must be a mapping with an 'agents:' list, got {type(doc).__name__}")
    expected = f"unknown top-level key; expected {', '.join(TOP_LEVEL_KEYS)}"
    problems: Problems = [(str(key), expected) for key in doc if key not in TOP_LEVEL_KEYS]
    defaults_body, defaults = _defaults(doc.get("defaults", {}), problems)
    catalogue_body, catalogue = _catalogue(doc.get("tools", []), problems)
    shaped = collect_agents(doc, problems)
    agents = [_agent(one, defaults_body, catalogue_body, problems) for one in shaped]
    tenants = _tenants(doc.get("tenants", {}), problems)
    secrets = _validate(SecretsPolicy, Shaped("secrets", doc.get("secrets", {})), problems)
    quotas = _validate(QuotaConfig, Shaped("quotas", doc["quotas"]), problems) if "quotas" in doc else None
    matching = _validate(MatchingConfig, Shaped("matching", doc.get("matching", {})), problems)
    loops = _validate(LoopSettings, Shaped("loops", doc.get("loops") or {}), problems)
    relief = _validate(ReliefPolicy, Shaped("relief", doc.get("relief") or {}), problems)
    _raise_if(problems, source)
    secrets = secrets or NO_SECRETS_POLICY
    placed = [(one.path, agent) for one, agent in zip(shaped, agents, strict=True) if agent is not None]
    checked = cross_check(placed, tenants) + outside(placed, endpoints) + unallowed_secrets(placed, tenants, secrets)
    _raise_if(checked, source)
    return ReachConfig(
        agents=[agent for _, agent in placed],
        tenants=tenants,
        defaults=defaults or AgentDefaults(),
        tools=catalogue,
        matching=matching or MatchingConfig(),
        secrets=secrets,
        quotas=quotas,
        loops=loops or LoopSettings(),
        relief=relief or ReliefPolicy(),
        source=source,
    )


def _raise_if(problems: Problems, source: str) -> None:
    if problems:
        raise ConfigError("\n".join(f"{source}: {path}: {message}" for path, message in problems), problems=problems)


_AUTH_KEYS = frozenset(Auth.model_fields)
_CREDENTIAL_KEYS = frozenset(CredentialRef.model_fields)
_M = TypeVar("_M", bound=BaseModel)


def _validate(model: type[_M], shaped: Shaped, problems: Problems) -> _M | None:
    try:
        return model.model_validate(shaped.body)
    except ValidationError as exc:
        problems.extend(validation_problems(exc, model, shaped))
        return None


def _defaults(raw: Any, problems: Problems) -> tuple[dict[str, Any], AgentDefaults | None]:
    if not isinstance(raw, Mapping):
        problems.append(("defaults", "expected a mapping of agent-level blocks (retry, timeouts, pool...)"))
        return {}, None
    shaped = Shaped("defaults", {})
    shaped.body = shape_blocks(raw, "defaults", problems, shaped.renames)
    if not check_secret_refs(shaped.body.get("auth"), "defaults.auth", _AUTH_KEYS, problems):
        return {}, None
    defaults = _validate(AgentDefaults, shaped, problems)
    return (shaped.body, defaults) if defaults is not None else ({}, None)


def _catalogue(raw: Any, problems: Problems) -> tuple[dict[str, dict[str, Any]], dict[str, Capability]]:
    if not isinstance(raw, list):
        problems.append(("tools", "expected a list of tool declarations ({name, idempotency_key, retryable...})"))
        return {}, {}
    bodies: dict[str, dict[str, Any]] = {}
    tools: dict[str, Capability] = {}
    for index, item in enumerate(raw):
        shaped = shape_capability(item, f"tools[{index}]", problems)
        tool = _validate(Capability, shaped, problems)
        if tool is not None and tool.name in tools:
            problems.append((f"tools[{index}].name", f"tool {tool.name!r} is declared twice"))
        elif tool is not None:
            bodies[tool.name], tools[tool.name] = shaped.body, tool
    return bodies, tools


def _agent(
    shaped: Shaped, defaults: Mapping[str, Any], catalogue: Mapping[str, Mapping[str, Any]], problems: Problems
) -> AgentDescriptor | None:
    if not check_secret_refs(shaped.body.get("auth"), f"{shaped.path}.auth", _AUTH_KEYS, problems):
        return None
    shaped.body = apply_catalogue(merge_defaults(defaults, shaped.body), catalogue)
    before = len(problems)
    check_literal_secrets(shaped.body.get("protocol_options"), f"{shaped.path}.protocol_options", problems)
    if len(problems) > before:
        return None
    return _validate(AgentDescriptor, shaped, problems)


def _tenants(raw: Any, problems: Problems) -> dict[str, TenantConfig]:
    if not isinstance(raw, Mapping):
        problems.append(("tenants", "expected a mapping of tenant name to {token_env, agents, networks, credentials}"))
        return {}
    tenants: dict[str, TenantConfig] = {}
    for name, body in raw.items():
        path = f"tenants.{name}"
        credentials = body.get("credentials") if isinstance(body, Mapping) else None
        refs = credentials.items() if isinstance(credentials, Mapping) else ()
        clean = [
            check_secret_refs(ref, f"{path}.credentials.{agent}", _CREDENTIAL_KEYS, problems) for agent, ref in refs
        ]
        if not all(clean):
            continue
        tenant = _validate(TenantConfig, Shaped(path, body), problems)
        if tenant is not None:
            tenants[str(name)] = tenant
    return tenants


def resolve_credential(
    agent: AgentDescriptor,
    tenant: TenantConfig | None,
    environ: Mapping[str, str] = os.environ,
    *,
    secrets: SecretsPolicy = NO_SECRETS_POLICY,
    tenant_tokens: Collection[str] = (),
) -> Credential:
    """The credential to present to ``agent`` on behalf of ``tenant``.

    The tenant's own credential for this agent wins; without one, the agent's
    ``auth`` applies. Secrets are read from ``environ`` now, so a missing
    variable is a ``ConfigError`` naming it. For certificates, ``*_env``
    variables hold file paths. A descriptor (read from a registry, say) that
    names a variable ``secrets`` does not allow, or one of ``tenant_tokens``,
    is a ``ConfigError`` and nothing is read.
    """
    ref = tenant.credentials.get(agent.name) if tenant is not None else None
    auth = agent.auth
    if ref is None:
        whose = f"agent {agent.name!r}"
        for key, name in _auth_envs(auth):
            problem = secrets.problem(name, tenant_tokens)
            if problem is not None:
                raise ConfigError(f"{whose}: auth.{key}: {problem}", env=name)
        return Credential(
            type=auth.type,
            key=auth.key,
            value=_env(environ, auth.value_env, whose),
            cert_file=auth.client_cert or _env(environ, auth.client_cert_env, whose),
            key_file=auth.client_key or _env(environ, auth.client_key_env, whose),
            ca_file=auth.ca_file,
        )
    whose = f"this tenant's credential for agent {agent.name!r}"
    kind = ref.type or auth.type
    if kind == "none":
        raise ConfigError(f"{whose} has no type and the agent uses no auth; give the credential a 'type'")
    return Credential(
        type=kind,
        key=ref.key or auth.key,
        value=_env(environ, ref.value_env, whose),
        cert_file=ref.client_cert or _env(environ, ref.client_cert_env, whose),
        key_file=ref.client_key or _env(environ, ref.client_key_env, whose),
        ca_file=auth.ca_file,
    )


def _env(environ: Mapping[str, str], name: str | None, whose: str) -> str | None:
    if name is None:
        return None
    value = environ.get(name)
    if not value:
        state = "is empty" if value == "" else "is not set"
        raise ConfigError(f"environment variable {name} {state}: it holds the secret of {whose}", env=name)
    return value
