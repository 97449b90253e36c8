"""`reach gateway` and `reach node` start like servers (issue 28, deliverable 3): a start-up line naming version,
address, registry, tenants and security; levelled UTC-timestamped lines (text or JSON) carrying the request id;
``--version``; ports out of range and tenants no caller could authenticate as refused at start.

Every test runs the real command in its own process on 127.0.0.1 and reads what it writes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest
from hop_support import TOKENS, demo_tenants, write_config
from servers import interrupt

from reach_plugins import ReachClient
from reach_plugins.errors import ConfigError
from transports.grpcnode import GrpcNodeTransport

CLI = "from reach_plugins.cli import main; main()"
STARTUP = 30.0
"""Seconds a server may take to log its start-up line (generous: the suite shares two cores)."""
REFUSAL = 20.0
"""Seconds a command refusing its arguments may take to exit."""
NO_AGENT = "http://127.0.0.1:9"
WITHOUT_KEY = {name: value for name, value in TOKENS.items() if name != "DEMO_KEY"}
"""Tenant tokens, but not demo's credential for agent orders: a call to it fails on the server's configuration,
which the server logs inside the request."""
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+ \[(\S+)\] ")
STARTED = re.compile(r"reach (\w+) started: version=(\S+) listen=(\S+) registry=(.+?) tenants=(\d+) security=(\S+)")


class Lines:
    """The lines a process writes to stderr, read by a thread as they come."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._process = process
        assert process.stderr is not None
        stream = process.stderr
        self._reader = threading.Thread(target=lambda: self.lines.extend(line.rstrip("\n") for line in stream))
        self._reader.start()

    def wait_for(self, found: Callable[[str], bool], what: str, timeout: float = STARTUP) -> str:
        """The first line ``found`` holds for, polled until ``timeout`` (fails with all lines so far)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for line in list(self.lines):
                if found(line):
                    return line
            if self._process.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no line {what}; the process wrote:\n" + "\n".join(self.lines))


@contextmanager
def _server(args: list[str], environ: dict[str, str]) -> Iterator[Lines]:
    process = subprocess.Popen(
        [sys.executable, "-c", CLI, *args], env={"PATH": "/usr/bin:/bin", **environ}, stderr=subprocess.PIPE, text=True
    )
    try:
        yield Lines(process)
    finally:
        interrupt(process)


def _refusal(args: list[str], environ: dict[str, str] = TOKENS) -> tuple[int, str]:
    """Exit code and output of a command expected to refuse its arguments at once (killed if it serves instead)."""
    process = subprocess.Popen(
        [sys.executable, "-c", CLI, *args],
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "400", **environ},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=REFUSAL)
    except subprocess.TimeoutExpired:
        interrupt(process)
        raise AssertionError(f"{args[0]} {' '.join(args[1:])} started serving instead of refusing") from None
    return process.returncode, output


def test_reach_version_prints_the_installed_version() -> None:
    code, output = _refusal(["--version"])
    assert (code, output.strip()) == (0, f"reach {version('reach-plugins')}")


def test_the_gateway_logs_its_start_up_and_json_lines_with_the_request_id(tmp_path: Path) -> None:
    """``--port 0 --log-format json``: the start-up line names the port it really listens on; every line is a JSON
    object with time, level, logger and request id; the line logged inside a request carries that request's id."""
    config = write_config(tmp_path / "agents.yaml", {"orders": [NO_AGENT]}, demo_tenants())
    with _server(["gateway", "--config", str(config), "--port", "0", "--log-format", "json"], WITHOUT_KEY) as lines:
        started = json.loads(lines.wait_for(lambda line: "reach gateway started" in line, "starting the gateway"))
        match = STARTED.search(started["message"])
        assert match is not None, started
        assert match.groups()[:2] == ("gateway", version("reach-plugins"))
        assert match.group(4, 5, 6) == ("config file", "2", "plaintext+tenant-tokens")
        listen = match.group(3)
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", listen) and not listen.endswith(":0"), listen
        headers = {"Authorization": f"Bearer {TOKENS['DEMO_TOKEN']}"}
        body = {"capability": "whoami", "payload": {}, "request_id": "req-startup-json"}
        answer = httpx.post(f"{listen}/v1/reach", json=body, headers=headers, timeout=10).json()
        assert answer["error"]["type"] == "config_error" and answer["request_id"] == "req-startup-json"
        failed = lines.wait_for(lambda line: "DEMO_KEY" in line, "naming the missing DEMO_KEY", timeout=10)
        records = [json.loads(line) for line in lines.lines]
    assert json.loads(failed)["request_id"] == "req-startup-json"
    assert json.loads(failed)["level"] == "error"
    for record in records:
        assert set(record) >= {"time", "level", "logger", "request_id", "message"}, record
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["time"]), record
    assert started["request_id"] == "-"


async def test_the_node_logs_its_start_up_and_text_lines_with_the_request_id(tmp_path: Path) -> None:
    """``reach node --port 0``: a text start-up line with the gRPC address it listens on; lines are ``TIME LEVEL
    LOGGER [REQUEST] message``, and the one logged inside a call names the call's request id."""
    config = write_config(tmp_path / "agents.yaml", {"orders": [NO_AGENT]}, demo_tenants())
    with _server(["node", "--config", str(config), "--port", "0"], WITHOUT_KEY) as lines:
        started = lines.wait_for(lambda line: "reach node started" in line, "starting the node")
        match = STARTED.search(started)
        assert match is not None, started
        assert match.group(1, 2) == ("node", version("reach-plugins"))
        assert match.group(4, 5, 6) == ("config file", "2", "plaintext+tenant-tokens")
        target = match.group(3).removeprefix("grpc://")
        assert re.fullmatch(r"127\.0\.0\.1:\d+", target) and not target.endswith(":0"), target
        transport = GrpcNodeTransport(target, token=TOKENS["DEMO_TOKEN"])
        async with ReachClient(str(config), transport, tenant="demo", environ=TOKENS) as client:
            request = client.request("whoami", {})
            with pytest.raises(ConfigError, match="the node's configuration cannot serve this request"):
                await client.send(request)
        failed = lines.wait_for(lambda line: "configuration cannot serve" in line, "of the failed call", timeout=10)
    for line in [started, failed]:
        assert TEXT_LINE.match(line), line
    assert TEXT_LINE.match(started).group(2) == "-"  # type: ignore[union-attr]
    assert TEXT_LINE.match(failed).group(1, 2) == ("ERROR", request.request_id)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("command", "option", "value"),
    [
        ("gateway", "--port", "99999"),
        ("gateway", "--metrics-port", "70000"),
        ("node", "--port", "65536"),
        ("node", "--metrics-port", "-1"),
        ("issuer", "--port", "99999"),
    ],
)
def test_a_port_out_of_range_is_refused_naming_the_option(
    tmp_path: Path, command: str, option: str, value: str
) -> None:
    """Before: ``--port 99999`` listened on 34463 (99999 modulo 65536). Now the command ends naming the option."""
    config = write_config(tmp_path / "agents.yaml", {"orders": [NO_AGENT]}, demo_tenants())
    code, output = _refusal([command, "--config", str(config), option, value])
    assert code == 2, output
    assert f"{option} {value}: a port is a number from 1 to 65535" in output, output


@pytest.mark.parametrize("command", [["gateway"], ["gateway", "--workers", "2"], ["node"], ["issuer"]])
def test_a_tenant_without_token_env_is_refused_at_start(tmp_path: Path, command: list[str], redis_url: str) -> None:
    """Before: a tenant without ``token_env`` started fine and then answered 401 to everyone."""
    tenants = demo_tenants()
    del tenants["acme"]["token_env"]
    config = write_config(tmp_path / "agents.yaml", {"orders": [NO_AGENT]}, tenants)
    store = ["--dedup-store", f"{redis_url}?prefix=startup-tenants:"] if "--workers" in command else []
    code, output = _refusal([*command, "--config", str(config), "--port", "0", *store])
    assert code == 2, output
    assert "tenant 'acme' has no token_env" in output and "token_env: VARIABLE" in output, output


@pytest.mark.parametrize("command", ["gateway", "node"])
def test_a_tenant_whose_token_variable_is_empty_is_refused_at_start(tmp_path: Path, command: str) -> None:
    config = write_config(tmp_path / "agents.yaml", {"orders": [NO_AGENT]}, demo_tenants())
    code, output = _refusal([command, "--config", str(config), "--port", "0"], {**TOKENS, "ACME_TOKEN": ""})
    assert code == 2, output
    assert "environment variable ACME_TOKEN is not set or empty" in output, output


def test_an_unknown_log_format_is_refused_naming_the_choices(tmp_path: Path) -> None:
    config = write_config(tmp_path / "agents.yaml", {"orders": [NO_AGENT]}, demo_tenants())
    code, output = _refusal(["gateway", "--config", str(config), "--port", "0", "--log-format", "xml"])
    assert code == 2, output
    assert "--log-format 'xml': choose one of text, json" in output, output
