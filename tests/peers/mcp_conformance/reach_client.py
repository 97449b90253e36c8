"""The MCP conformance harness's client, written against reach-plugins' public API (``protocol: mcp``).

    conformance client --command "python tests/peers/mcp_conformance/reach_client.py" --scenario initialize

The harness passes the server URL as the last argument and the scenario in
``MCP_CONFORMANCE_SCENARIO`` (``MCP_CONFORMANCE_CONTEXT`` carries a scenario's
credentials). Each scenario registers the server as an ``mcp`` agent (its
tools listed into the registry), reaches a tool by capability, then closes the
client (which ends the MCP session). ``auth/*`` scenarios configure OAuth in
``protocol_options.oauth``; the authorization step is headless (the harness's
authorization server redirects at once).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from reach_plugins import ReachClient
from reach_plugins.model import AgentDescriptor
from reach_plugins.protocols.mcp_stream import answering_elicitation
from reach_plugins.protocols.mcp_tools import capability_name, register_mcp_agent
from reach_plugins.registry.memory import MemoryRegistry
from transports.direct import DirectTransport

REDIRECT = "http://127.0.0.1:3000/callback"
CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "tools_call": ("add_numbers", {"a": 5, "b": 3}),
    "sse-retry": ("test_reconnection", {}),
    "elicitation-sep1034-client-defaults": ("test_client_elicitation_defaults", {}),
    "http-standard-headers": ("add_numbers", {"a": 5, "b": 3}),
}


def elicit_defaults(asked: Any) -> dict[str, Any]:
    """Accept an elicitation with the defaults its schema gives (SEP-1034)."""
    properties = (asked.get("requestedSchema") or {}).get("properties") or {}
    return {
        "action": "accept",
        "content": {key: field["default"] for key, field in properties.items() if "default" in field},
    }


def stub(schema: Any) -> dict[str, Any]:
    """Arguments filling a tool's required parameters with a value of their type."""
    kinds = {"string": "x", "integer": 0, "number": 0, "boolean": False, "object": {}, "array": [], "null": None}
    properties = (schema or {}).get("properties") or {}
    return {
        name: kinds.get((properties.get(name) or {}).get("type"), "x") for name in (schema or {}).get("required", [])
    }


def oauth_options(scenario: str) -> dict[str, Any]:
    """``protocol_options.oauth`` for an ``auth/*`` scenario (pre-registered credentials from the context)."""
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    options: dict[str, Any] = {"redirect_uri": REDIRECT, "client_name": "reach-conformance"}
    if scenario.startswith("auth/client-credentials"):
        options["grant"] = "client_credentials"
    if scenario in ("auth/enterprise-managed-authorization", "auth/wif-jwt-bearer"):
        options["grant"] = "jwt_bearer"
    if context.get("valid_jwt"):
        options["assertion"] = context["valid_jwt"]
    if scenario == "auth/basic-cimd":
        options["client_metadata_url"] = "https://conformance-test.local/client-metadata.json"
    keys = ("client_id", "client_secret", "private_key_pem", "signing_algorithm")
    for key in (*keys, "idp_token_endpoint", "idp_client_id", "idp_id_token"):
        if context.get(key):
            options[key] = context[key]
    return options


async def run(url: str, scenario: str) -> None:
    # the revision the harness runs the scenario at: 2026-07-28 asks for the stateless wire (server/discover first)
    options: dict[str, Any] = {"version": os.environ.get("MCP_CONFORMANCE_PROTOCOL_VERSION", "2025-11-25")}
    if scenario.startswith("auth/"):
        options["oauth"] = oauth_options(scenario)
    registry = MemoryRegistry()
    agent = AgentDescriptor(name="conformance", protocol="mcp", endpoints=[url], protocol_options=options)
    async with DirectTransport() as transport, ReachClient(registry=registry, transport=transport) as client:
        described = await register_mcp_agent(registry, agent, transport, timeout=20)
        if scenario == "initialize":
            return
        schemas = {capability.name: capability.params_schema for capability in described.capabilities}
        tool, arguments = CALLS.get(scenario, ("", {}))
        calls = [(capability_name(tool), arguments)] if tool else []
        if scenario == "json-schema-2020-12-preservation":
            calls = [("json_schema_echo", {"schema": schemas.get("json_schema_2020_12_tool")})]
        elif scenario == "http-invalid-tool-headers":
            calls = [(name, stub(schema)) for name, schema in schemas.items()]
        elif scenario == "http-custom-headers":
            context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
            # a null argument is left out: our client checks payloads against the tool's schema (null is no boolean)
            calls = [
                (capability_name(c["name"]), {k: v for k, v in (c.get("arguments") or {}).items() if v is not None})
                for c in context.get("toolCalls", [])
            ]
        elif scenario == "sep-2322-client-request-state":
            names = ("test_mrtr_echo_state", "test_mrtr_unrelated", "test_mrtr_no_state", "test_mrtr_no_result_type")
            calls = [(capability_name(name), {}) for name in names]
        elif not calls and described.capabilities:
            calls = [(described.capabilities[0].name, {})]
        for name, payload in calls:
            if name is not None:
                reply = await client.reach(name, payload, session_id="conformance", timeout_ms=20_000)
                print(scenario, name, reply.status, reply.error, file=sys.stderr)


if __name__ == "__main__":
    with answering_elicitation(elicit_defaults):
        asyncio.run(run(sys.argv[-1], os.environ.get("MCP_CONFORMANCE_SCENARIO", "")))
