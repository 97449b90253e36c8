"""The `reach agents` command: list a registry, and upsert a YAML file's agents into any registry."""

from __future__ import annotations

import uuid
from pathlib import Path

from typer.testing import CliRunner

from reach_plugins.cli import app

EXAMPLE = Path(__file__).parent.parent / "examples" / "agents.yaml"
runner = CliRunner()


def test_agents_lists_a_file_registry() -> None:
    """`reach agents --registry file://...` shows every agent, its instances and health."""
    result = runner.invoke(app, ["agents", "--registry", f"file://{EXAMPLE}"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in ("front-desk", "orders", "tickets", "knowledge", "inventory", "cloud-chat-sales"):
        assert name in result.output
    assert "http://127.0.0.1:18102" in result.output and "alive" in result.output


def test_agents_load_upserts_into_etcd(etcd_url: str) -> None:
    """`--load` writes a YAML file's agents into etcd; a second, plain listing in a new process sees them."""
    url = f"{etcd_url}/reach-cli-{uuid.uuid4().hex[:8]}/"
    loaded = runner.invoke(app, ["agents", "--registry", url, "--load", str(EXAMPLE)], env={"COLUMNS": "200"})
    assert loaded.exit_code == 0, loaded.output
    assert "loaded" in loaded.output
    listed = runner.invoke(app, ["agents", "--registry", url], env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    assert "orders" in listed.output and "query_order" in listed.output


def test_agents_with_a_bad_url_says_what_is_supported() -> None:
    """An unknown registry scheme exits 2 with a message listing the supported forms."""
    result = runner.invoke(app, ["agents", "--registry", "zookeeper://x:1"], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "memory://" in result.output and "etcd://" in result.output
