"""The real dify-plugin SDK (0.10.2): the stand-in of ``tests/dify_fake.py`` matches it, the example plugins run on it.

The SDK runs in a Python 3.12 venv of its own, ``.venv-dify`` (its pins
conflict with ours, and importing it patches the process with gevent), built
by ``scripts/setup.sh`` with reach-plugins installed from a wheel (``python
-m build``), as the plugin README tells users to. ``REACH_DIFY_PYTHON`` names
another interpreter. Without one the tests skip, or fail under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import json
import os
import subprocess
import time
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import dify_fake
import pytest
from dify_packager import packager
from packaging.requirements import Requirement
from packaging.version import Version
from pydantic import BaseModel

import reach_plugins

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "examples" / "dify_plugin"
ORDER_ID = {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}
NESTED = [
    "ToolInvokeMessage.TextMessage",
    "ToolInvokeMessage.JsonMessage",
    "ToolInvokeMessage.LogMessage",
    "ToolInvokeMessage.LogMessage.LogStatus",
    "AssistantPromptMessage.ToolCall",
]
"""Classes the fake mirrors that the real SDK nests in another class (module of their outer class)."""


def dify_python() -> str:
    """The interpreter with the real SDK; skip (fail under CI=true) when there is none."""
    python = os.environ.get("REACH_DIFY_PYTHON") or str(ROOT / ".venv-dify" / "bin" / "python")
    if not Path(python).exists():
        message = f"no dify-plugin venv at {python}: run scripts/setup.sh (or set REACH_DIFY_PYTHON)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return python


def run_real(script: str, *args: str) -> Any:
    """Run ``script`` under the real SDK's interpreter, away from this tree; its last stdout line is JSON."""
    environ = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    command = [dify_python(), "-c", script, *args]
    out = subprocess.run(command, capture_output=True, text=True, env=environ, cwd=ROOT.parent, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def packaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both plugins built into packages (reach-plugins' wheel shipped in wheels/), unzipped as Dify would."""
    wheels = sorted((Path(dify_python()).parent.parent / "dist").glob("reach_plugins-*.whl"))
    root = tmp_path_factory.mktemp("packages")
    for name in ("reach_tools", "reach_agent"):
        package = packager.build(PLUGINS / name, root / "dist", wheels=wheels[-1:])
        with zipfile.ZipFile(package) as archive:
            archive.extractall(root / name)
    return root


# ----------------------------------------------------------------------------- the fake against the real models

SHAPE = """
import dify_plugin  # first: it patches the process with gevent
import enum, importlib, json, os, sys

def shape(obj):
    if isinstance(obj, type) and issubclass(obj, enum.Enum):
        return {"enum": sorted(str(member.value) for member in obj)}
    if isinstance(obj, type) and hasattr(obj, "model_fields"):
        fields = obj.model_fields
        return {"fields": sorted(fields), "required": sorted(n for n, f in fields.items() if f.is_required())}
    return {"methods": sorted(n for n in dir(obj) if not n.startswith("__") and callable(getattr(obj, n, None)))}

found = {}
for module, path in json.loads(sys.argv[1]):
    obj = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part, None)
    found[f"{module}:{path}"] = None if obj is None else shape(obj)
print(json.dumps(found), flush=True)
os._exit(0)
"""


def shape(obj: Any) -> dict[str, list[str]]:
    """The same description of a fake class as SHAPE gives of the real one (methods: only those the fake defines)."""
    if isinstance(obj, type) and issubclass(obj, enum.Enum):
        return {"enum": sorted(str(member.value) for member in obj)}
    if isinstance(obj, type) and issubclass(obj, BaseModel):
        fields = obj.model_fields
        return {"fields": sorted(fields), "required": sorted(n for n, f in fields.items() if f.is_required())}
    own = {name for cls in obj.__mro__[:-1] for name in vars(cls) if not name.startswith("__")}
    return {"methods": sorted(name for name in own if callable(getattr(obj, name)))}


def mirrored() -> dict[str, Any]:
    """Every class the fake stands in for, by ``module:dotted.path`` of the real SDK."""
    classes = {f"{module}:{name}": cls for module, names in dify_fake.MODULES.items() for name, cls in names.items()}
    for path in NESTED:
        outer, *inner = path.split(".")
        module = next(key.split(":")[0] for key in classes if key.endswith(f":{outer}"))
        found = classes[f"{module}:{outer}"]
        for part in inner:
            found = getattr(found, part)
        classes[f"{module}:{path}"] = found
    return classes


def divergences(fake: dict[str, Any], real: dict[str, Any]) -> list[str]:
    """Where the fake would accept or offer what the real SDK does not (empty when they agree)."""
    found = []
    for name, mine in fake.items():
        theirs = real.get(name)
        if theirs is None:
            found.append(f"{name}: not in the real SDK")
        elif "required" in mine and (mine["required"] != theirs.get("required")):
            found.append(f"{name}: required {mine['required']}, the real SDK requires {theirs.get('required')}")
        elif "fields" in mine and not set(mine["fields"]) <= set(theirs.get("fields", ())):
            found.append(f"{name}: fields {sorted(set(mine['fields']) - set(theirs['fields']))} are not real")
        elif "enum" in mine and not set(mine["enum"]) <= set(theirs.get("enum", ())):
            found.append(f"{name}: values {sorted(set(mine['enum']) - set(theirs['enum']))} are not real")
        elif "methods" in mine and not set(mine["methods"]) <= set(theirs.get("methods", ())):
            found.append(f"{name}: methods {sorted(set(mine['methods']) - set(theirs['methods']))} are not real")
    return found


def test_the_fake_sdk_has_the_real_sdks_shapes() -> None:
    """Each stand-in class exists in dify-plugin 0.10.2 with the same required fields, no invented fields or methods."""
    classes = mirrored()
    wanted = json.dumps([name.split(":") for name in classes])
    real = run_real(SHAPE, wanted)
    fake = {name: shape(value) for name, value in classes.items() if not isinstance(value, dict)}
    problems = divergences(fake, real)
    assert not problems, "\n".join(problems)


def test_the_comparison_catches_a_lenient_fake() -> None:
    """A fake with a default where the real SDK requires a value, or an invented field, is reported."""
    real = {"m:ToolDescription": {"fields": ["human", "llm"], "required": ["human", "llm"]}}
    lenient = {"m:ToolDescription": {"fields": ["human", "llm"], "required": ["llm"]}}
    invented = {"m:ToolDescription": {"fields": ["human", "llm", "extra"], "required": ["human", "llm"]}}
    assert divergences(lenient, real) and divergences(invented, real)
    assert divergences({"m:Missing": {"methods": []}}, real) == ["m:Missing: not in the real SDK"]


# ----------------------------------------------------------------------------- the example plugins on the real SDK

REAL_SDK = """
import dify_plugin  # first: it patches the process with gevent
import json, os, sys, types
import reach_plugins
from dify_plugin.config.config import DifyPluginEnv
from dify_plugin.core.plugin_registration import PluginRegistration
from dify_plugin.entities.agent import AgentRuntime
from dify_plugin.entities.model.llm import LLMResult, LLMUsage
from dify_plugin.entities.model.message import AssistantPromptMessage
from dify_plugin.entities.tool import ToolRuntime

plugins, registry = sys.argv[1], sys.argv[2]
os.chdir(f"{plugins}/reach_tools")
sys.path.insert(0, os.getcwd())
tools = PluginRegistration(DifyPluginEnv()).tools_mapping["reach"][2]
query_order = tools["query_order"][1]
session = types.SimpleNamespace(conversation_id="conv-real", app_id="app")
tool_runtime = ToolRuntime(credentials={"registry": registry}, user_id="u", session_id=None)
tool = query_order(runtime=tool_runtime, session=session)
answer = [m.message.json_object for m in tool.invoke({"order_id": "A1"})]

os.chdir(f"{plugins}/reach_agent")
sys.path.insert(0, os.getcwd())
strategies = PluginRegistration(DifyPluginEnv()).agent_strategies_mapping["reach_agent"][1]
strategy_class = strategies["reach_function_calling"][1]
call = {"id": "c1", "type": "function", "function": {"name": "query_order", "arguments": '{"order_id": "A2"}'}}
replies = iter([AssistantPromptMessage(content="", tool_calls=[call]), AssistantPromptMessage(content="done")])
seen_tools = []
def invoke(model_config, prompt_messages, tools=None, stop=None, stream=True):
    seen_tools.append([type(tool).__name__ + ":" + tool.name for tool in tools or []])
    return LLMResult(model="m", message=next(replies), usage=LLMUsage.empty_usage())
agent_session = types.SimpleNamespace(conversation_id="conv-real", app_id="app", tool=None,
                                      model=types.SimpleNamespace(llm=types.SimpleNamespace(invoke=invoke)))
strategy = strategy_class(runtime=AgentRuntime(user_id="u"), session=agent_session)
tool_entity = {"identity": {"name": "query_order", "author": "a", "label": {"en_US": "q"}, "provider": "reach"},
               "description": {"human": {"en_US": "q"}, "llm": "Look up an order"}, "provider_type": "builtin"}
model = {"provider": "p", "model": "m", "mode": "chat", "completion_params": {}, "history_prompt_messages": []}
parameters = {"query": "where is A2", "instruction": "", "tools": [tool_entity], "maximum_iterations": 3,
              "reach_registry": registry, "model": model}
final = [m.message.text for m in strategy.invoke(parameters) if m.type.value == "text"]
report = {"tool": answer, "final": final, "class": strategy_class.__name__, "seen_tools": seen_tools,
          "reach_plugins": os.path.dirname(reach_plugins.__file__)}
print(json.dumps(report), flush=True)
os._exit(0)
"""


def test_example_plugins_load_and_reach_with_the_real_sdk(tmp_path: Path, packaged: Path) -> None:
    """The real SDK loads both plugins from their built packages; tool and strategy reach a real agent."""
    from reach_plugins.agent import BackgroundServer, ReachAgent

    agent = ReachAgent("orders")
    seen: list[str | None] = []

    @agent.capability("query_order", description="Look up an order", params_schema=ORDER_ID)
    def query_order(order_id: str, ctx: Any) -> dict[str, str]:
        seen.append(ctx.session_id)
        return {"order_id": order_id, "status": "shipped"}

    with BackgroundServer(agent.app) as server:
        agents = tmp_path / "agents.yaml"
        agents.write_text(f"agents:\n  - name: orders\n    endpoint: {server.url}\n    capabilities: [query_order]\n")
        report = run_real(REAL_SDK, str(packaged), f"file://{agents}")
    assert report["tool"] == [{"order_id": "A1", "status": "shipped"}]
    assert report["final"] == ["done"] and report["class"] == "ReachAgentStrategy"
    assert report["seen_tools"] == [["PromptMessageTool:query_order"], ["PromptMessageTool:query_order"]]
    assert seen == ["conv-real", "conv-real"]
    assert "site-packages" in report["reach_plugins"], "reach_plugins must come from the installed wheel"


INSTALLED = """
import hashlib, json, os, pathlib, sys
import importlib.util
base = pathlib.Path(importlib.util.find_spec("reach_plugins").origin).parent
print(json.dumps({str(p.relative_to(base)): hashlib.sha256(p.read_bytes()).hexdigest()
                  for p in sorted(base.rglob("*.py"))}))
"""


def test_the_installed_wheel_is_this_tree() -> None:
    """The wheel in the dify venv was built from this tree (else run scripts/setup.sh, which rebuilds it)."""
    base = Path(reach_plugins.__file__).parent
    here = {str(p.relative_to(base)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(base.rglob("*.py"))}
    installed = run_real(INSTALLED)
    stale = sorted(name for name in set(here) | set(installed) if here.get(name) != installed.get(name))
    assert not stale, f"the wheel in the dify venv is older than the tree ({stale[:5]}): run scripts/setup.sh"


VERSION = """
import importlib.metadata, json
print(json.dumps(importlib.metadata.version("dify-plugin")))
"""


def test_the_dify_venv_runs_an_sdk_the_plugins_accept() -> None:
    """The dify venv's SDK is in each plugin's dify_plugin range, which starts at 0.9 (the Marketplace's)."""
    installed = Version(run_real(VERSION))
    for plugin in ("reach_agent", "reach_tools"):
        wanted = [Requirement(line) for line in (PLUGINS / plugin / "requirements.txt").read_text().splitlines()]
        [sdk] = [requirement for requirement in wanted if requirement.name.replace("_", "-") == "dify-plugin"]
        assert installed in sdk.specifier, f"{plugin} asks for {sdk}, the dify venv has {installed}"
        assert Version("0.8.99") not in sdk.specifier and Version("0.9.0") in sdk.specifier, sdk


# ----------------------------------------------------------------------------- Ask an agent, shaped by the schema

ASK = """
import dify_plugin  # first: it patches the process with gevent
import json, os, sys, types
from dify_plugin.config.config import DifyPluginEnv
from dify_plugin.core.plugin_registration import PluginRegistration
from dify_plugin.entities.tool import ToolRuntime

plugin, registry, calls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
os.chdir(plugin)
sys.path.insert(0, os.getcwd())
ask_agent = PluginRegistration(DifyPluginEnv()).tools_mapping["reach"][2]["ask_agent"][1]
runtime = ToolRuntime(credentials={"registry": registry}, user_id="u", session_id=None)
tool = ask_agent(runtime=runtime, session=types.SimpleNamespace(conversation_id="conv-ask", app_id="app"))
report = []
for parameters in calls:
    try:
        report.append({"messages": [m.message.model_dump(mode="json") for m in tool.invoke(parameters)]})
    except Exception as exc:
        report.append({"error": type(exc).__name__, "message": str(exc)})
print(json.dumps(report), flush=True)
os._exit(0)
"""
TICKET = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "reason": {"type": "string"}},
    "required": ["order_id", "reason"],
}


def registry_file(tmp_path: Path, agent: Any, url: str) -> str:
    """A YAML registry listing ``agent`` at ``url`` with its capabilities' schemas (what an agent registers)."""
    descriptor = agent.descriptor(url).model_dump(mode="json", exclude_none=True)
    agents = tmp_path / "agents.yaml"
    agents.write_text(json.dumps({"agents": [descriptor]}))
    return f"file://{agents}"


def test_ask_an_agent_fills_the_one_text_field_each_capability_asks_for(tmp_path: Path, packaged: Path) -> None:
    """A served LangGraph agent gets {message}, query_order gets {order_id}; two fields need arguments, else named."""
    from langchain_core.messages import AIMessage
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph

    from reach_plugins.agent import BackgroundServer, ReachAgent, add_langgraph

    def reply(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"triaged: {state['messages'][-1].content}")]}

    graph = StateGraph(MessagesState)
    graph.add_node("reply", reply)
    graph.add_edge(START, "reply")
    agent = ReachAgent("desk", tokens="open")
    add_langgraph(agent, graph.compile(checkpointer=InMemorySaver()), capabilities=["triage_ticket"])
    orders: list[dict[str, str]] = []

    @agent.capability("query_order", description="Look up an order", params_schema=ORDER_ID)
    def query_order(order_id: str) -> dict[str, str]:
        orders.append({"order_id": order_id})
        return {"order_id": order_id, "status": "shipped"}

    @agent.capability("open_ticket", description="Open a ticket", params_schema=TICKET)
    def open_ticket(order_id: str, reason: str) -> dict[str, str]:
        orders.append({"order_id": order_id, "reason": reason})
        return {"ticket": f"T-{order_id}"}

    calls = [
        {"reach_capability": "triage_ticket", "query": "my parcel is late", "arguments": ""},
        {"reach_capability": "query_order", "query": "A7"},
        {"reach_capability": "open_ticket", "query": "A7 arrived broken"},
        {"reach_capability": "open_ticket", "arguments": '{"order_id": "A7", "reason": "broken"}'},
        {"reach_capability": "open_ticket", "arguments": '["A7"]'},
    ]
    with BackgroundServer(agent.app) as server:
        registry = registry_file(tmp_path, agent, server.url)
        report = run_real(ASK, str(packaged / "reach_tools"), registry, json.dumps(calls))
    triage, order, vague, ticket, not_an_object = report
    assert triage["messages"][0]["json_object"]["reply_content"] == "triaged: my parcel is late"
    assert order["messages"] == [{"json_object": {"order_id": "A7", "status": "shipped"}}]
    assert vague["error"] == "InvalidPayload" and "'order_id', 'reason'" in vague["message"]
    assert '"arguments"' in vague["message"] or "'arguments'" in vague["message"]
    assert ticket["messages"] == [{"json_object": {"ticket": "T-A7"}}]
    assert not_an_object["error"] == "InvalidPayload" and "must be a JSON object" in not_an_object["message"]
    assert orders == [{"order_id": "A7"}, {"order_id": "A7", "reason": "broken"}], "refused payloads send nothing"


# ----------------------------------------------------------------------------- the strategy streams and logs

STREAM = """
import dify_plugin  # first: it patches the process with gevent
import json, os, pathlib, sys, time, types
from dify_plugin.config.config import DifyPluginEnv
from dify_plugin.core.plugin_registration import PluginRegistration
from dify_plugin.entities.agent import AgentRuntime
from dify_plugin.entities.model.llm import LLMResult, LLMResultChunk, LLMResultChunkDelta, LLMUsage
from dify_plugin.entities.model.message import AssistantPromptMessage

plugin, registry, gate = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
os.chdir(plugin)
sys.path.insert(0, os.getcwd())
strategies = PluginRegistration(DifyPluginEnv()).agent_strategies_mapping["reach_agent"][1]
strategy_class = strategies["reach_function_calling"][1]
def call(n, name, args):
    return {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
def chunked(*messages):  # a model that streams: one chunk per message
    for index, message in enumerate(messages):
        yield LLMResultChunk(model="m", delta=LLMResultChunkDelta(index=index, message=message))
half = call(2, "query_order", {"order_id": "X"})
rest = {"id": "", "type": "function", "function": {"name": "", "arguments": half["function"]["arguments"][9:]}}
half["function"]["arguments"] = half["function"]["arguments"][:9]
replies = iter([
    LLMResult(model="m", message=AssistantPromptMessage(content="", tool_calls=[
        call(1, "draft_reply", {"topic": "late parcel"})]), usage=LLMUsage.empty_usage()),
    chunked(*(AssistantPromptMessage(content="", tool_calls=[piece]) for piece in (half, rest))),
    chunked(AssistantPromptMessage(content="do"), AssistantPromptMessage(content="ne")),
])
prompts = []
def invoke(model_config, prompt_messages, tools=None, stop=None, stream=True):
    prompts.append([m.model_dump(mode="json") for m in prompt_messages])
    return next(replies)
session = types.SimpleNamespace(conversation_id="conv-stream", app_id="app", tool=None,
                                model=types.SimpleNamespace(llm=types.SimpleNamespace(invoke=invoke)))
strategy = strategy_class(runtime=AgentRuntime(user_id="u"), session=session)
def entity(name):
    return {"identity": {"name": name, "author": "a", "label": {"en_US": name}, "provider": "reach"},
            "description": {"human": {"en_US": name}, "llm": name}, "provider_type": "builtin"}
model = {"provider": "p", "model": "m", "mode": "chat", "completion_params": {}, "history_prompt_messages": []}
tools = [entity("draft_reply"), entity("query_order")]
parameters = {"query": "answer the customer", "instruction": "", "tools": tools, "maximum_iterations": 4,
              "reach_registry": registry, "model": model}
messages = []
for message in strategy.invoke(parameters):
    body = message.message.model_dump(mode="json")
    messages.append({"type": message.type.value, **body})
    if body.get("label") == "reach draft_reply" and body.get("data", {}).get("items") == 1:
        gate.touch()  # the agent sends its next items only once the first one has shown here
print(json.dumps({"messages": messages, "prompts": prompts}), flush=True)
os._exit(0)
"""


def test_the_strategy_streams_remote_items_and_logs_each_reach(tmp_path: Path, packaged: Path) -> None:
    """Items show as they arrive (the agent waits for the first to show), each reach has a log, a failure an error;
    the model's streamed answer and a tool call streamed in pieces work on the real SDK's chunks."""
    from reach_plugins.agent import BackgroundServer, ReachAgent
    from reach_plugins.errors import BusinessError

    gate = tmp_path / "first-item-shown"
    waited: list[bool] = []
    agent = ReachAgent("writer", tokens="open")

    @agent.capability("draft_reply", description="Draft a reply", params_schema={"type": "object"})
    async def draft_reply(topic: str) -> AsyncIterator[str]:
        yield "Sorry about the "
        deadline = time.monotonic() + 20
        while not gate.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        waited.append(gate.exists())
        yield topic
        yield "."

    @agent.capability("query_order", description="Look up an order", params_schema=ORDER_ID)
    def query_order(order_id: str) -> dict[str, str]:
        raise BusinessError(f"there is no order {order_id}")

    with BackgroundServer(agent.app) as server:
        registry = registry_file(tmp_path, agent, server.url)
        report = run_real(STREAM, str(packaged / "reach_agent"), registry, str(gate))
    assert waited == [True], "the first item did not reach the strategy while the agent was still running"
    messages = report["messages"]
    assert [m["text"] for m in messages if m["type"] == "text"] == ["do", "ne"], "the model's answer streams too"
    logs = [m for m in messages if m["type"] == "log"]
    by_id: dict[str, list[dict[str, Any]]] = {}
    for log in logs:
        by_id.setdefault(log["id"], []).append(log)
    labels = {entries[0]["label"]: entries for entries in by_id.values()}
    draft, failed = labels["reach draft_reply"], labels["reach query_order"]
    assert [entry["data"].get("items") for entry in draft[1:-1]] == [1, 2, 3]
    assert [entry["status"] for entry in draft] == ["start", "start", "start", "start", "success"]
    assert draft[-1]["data"]["output"] == "Sorry about the late parcel."
    assert draft[-1]["data"]["capability"] == "draft_reply"
    assert set(draft[-1]["metadata"]) == {"started_at", "finished_at", "elapsed_time"}
    assert draft[0]["parent_id"] == labels["CALL draft_reply"][0]["id"]
    assert labels["CALL draft_reply"][0]["parent_id"] == labels["ROUND 1"][0]["id"]
    assert failed[-1]["status"] == "error" and "there is no order X" in failed[-1]["error"]
    tool_outputs = [m["content"] for m in report["prompts"][1] if m["role"] == "tool"]
    assert tool_outputs == ["Sorry about the late parcel."], "the model reads the joined stream once, unwrapped"
