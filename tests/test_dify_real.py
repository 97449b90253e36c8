"""The real dify-plugin SDK (0.10.2): the stand-in of ``tests/dify_fake.py`` matches it, the example plugins run on it.

The SDK runs in a Python 3.12 venv of its own, ``.venv-dify`` (its pins
conflict with ours, and importing it patches the process with gevent), built
by ``scripts/setup.sh`` with reach-plugins installed from a wheel (``python
-m build``), as the plugin README tells users to. ``REACH_DIFY_PYTHON`` names
another interpreter. Without one the tests skip, or fail under ``CI=true``.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import dify_fake
import pytest
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
final = [m.message.text for m in strategy.invoke(parameters)]
report = {"tool": answer, "final": final, "class": strategy_class.__name__, "seen_tools": seen_tools,
          "reach_plugins": os.path.dirname(reach_plugins.__file__)}
print(json.dumps(report), flush=True)
os._exit(0)
"""


def test_example_plugins_load_and_reach_with_the_real_sdk(tmp_path: Path) -> None:
    """The real SDK loads both example plugins from the installed wheel; tool and strategy reach a real agent."""
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
        report = run_real(REAL_SDK, str(PLUGINS), f"file://{agents}")
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
