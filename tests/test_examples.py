"""Every example script runs offline and says what it promises; the Dify plugin folders are complete.

The scripts start together (each is a separate process with its own servers on
free ports), so the file takes as long as the slowest one.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = [
    "quickstart_client",
    "serve_agent",
    "langgraph_agent",
    "langgraph_retry",
    "llamaindex_agent",
    "dify_before_invoke",
    "via_gateway",
    "via_node",
    "mcp_and_a2a",
    "transactional_agent",
]
TIMEOUT = 90


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, subprocess.Popen[str]]]:
    """All scripts started at once, without network access to anything but 127.0.0.1 and no API key."""
    env = {key: value for key, value in os.environ.items() if not key.endswith("_API_KEY")}
    env.update({"NO_PROXY": "*", "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"})
    started = {
        name: subprocess.Popen(
            [sys.executable, str(EXAMPLES / f"{name}.py")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=EXAMPLES.parent,
        )
        for name in SCRIPTS
    }
    yield started
    for process in started.values():
        if process.poll() is None:
            process.kill()
            process.communicate()


def output_of(runs: dict[str, subprocess.Popen[str]], name: str) -> str:
    """The script's stdout once it exited 0 (its stderr in the failure message otherwise)."""
    out, err = runs[name].communicate(timeout=TIMEOUT)
    assert runs[name].returncode == 0, f"{name}.py exited {runs[name].returncode}:\n{err}"
    return out


def test_every_example_is_exercised() -> None:
    """Each script in examples/ is run by this file (a new example needs a test)."""
    assert sorted(path.stem for path in EXAMPLES.glob("*.py")) == sorted(SCRIPTS)


def test_quickstart_client(runs: dict[str, subprocess.Popen[str]]) -> None:
    """The client reaches by capability, keeps a conversation on one instance, does not retry business errors."""
    out = output_of(runs, "quickstart_client")
    assert "asked so far: ['A1001', 'A1002']" in out
    assert "affinity: conv-1 was served by 1 instance" in out
    assert "returned within 7 days" in out
    assert "query_order Z9 -> fail (business)" in out and "attempts for the refused call: 1" in out


def test_serve_agent(runs: dict[str, subprocess.Popen[str]]) -> None:
    """The served capability answers; the same work-order number gets the same ticket twice."""
    out = output_of(runs, "serve_agent")
    tickets = re.findall(r"call \d: \{'ticket': '(T-\d+)', 'wo_number': 'WO-88', 'conversation': 'conv-9'\}", out)
    assert len(tickets) == 2 and tickets[0] == tickets[1]
    assert "deregistered and stopped" in out


def test_langgraph_agent(runs: dict[str, subprocess.Popen[str]]) -> None:
    """Mapped tools and the proxy tool are reached; both order questions land on one orders instance."""
    out = output_of(runs, "langgraph_agent")
    order_instances = re.findall(r"via lookup_order_status -> query_order on (orders-\d)", out)
    assert len(order_instances) == 2 and len(set(order_instances)) == 1
    assert "via check_stock -> check_inventory on inventory-" in out
    assert "via search_knowledge -> search_knowledge on knowledge-" in out
    assert "Order A1002 is paid" in out and "(local fallback)" not in out


def test_langgraph_retry(runs: dict[str, subprocess.Popen[str]]) -> None:
    """LangChain's retry middleware retries the Retryable call until it passes, never a refusal nor a handler bug."""
    out = output_of(runs, "langgraph_retry").splitlines()
    assert out[1].startswith("  tool said (success): ") and out[2] == "  the agent ran it 3 time(s)"
    assert out[4].startswith("  tool said (error): ") and "there is no order A9" in out[4]
    assert out[5] == "  the agent ran it 1 time(s)"
    assert out[7].startswith("  tool said (error): ") and "KeyError" in out[7] and "error id" in out[7]
    assert out[8] == "  the agent ran it 1 time(s)"


def test_mcp_and_a2a(runs: dict[str, subprocess.Popen[str]]) -> None:
    """One enhancer reaches an MCP server's tool (found by tools/list) and an A2A agent, from one LangGraph agent."""
    out = output_of(runs, "mcp_and_a2a")
    assert "MCP tools as capabilities: ['check_inventory']" in out
    assert "via check_stock -> check_inventory on agent stock-tools" in out and "12 x blue kettle" in out
    assert "via search_knowledge -> search_knowledge on agent kb-a2a" in out and "within 7 days" in out
    assert "(local fallback)" not in out


def test_llamaindex_agent(runs: dict[str, subprocess.Popen[str]]) -> None:
    """The FunctionAgent sees its tool plus a proxy; one Context keeps the conversation on one instance."""
    out = output_of(runs, "llamaindex_agent")
    assert "tools the model sees: ['lookup_order', 'check_inventory']" in out
    answers = [json.loads(line.split("Here is what I found: ", 1)[1]) for line in out.splitlines() if "found:" in line]
    assert answers[1]["on_hand"] == 12
    assert answers[2]["asked_in_this_conversation"] == ["A1001", "A1002"]


def test_dify_before_invoke(runs: dict[str, subprocess.Popen[str]]) -> None:
    """The hook reaches mapped tools on one instance, lets Dify run the others, refuses a closed conversation."""
    out = output_of(runs, "dify_before_invoke").splitlines()
    reached = [re.match(r"reached \[(orders-\d)\]", line) for line in out[:2]]
    assert all(reached) and reached[0].group(1) == reached[1].group(1)  # type: ignore[union-attr]
    assert out[2] == "Dify ran its own 'current_time' tool"
    assert out[3].startswith("refused: ") and "was closed" in out[3]


def test_via_gateway(runs: dict[str, subprocess.Popen[str]]) -> None:
    """Calls go through the gateway; a wrong token is rejected."""
    out = output_of(runs, "via_gateway")
    assert out.count("via the gateway") == 2
    assert "wrong token -> Unauthenticated (unauthenticated)" in out


def test_via_node(runs: dict[str, subprocess.Popen[str]]) -> None:
    """Calls go through the node; a business error is not retried there either."""
    out = output_of(runs, "via_node")
    assert out.count("via the node") == 2
    assert "query_order Z9 -> fail (business) after 1 attempt" in out


# ----------------------------------------------------------------------------- the Dify plugin folders

PLUGINS = EXAMPLES / "dify_plugin"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("plugin", ["reach_agent", "reach_tools"])
def test_dify_plugin_folder_is_complete(plugin: str) -> None:
    """Manifest, provider, tool/strategy YAML, sources, icon, main.py and requirements are all there and consistent."""
    root = PLUGINS / plugin
    manifest = load(root / "manifest.yaml")
    assert manifest["type"] == "plugin" and re.fullmatch(r"[a-z0-9_-]{1,128}", manifest["name"])
    assert manifest["meta"]["runner"] == {"language": "python", "version": "3.12", "entrypoint": "main"}
    assert (root / "_assets" / manifest["icon"]).is_file() and (root / "main.py").is_file()
    requirements = (root / "requirements.txt").read_text()
    assert "dify_plugin" in requirements and "reach-plugins[dify]" in requirements
    kinds = {kind for kind, paths in manifest["plugins"].items() if paths}
    assert len(kinds) == 1, "Dify refuses a plugin that declares agent strategies together with tools"
    sources = []
    for provider_path in manifest["plugins"][kinds.pop()]:
        provider = load(root / provider_path)
        assert (root / "_assets" / provider["identity"]["icon"]).is_file()
        if "extra" in provider:
            sources.append(provider["extra"]["python"]["source"])
        for item in provider.get("tools", []) + provider.get("strategies", []):
            sources.append(load(root / item)["extra"]["python"]["source"])
    assert sources
    for source in sources:
        ast.parse((root / source).read_text(), filename=source)


def test_transactional_agent(runs: dict[str, subprocess.Popen[str]]) -> None:
    """A key committed with the handler's effect is answered by a fresh instance, never charged twice."""
    out = output_of(runs, "transactional_agent")
    assert "charges in the database: 1" in out
    first, again = re.findall(r"\{'charge': (\d+), 'order_id': 'A-7'", out)
    assert first == again
