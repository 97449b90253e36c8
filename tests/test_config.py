"""YAML configuration: the seeds' shapes, defaults, strictness, tenants and credentials."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from reach_plugins.config.loader import (
    AgentDefaults,
    CredentialRef,
    ReachConfig,
    TenantConfig,
    load_config,
    parse_config,
    resolve_credential,
)
from reach_plugins.errors import ConfigError
from reach_plugins.model import AgentDescriptor, Capability, CircuitBreakerConfig, Instance, RetryPolicy

SEEDS = Path(__file__).parent / "fixtures" / "seeds"
EXAMPLE = Path(__file__).parent.parent / "examples" / "agents.yaml"


def config_error(text: str, source: str = "agents.yaml") -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, source=source)
    return caught.value.message


# --------------------------------------------------------------------------- the seeds' own examples


def test_seed_cloud_agent_loads_with_units_parsed() -> None:
    """Seed 000 §3.2: endpoint, header auth by reference, pool 90s and routing come through."""
    agent = load_config(SEEDS / "000_cloud_agent.yaml").agent("cloud-chat-sales")
    assert agent.endpoints == ["https://127.0.0.1:8443/v1"]
    assert agent.protocol == "openai-compatible"
    assert [cap.name for cap in agent.capabilities] == ["chat", "tool-calling"]
    assert (agent.auth.type, agent.auth.key, agent.auth.value_env) == ("header", "Authorization", "CLOUD_SALES_TOKEN")
    assert (agent.pool.max_conns, agent.pool.idle_timeout) == (64, 90.0)
    assert (agent.routing.weight, agent.routing.priority) == (70, 1)


def test_seed_internal_agent_keeps_cert_auth_and_internal_only() -> None:
    """Seed 000 §3.3: internal_only and a cert auth whose key comes from the environment."""
    agent = load_config(SEEDS / "000_internal_agent.yaml").agent("internal-order-agent")
    assert agent.internal_only is True
    assert agent.auth.type == "cert"
    assert agent.auth.ca_file == "/etc/agent-reach/certs/ca.pem"
    assert agent.auth.client_cert == "/etc/agent-reach/certs/client.crt"
    assert agent.auth.client_key_env == "INTERNAL_CLIENT_KEY"
    assert (agent.routing.weight, agent.routing.priority) == (30, 2)


def test_seed_registration_template_maps_singular_agent_weight_and_interval_sec() -> None:
    """Seed 001 §3.1: `agent:` is one agent, top-level weight goes to routing, interval_sec to interval."""
    config = load_config(SEEDS / "001_registration.yaml")
    agent = config.agent("contract-clause-extractor")
    assert len(config.agents) == 1
    assert (agent.version, agent.namespace) == ("2.1.0", "production")
    extract = agent.capability("extract_clause")
    assert extract is not None
    assert (extract.input_tokens_required, extract.max_concurrency) == (8000, 8)
    assert agent.capability("summarize_obligations") is not None
    assert (agent.health_check.path, agent.health_check.interval) == ("/healthz", 10.0)
    assert agent.routing.weight == 80


def test_seed_tools_load_as_a_capability_catalogue() -> None:
    """Seed 002 §3.3: a top-level tools list declares capabilities by name, with no agent yet."""
    config = load_config(SEEDS / "002_tools.yaml")
    assert config.agents == []
    tool = config.tools["create_wo"]
    assert (tool.idempotency_key, tool.retryable) == ("${params.wo_number}", True)


def test_seed_connector_becomes_a_raw_http_agent() -> None:
    """Seed 002 §5.2: a connector is an agent named by its key; 1000ms, 3s and 50% are parsed."""
    agent = load_config(SEEDS / "002_connectors.yaml").agent("inventory_query")
    assert agent.protocol == "raw-http"
    assert agent.endpoints == ["https://127.0.0.1:8444/api"]
    assert (agent.timeouts.connect, agent.timeouts.ttfbt, agent.timeouts.response) == (1.0, 3.0, 5.0)
    retry = agent.retry
    assert (retry.max_attempts, retry.strategy, retry.base_wait, retry.max_wait) == (3, "full_jitter", 0.2, 3.0)
    assert agent.rate_limit is not None
    assert (agent.rate_limit.qps, agent.rate_limit.burst) == (80, 120)
    assert (agent.circuit_breaker.error_threshold, agent.circuit_breaker.open_wait) == (0.5, 30.0)
    assert agent.idempotency.key_from == "${params.biz_id}"


# --------------------------------------------------------------------------- translation of shapes


def test_catalogue_tool_fields_flow_into_agents_offering_it() -> None:
    """An agent offering a catalogue tool inherits its declaration; its own fields still win."""
    config = parse_config(
        """
        tools:
          - {name: create_wo, idempotency_key: "${params.wo_number}", retryable: false, danger_level: medium}
        agents:
          - {name: tickets, capabilities: [create_wo]}
          - name: legacy
            tools: [{name: create_wo, danger_level: high}]
        """
    )
    plain = config.agent("tickets").capability("create_wo")
    own = config.agent("legacy").capability("create_wo")
    assert plain is not None and own is not None
    assert (plain.idempotency_key, plain.retryable, plain.danger_level) == ("${params.wo_number}", False, "medium")
    assert (own.idempotency_key, own.danger_level) == ("${params.wo_number}", "high")


def test_numeric_version_is_kept_as_text() -> None:
    """`version: 2.1` parses as a YAML float; the config keeps it as the string the user wrote."""
    assert parse_config("agent: {name: a, version: 2.1}").agent("a").version == "2.1"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("timeout: {connect: 1s}\n    timeouts: {connect: 2s}", "give either 'timeout' or 'timeouts'"),
        ("endpoint: http://a\n    base_url: http://b", "give only one of endpoint, base_url"),
        ("weight: 3\n    routing: {weight: 4}", "give 'weight' either on the agent or in 'routing'"),
        ("name: b", "name 'b' differs from the connector key 'a'"),
    ],
)
def test_conflicting_spellings_are_refused(body: str, expected: str) -> None:
    """Two spellings of one setting in one agent are ambiguous, so they are an error."""
    assert expected in config_error(f"connectors:\n  a:\n    {body}\n")


# --------------------------------------------------------------------------- defaults


DEFAULTS = """
defaults:
  retry: {max_attempts: 3, base_wait: 500ms}
  timeouts: {connect: 2s}
  auth: {type: header, key: X-Api-Key}
  rate_limit: {max_wait: 250ms}
agents:
  - name: plain
    auth: {value_env: PLAIN_KEY}
    rate_limit: {qps: 5}
  - name: tuned
    retry: {max_attempts: 5}
    timeouts: {response: 7s}
    auth: {type: cert, client_cert: /c.pem}
    rate_limit: {qps: 9, max_wait: 1s}
"""


def test_agent_blocks_override_defaults_key_by_key() -> None:
    """retry: {max_attempts: 5} keeps the default base_wait; untouched agents take every default."""
    config = parse_config(DEFAULTS)
    plain, tuned = config.agent("plain"), config.agent("tuned")
    assert (plain.retry.max_attempts, plain.retry.base_wait) == (3, 0.5)
    assert (tuned.retry.max_attempts, tuned.retry.base_wait) == (5, 0.5)
    assert (tuned.timeouts.connect, tuned.timeouts.response) == (2.0, 7.0)
    assert plain.rate_limit is not None and tuned.rate_limit is not None
    assert (plain.rate_limit.qps, plain.rate_limit.max_wait) == (5, 0.25)
    assert (tuned.rate_limit.qps, tuned.rate_limit.max_wait) == (9, 1.0)
    assert config.defaults.retry is not None and config.defaults.retry.base_wait == 0.5


def test_partial_default_auth_is_completed_or_replaced_by_the_agent() -> None:
    """A default header auth takes the agent's value_env; an agent auth of another type replaces it whole."""
    config = parse_config(DEFAULTS)
    plain, tuned = config.agent("plain").auth, config.agent("tuned").auth
    assert (plain.type, plain.key, plain.value_env) == ("header", "X-Api-Key", "PLAIN_KEY")
    assert (tuned.type, tuned.key, tuned.client_cert) == ("cert", None, "/c.pem")


def test_defaults_refuse_unknown_and_agent_only_keys() -> None:
    """A misspelt default is reported with a suggestion; agent-only keys are not defaults."""
    message = config_error("defaults:\n  retry: {max_atempts: 3}\n  endpoint: http://x\nagents: []\n")
    assert "agents.yaml: defaults.retry.max_atempts: unknown key 'max_atempts'; did you mean 'max_attempts'?" in message
    assert "defaults.endpoint: unknown key 'endpoint'" in message


def test_parsed_mapping_and_defaults_model_are_accepted() -> None:
    """parse_config takes an already parsed mapping; an absent defaults block is an empty AgentDefaults."""
    config = parse_config({"agents": [{"name": "a", "endpoint": "http://127.0.0.1:1"}]})
    assert config.defaults == AgentDefaults()
    assert config.agent("a").endpoints == ["http://127.0.0.1:1"]


# --------------------------------------------------------------------------- strictness and messages


@pytest.mark.parametrize("name", ["chat", "tool-calling", "extract_clause"])
def test_lowercase_capability_names_load(name: str) -> None:
    """Identifiers with letters, digits, '-' and '_' are valid capability names."""
    assert parse_config(f"agents:\n  - {{name: a, capabilities: [{name}]}}\n").agent("a").capability(name)


def test_bad_capability_name_names_file_and_exact_path() -> None:
    """The message starts with the file and the path of the offending value."""
    message = config_error(
        "agents:\n  - {name: a}\n  - {name: b}\n  - {name: c, capabilities: [{name: Query Order}]}\n"
    )
    assert message.startswith(
        "agents.yaml: agents[2].capabilities[0].name: capability name 'Query Order' must be a lowercase identifier"
    )


def test_errors_use_the_keys_the_user_wrote() -> None:
    """Errors inside translated keys (timeout, tools) point at the user's spelling, with a suggestion."""
    message = config_error(
        "connectors:\n  inv:\n    timeout: {conect: 1s}\n    tools: [{name: x, timeout: {respons: 2s}}]\n"
    )
    assert "connectors.inv.timeout.conect: unknown key 'conect'; did you mean 'connect'?" in message
    assert "connectors.inv.tools[0].timeout.respons: unknown key 'respons'; did you mean 'response'?" in message


def test_every_problem_is_reported_at_once() -> None:
    """Two mistakes in two agents give two lines, not one at a time."""
    message = config_error("agents:\n  - {name: a, pool: {max_conns: 0}}\n  - {name: b, weight: -1}\n")
    lines = message.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("agents.yaml: agents[0].pool.max_conns: ")
    assert lines[1].startswith("agents.yaml: agents[1].weight: ")


def test_malformed_yaml_reports_the_line() -> None:
    """A YAML syntax error names the line where the parser gave up."""
    message = config_error("agents:\n  - name: a\n    pool: [1, 2\n  - name: b\n")
    assert re.match(r"agents\.yaml: line 4, column \d+: invalid YAML", message)


def test_a_key_given_twice_is_refused() -> None:
    """YAML would silently keep the second `retry:`; the loader refuses it and names both lines."""
    message = config_error("agents:\n  - name: a\n    retry: {max_attempts: 2}\n    retry: {max_attempts: 3}\n")
    assert "line 4" in message and "key 'retry' is given twice (first on line 3)" in message


@pytest.mark.parametrize("text", ["- a\n- b\n", "just text\n", ""])
def test_top_level_must_be_a_mapping(text: str) -> None:
    """A list, a scalar or an empty file is not a config."""
    assert "the top level must be a mapping with an 'agents:' list" in config_error(text)


def test_unknown_top_level_key_is_refused() -> None:
    """A misplaced top-level key lists the keys that are understood."""
    assert "agents.yaml: agent_list: unknown top-level key; expected agents, agent" in config_error("agent_list: []\n")


def test_duplicate_agent_names_are_refused_across_shapes() -> None:
    """An agent in `agents:` and a connector with the same name collide."""
    message = config_error("agents:\n  - {name: inv}\nconnectors:\n  inv: {base_url: http://x}\n")
    assert message == "agents.yaml: connectors.inv.name: agent name 'inv' is already used by agents[0]"


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    """A path that does not exist is reported with the path."""
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=re.escape(f"{missing}: cannot read the config file")):
        load_config(missing)


# --------------------------------------------------------------------------- secrets are references


@pytest.mark.parametrize("key", ["value", "token", "password", "secret", "api_key", "client_key_value"])
def test_literal_secret_in_auth_is_refused(key: str) -> None:
    """Any literal secret in an agent's auth says to use value_env instead."""
    message = config_error(f"agents:\n  - name: a\n    auth: {{type: bearer, value_env: A, {key}: s3cr3t}}\n")
    assert f"agents[0].auth.{key}: literal secrets are not allowed in config; use value_env" in message
    assert "s3cr3t" not in message


def test_literal_secret_in_tenant_credential_is_refused() -> None:
    """A tenant credential with a literal value is refused the same way."""
    message = config_error(
        "agents:\n  - {name: a, auth: {type: bearer, value_env: A}}\n"
        "tenants:\n  t: {agents: [a], credentials: {a: {token: s3cr3t}}}\n"
    )
    assert "tenants.t.credentials.a.token: literal secrets are not allowed in config; use value_env" in message


@pytest.mark.parametrize(
    "auth",
    ["{type: bearer, value_env: 'sk-live 123'}", "{type: cert, client_cert: /c, client_key: '-----BEGIN KEY-----'}"],
)
def test_a_secret_pasted_into_a_reference_field_is_refused(auth: str) -> None:
    """value_env must be a variable name, and a key field must be a path, not a PEM block."""
    message = config_error(f"agents:\n  - name: a\n    auth: {auth}\n")
    assert "must name an environment variable" in message or "holds a PEM block" in message
    assert "sk-live" not in message and "BEGIN KEY" not in message


# --------------------------------------------------------------------------- tenants


TENANTS = """
agents:
  - {name: orders, auth: {type: header, key: X-Api-Key, value_env: ORDERS_SHARED_KEY}}
  - {name: tickets}
  - {name: vault, auth: {type: cert, client_cert_env: VAULT_CERT, client_key_env: VAULT_KEY, ca_file: /ca.pem}}
tenants:
  demo:
    token_env: DEMO_TOKEN
    agents: [orders, tickets, vault]
    networks: [127.0.0.0/8, "10.1.0.0/16"]
    credentials:
      orders: {value_env: DEMO_ORDERS_KEY}
  other:
    agents: ["*", orders]
    credentials:
      orders: {value_env: OTHER_ORDERS_KEY}
  guest:
    agents: [tickets]
"""


def test_tenant_allow_lists_and_networks() -> None:
    """A named list allows its agents only; a list containing '*' allows all; networks match addresses."""
    config = parse_config(TENANTS)
    demo, other, guest = config.tenant("demo"), config.tenant("other"), config.tenant("guest")
    assert other.agents == "*" and other.allows("anything")
    assert guest.allows("tickets") and not guest.allows("orders")
    assert demo.allows_address("127.0.0.1") and demo.allows_address("10.1.2.3")
    assert not demo.allows_address("10.2.0.1") and not guest.allows_address("127.0.0.1")


@pytest.mark.parametrize(
    ("tenant", "expected"),
    [
        ("{agents: [order]}", "tenants.t.agents[0]: unknown agent 'order'; did you mean 'orders'?"),
        (
            "{agents: '*', credentials: {ticket: {value_env: X}}}",
            "tenants.t.credentials.ticket: credential for unknown",
        ),
        ("{agents: [orders], credentials: {tickets: {type: bearer, value_env: X}}}", "has a credential for 'tickets'"),
        ("{agents: '*', credentials: {tickets: {value_env: X}}}", "the agent uses no auth: give this credential a"),
        ("{agents: '*', credentials: {orders: {key: X-Other}}}", "a header credential needs 'value_env'"),
        ("{agents: '*', networks: [10.0.0.1/8]}", "'10.0.0.1/8' has host bits set; did you mean 10.0.0.0/8?"),
        ("{agents: '*', networks: [everywhere]}", "'everywhere' is not a CIDR network such as 10.0.0.0/8"),
        ("{token_env: T}", "tenants.t.agents: missing required key 'agents'"),
    ],
)
def test_tenant_mistakes_are_refused(tenant: str, expected: str) -> None:
    """Allow-lists and credentials must name real agents; networks must be CIDRs."""
    agents = "agents:\n  - {name: orders, auth: {type: header, key: K, value_env: V}}\n  - {name: tickets}\n"
    assert expected in config_error(f"{agents}tenants:\n  t: {tenant}\n")


def test_agent_allow_list_must_name_known_tenants() -> None:
    """With a tenant table present, an agent's `tenants:` naming a missing tenant is a typo."""
    message = config_error("agents:\n  - {name: a, tenants: [dmo]}\ntenants:\n  demo: {agents: '*'}\n")
    assert "agents[0].tenants[0]: unknown tenant 'dmo'; did you mean 'demo'?" in message


# --------------------------------------------------------------------------- credential resolution


def test_each_tenant_gets_its_own_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two tenants reaching one agent get their own secrets; a tenant without one gets the agent's."""
    monkeypatch.setenv("DEMO_ORDERS_KEY", "demo-secret")
    monkeypatch.setenv("OTHER_ORDERS_KEY", "other-secret")
    monkeypatch.setenv("ORDERS_SHARED_KEY", "shared-secret")
    config = parse_config(TENANTS)
    orders = config.agent("orders")
    demo = resolve_credential(orders, config.tenant("demo"))
    other = resolve_credential(orders, config.tenant("other"))
    assert (demo.type, demo.key, demo.value) == ("header", "X-Api-Key", "demo-secret")
    assert other.value == "other-secret"
    assert resolve_credential(orders, config.tenant("guest")).value == "shared-secret"
    assert resolve_credential(orders, None).value == "shared-secret"
    assert "secret" not in repr(demo)


def test_missing_secret_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unset or empty variable is a ConfigError naming it, never a fallback to another secret."""
    monkeypatch.setenv("ORDERS_SHARED_KEY", "shared-secret")
    monkeypatch.delenv("DEMO_ORDERS_KEY", raising=False)
    config = parse_config(TENANTS)
    with pytest.raises(ConfigError, match="environment variable DEMO_ORDERS_KEY is not set"):
        resolve_credential(config.agent("orders"), config.tenant("demo"))
    with pytest.raises(ConfigError, match="environment variable DEMO_ORDERS_KEY is empty"):
        resolve_credential(config.agent("orders"), config.tenant("demo"), {"DEMO_ORDERS_KEY": ""})


def test_cert_credential_reads_file_paths_from_the_environment() -> None:
    """A cert auth's *_env variables hold the certificate and key paths; ca_file is passed along."""
    config = parse_config(TENANTS)
    environ = {"VAULT_CERT": "/run/vault.crt", "VAULT_KEY": "/run/vault.key"}
    credential = resolve_credential(config.agent("vault"), config.tenant("demo"), environ)
    assert (credential.type, credential.cert_file, credential.key_file) == ("cert", "/run/vault.crt", "/run/vault.key")
    assert credential.ca_file == "/ca.pem"


def test_agent_without_auth_needs_no_credential() -> None:
    """An agent with no auth resolves to an empty credential without touching the environment."""
    config = parse_config(TENANTS)
    credential = resolve_credential(config.agent("tickets"), config.tenant("guest"), {})
    assert (credential.type, credential.value) == ("none", None)


# --------------------------------------------------------------------------- the example file


def test_example_loads_the_customer_service_scenario() -> None:
    """examples/agents.yaml holds the demo's agents on ports 18101..18106 and the demo tenant."""
    config = load_config(EXAMPLE)
    ports = sorted(int(url.rsplit(":", 1)[1].split("/")[0]) for agent in config.agents for url in agent.endpoints)
    assert ports == list(range(18101, 18107))
    cancel = config.agent("orders").capability("cancel_order")
    ticket = config.agent("tickets").capability("create_ticket")
    assert cancel is not None and cancel.danger_level == "high" and cancel.needs_approval
    assert ticket is not None and (ticket.idempotency_key, ticket.retryable) == ("${params.wo_number}", False)
    assert config.agent("knowledge").capability("search_knowledge") is not None
    assert config.agent("inventory").capability("check_inventory") is not None
    cloud = config.agent("cloud-chat-sales")
    assert (cloud.protocol, cloud.auth.type, cloud.auth.value_env) == (
        "openai-compatible",
        "header",
        "CLOUD_SALES_TOKEN",
    )
    demo = config.tenant("demo")
    assert (demo.token_env, demo.networks, demo.credentials["orders"].value_env) == (
        "DEMO_TOKEN",
        ["127.0.0.0/8"],
        "DEMO_ORDERS_KEY",
    )


def _annotations(annotation: Any) -> Iterator[Any]:
    yield annotation
    for arg in get_args(annotation):
        yield from _annotations(arg)


def _config_models(model: type[BaseModel], found: set[type[BaseModel]]) -> set[type[BaseModel]]:
    """``model`` and every record reachable from its fields, except run-time ``Instance`` records."""
    if model not in found and model is not Instance:
        found.add(model)
        for info in model.model_fields.values():
            for inner in _annotations(info.annotation):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    _config_models(inner, found)
    return found


def test_example_documents_every_config_field() -> None:
    """Every field of an agent, a capability, a policy block and a tenant is written or explained in the example."""
    text = EXAMPLE.read_text(encoding="utf-8")
    models = _config_models(AgentDescriptor, set()) | _config_models(TenantConfig, set())
    assert {Capability, RetryPolicy, CircuitBreakerConfig, CredentialRef} <= models
    missing = sorted({name for model in models for name in model.model_fields if not re.search(rf"\b{name}\b", text)})
    assert missing == []
    assert yaml.safe_load(text)["defaults"], "the example shows a defaults block"


# --------------------------------------------------------------------------- the config object


def test_lookups_name_the_closest_match() -> None:
    """agent() and tenant() raise ConfigError suggesting the nearest known name."""
    config = parse_config(TENANTS, source="t.yaml")
    with pytest.raises(ConfigError, match=r"t\.yaml: no agent named 'order'; did you mean 'orders'"):
        config.agent("order")
    with pytest.raises(ConfigError, match=r"no tenant named 'dem'; did you mean 'demo'"):
        config.tenant("dem")


def test_config_built_directly_is_still_checked() -> None:
    """Constructing ReachConfig by hand refuses duplicate names and dangling tenant references."""
    with pytest.raises(ValidationError, match="agent name 'a' is already used by agents"):
        ReachConfig(agents=[AgentDescriptor(name="a"), AgentDescriptor(name="a")])
    with pytest.raises(ValidationError, match="unknown agent 'b'"):
        ReachConfig(agents=[AgentDescriptor(name="a")], tenants={"t": TenantConfig(agents=["b"])})


# --------------------------------------------------------------------------- units through the config


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=10**7))
def test_millisecond_durations_round_trip(millis: int) -> None:
    """Any `<n>ms` written in YAML arrives as n / 1000 seconds."""
    agent = parse_config(f"agents:\n  - {{name: a, retry: {{base_wait: {millis}ms}}}}\n").agent("a")
    assert agent.retry.base_wait == pytest.approx(millis / 1000)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=100))
def test_percent_ratios_round_trip(percent: int) -> None:
    """Any `<p>%` written in YAML arrives as the fraction p / 100."""
    text = f"agents:\n  - {{name: a, circuit_breaker: {{error_threshold: '{percent}%'}}}}\n"
    assert parse_config(text).agent("a").circuit_breaker.error_threshold == pytest.approx(percent / 100)
