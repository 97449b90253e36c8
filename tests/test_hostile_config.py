"""Hostile config files: aliases that expand, literal secrets in protocol_options, an open gateway by omission."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from reach_plugins.cli import app
from reach_plugins.config.loader import load_config
from reach_plugins.errors import ConfigError
from reach_plugins.gateway import create_app


def laughs(levels: int) -> str:
    """The billion-laughs document: each level is nine aliases of the one before."""
    lines = ['a0: &a0 "lol"']
    for level in range(1, levels + 1):
        refs = ", ".join(f"*a{level - 1}" for _ in range(9))
        lines.append(f"a{level}: &a{level} [{refs}]")
    agent = f"agents:\n  - name: x\n    endpoint: http://127.0.0.1:9\n    description: *a{levels}\n"
    return "\n".join(lines) + "\n" + agent


@pytest.mark.parametrize("levels", [7, 9])
def test_nested_aliases_are_refused_before_they_expand(tmp_path: Path, levels: int) -> None:
    """A sub-kilobyte billion-laughs file is a ConfigError about aliases, within a second, not a 4 GB expansion."""
    path = tmp_path / "laughs.yaml"
    path.write_text(laughs(levels))
    assert path.stat().st_size < 1024
    started = time.monotonic()
    with pytest.raises(ConfigError, match="aliases expand to more than"):
        load_config(path)
    assert time.monotonic() - started < 1.0


def test_a_self_referencing_alias_is_refused(tmp_path: Path) -> None:
    """An anchor whose value contains its own alias (a cycle) is refused, never walked forever."""
    path = tmp_path / "loop.yaml"
    path.write_text("loop: &l [1, *l]\nagents: []\n")
    with pytest.raises(ConfigError, match="refers to itself"):
        load_config(path)


def test_modest_aliases_still_load(tmp_path: Path) -> None:
    """Ordinary reuse (one anchored block merged into two agents) loads as before."""
    path = tmp_path / "ok.yaml"
    path.write_text(
        "agents:\n"
        "  - &first {name: a, endpoint: 'http://127.0.0.1:9', capabilities: [c], routing: {weight: 3}}\n"
        "  - {<<: *first, name: b, endpoint: 'http://127.0.0.1:10'}\n"
    )
    assert [agent.routing.weight for agent in load_config(path).agents] == [3, 3]


def write(tmp_path: Path, options: dict[str, Any], **extra: Any) -> Path:
    agent = {"name": "chat", "endpoint": "http://127.0.0.1:9", "protocol": "openai-compatible", "capabilities": ["c"]}
    path = tmp_path / "agents.yaml"
    path.write_text(yaml.safe_dump({"agents": [{**agent, "protocol_options": options}], **extra}))
    return path


@pytest.mark.parametrize(
    ("options", "where"),
    [
        ({"headers": {"Authorization": "Bearer sk-live-123"}}, "protocol_options.headers.Authorization"),
        ({"api_key": "sk-live-123"}, "protocol_options.api_key"),
        ({"extra": {"client_secret": "s3cr3t"}}, "protocol_options.extra.client_secret"),
        ({"url": "https://svc:hunter2@127.0.0.1/a2a"}, "protocol_options.url"),
        ({"headers": {"X-Custom": "Basic dXNlcjpwYXNz"}}, "protocol_options.headers.X-Custom"),
        ({"certs": ["-----BEGIN PRIVATE KEY-----\nMIIE"]}, "protocol_options.certs[0]"),
    ],
)
def test_literal_secrets_in_protocol_options_are_refused(tmp_path: Path, options: dict[str, Any], where: str) -> None:
    """A credential written into protocol_options (by key or by shape) is a ConfigError naming where it is."""
    with pytest.raises(ConfigError, match="literal secrets are not allowed") as refused:
        load_config(write(tmp_path, options))
    assert where in str(refused.value)
    assert "sk-live-123" not in str(refused.value) and "hunter2" not in str(refused.value)


def test_ordinary_protocol_options_load(tmp_path: Path) -> None:
    """model, max_tokens, paths and token counts are not secrets."""
    options = {"model": "gpt-x", "max_tokens": 512, "path": "/v1/chat/completions", "token_limit": "4096"}
    assert load_config(write(tmp_path, options)).agents[0].protocol_options == options


def test_a_gateway_without_tenants_refuses_to_start(tmp_path: Path) -> None:
    """No tenants: create_app refuses, saying how to add them or to pass --allow-open; with allow_open it starts."""
    path = write(tmp_path, {})
    with pytest.raises(ConfigError, match="--allow-open"):
        create_app(path)
    assert create_app(path, allow_open=True) is not None


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10,
)
agent_fields = st.fixed_dictionaries(
    {"name": st.text(max_size=10) | yaml_values},
    optional={
        key: yaml_values
        for key in ("endpoint", "endpoints", "protocol", "capabilities", "auth", "protocol_options", "retry", "routing")
    },
)
documents = st.fixed_dictionaries(
    {},
    optional={
        "agents": st.lists(agent_fields, max_size=3) | yaml_values,
        "tenants": st.dictionaries(st.text(max_size=8), yaml_values, max_size=2) | yaml_values,
        "defaults": yaml_values,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=documents)
def test_any_config_loads_or_names_its_problem(tmp_path: Path, doc: dict[str, Any]) -> None:
    """Generated config documents load, or fail with a ConfigError that says where; nothing else escapes."""
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        load_config(path)
    except ConfigError as exc:
        assert str(exc)


def test_reach_gateway_without_tenants_exits_saying_allow_open(tmp_path: Path) -> None:
    """`reach gateway --config F` on a config without tenants exits 2 and names --allow-open; nothing listens."""
    result = CliRunner().invoke(app, ["gateway", "--config", str(write(tmp_path, {})), "--port", "9"])
    assert result.exit_code == 2
    assert "--allow-open" in result.output
