"""The Dify integration: the before_invoke hook, the settings, and the dify-plugin entry points.

The entry points run here against ``tests/dify_fake.py`` (the real SDK pins
packages our stack cannot take and patches the process with gevent);
``tests/test_dify_real.py`` checks that fake against the real SDK and runs the
example plugins with it.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import dify_fake
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import reach_plugins.dify as dify
from reach_plugins import AgentDescriptor, Capability, ReachEnhancer
from reach_plugins.errors import BusinessError, ConfigError, InvalidPayload, SessionClosed, UnknownCapability
from reach_plugins.model import ErrorInfo, Instance
from reach_plugins.registry import MemoryRegistry
from reach_plugins.transport import Call, MockTransport, Reply
from reach_plugins.wire.items import reply_of

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "examples" / "dify_plugin"
ORDER_ID = {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}


def echo(call: Call) -> dict[str, Any] | Reply:
    """The agent: who served which capability for which conversation; ``order_id`` X fails as a business error."""
    request = call.request
    if request.payload.get("order_id") == "X":
        return Reply(status="fail", error=ErrorInfo(type="business", message="there is no order X"))
    return {
        "instance": call.instance.instance_id,
        "capability": request.capability,
        "payload": request.payload,
        "session": request.session_id,
    }


@pytest.fixture
def transport() -> MockTransport:
    return MockTransport(echo)


@pytest.fixture
async def registry() -> MemoryRegistry:
    registry = MemoryRegistry()
    capabilities = [
        Capability(name="query_order", description="Look up an order", params_schema=ORDER_ID),
        Capability(name="search_knowledge", description="Search the help centre for policies"),
    ]
    await registry.register_agent(AgentDescriptor(name="orders", capabilities=capabilities))
    for name in ("orders-a", "orders-b", "orders-c"):
        await registry.register_instance(Instance(agent="orders", instance_id=name, endpoint=f"http://{name}"))
    return registry


@pytest.fixture
def enhancer(registry: MemoryRegistry, transport: MockTransport) -> Iterator[ReachEnhancer]:
    with ReachEnhancer(registry=registry, transport=transport, matcher=False) as enhancer:
        yield enhancer


def hook(enhancer: ReachEnhancer, tool: str, params: dict[str, Any], conversation: str | None = "conv-1") -> Any:
    return dify.before_invoke(
        tool, params, conversation_id=conversation, app_id="app-9", user_id="user-3", enhancer=enhancer
    )


# ----------------------------------------------------------------------------- before_invoke


def test_mapped_tool_is_reached_with_the_conversation_as_affinity_key(
    enhancer: ReachEnhancer, transport: MockTransport
) -> None:
    """A tool an agent offers is reached; every call of one conversation lands on one instance."""
    results = [hook(enhancer, "query_order", {"order_id": f"A{n}"}) for n in range(4)]
    assert all(result is not None and result.ok for result in results)
    assert {call.request.session_id for call in transport.calls} == {"conv-1"}
    assert len({result.data["instance"] for result in results}) == 1
    assert results[2].data["payload"] == {"order_id": "A2"}


def test_unmapped_tool_returns_none_and_sends_nothing(enhancer: ReachEnhancer, transport: MockTransport) -> None:
    """A tool no agent offers returns None (Dify runs its own tool) and nothing is sent."""
    assert hook(enhancer, "get_weather", {"city": "Hangzhou"}) is None
    assert transport.calls == []


def test_closed_conversation_is_refused(enhancer: ReachEnhancer, transport: MockTransport) -> None:
    """Session liveness applies: after close_conversation the call fails with SessionClosed and is not sent."""
    assert hook(enhancer, "query_order", {"order_id": "A1"}, "conv-7").ok
    dify.close_conversation("conv-7", enhancer=enhancer)
    result = hook(enhancer, "query_order", {"order_id": "A1"}, "conv-7")
    assert isinstance(result.error, SessionClosed) and "conversation is closed" in result.content
    assert len(transport.calls) == 1


def test_agent_failure_is_a_result_the_model_can_act_on(enhancer: ReachEnhancer) -> None:
    """A business failure comes back as a failed result whose text says what went wrong and what to do."""
    result = hook(enhancer, "query_order", {"order_id": "X"})
    assert not result.ok
    assert "there is no order X" in result.content and "check the arguments" in result.content


def test_the_dify_hop_is_a_span_around_the_tool_span(registry: MemoryRegistry, transport: MockTransport) -> None:
    """The Dify span carries app, end user and conversation; the enhancer's tool span is its child."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with ReachEnhancer(registry=registry, transport=transport, matcher=False, tracer_provider=provider) as enhancer:
        hook(enhancer, "query_order", {"order_id": "A1"})
    spans = {span.name: span for span in exporter.get_finished_spans()}
    outer, inner = spans["dify.tool query_order"], spans["execute_tool query_order"]
    assert outer.attributes is not None and outer.context is not None and inner.parent is not None
    assert dict(outer.attributes) == {
        "dify.app_id": "app-9",
        "enduser.id": "user-3",
        "gen_ai.conversation.id": "conv-1",
    }
    assert inner.parent.span_id == outer.context.span_id


def test_reach_capability_forwards_whatever_the_tool_is_called(
    enhancer: ReachEnhancer, transport: MockTransport
) -> None:
    """reach_capability reaches the named capability; an unknown one fails with UnknownCapability."""
    result = dify.reach_capability(
        "search_knowledge", {"query": "returns"}, conversation_id=None, app_id=None, user_id=None, enhancer=enhancer
    )
    assert result.ok and result.data["capability"] == "search_knowledge" and result.data["session"] is None
    missing = dify.reach_capability(
        "refund_order", {}, conversation_id="c", app_id=None, user_id=None, enhancer=enhancer
    )
    assert isinstance(missing.error, UnknownCapability)
    assert len(transport.calls) == 1


# ----------------------------------------------------------------------------- settings


def test_settings_take_values_first_then_the_environment() -> None:
    """Credentials (or prefixed strategy parameters) win over REACH_* variables; blanks fall through; no token shown."""
    environ = {"REACH_REGISTRY": "etcd://etcd:2379", "REACH_TENANT": "demo"}
    settings = dify.ReachSettings.from_mapping({"tenant": "acme", "gateway_url": " "}, environ=environ)
    assert settings == dify.ReachSettings(registry="etcd://etcd:2379", tenant="acme")
    prefixed = dify.ReachSettings.from_mapping(
        {"reach_registry": "memory://", "tenant": "x"}, prefix="reach_", environ={}
    )
    assert prefixed == dify.ReachSettings(registry="memory://")
    assert dify.ReachSettings.given({"reach_tenant": "acme"}, prefix="reach_")
    assert not dify.ReachSettings.given({"query": "hi", "reach_tenant": ""}, prefix="reach_")
    assert "s3cret" not in repr(dify.ReachSettings.from_mapping({"gateway_token": "s3cret"}, environ={}))


def test_enhancers_are_built_once_per_settings_and_configure_takes_precedence(enhancer: ReachEnhancer) -> None:
    """enhancer_for caches per settings; enhancer_from uses the configured enhancer when nothing is given."""
    try:
        first = dify.enhancer_for(dify.ReachSettings(tenant="t-1"))
        assert dify.enhancer_for(dify.ReachSettings(tenant="t-1")) is first
        assert dify.enhancer_for(dify.ReachSettings(tenant="t-2")) is not first
        assert dify.enhancer_from({"tenant": "t-1"}) is first
        dify.configure(enhancer)
        assert dify.enhancer_from({}) is enhancer and dify.default_enhancer() is enhancer
    finally:
        dify.configure(None)
        dify.shutdown()


def test_check_settings_lists_capabilities_or_explains_an_empty_registry(tmp_path: Path) -> None:
    """The provider's credential check: capabilities of a YAML registry; ConfigError when it lists none."""
    agents = tmp_path / "agents.yaml"
    agents.write_text("agents:\n  - name: orders\n    endpoint: http://127.0.0.1:9\n    capabilities: [query_order]\n")
    try:
        assert dify.check_settings({"registry": f"file://{agents}"}) == ["query_order"]
        with pytest.raises(ConfigError, match="lists no agent"):
            dify.check_settings({"registry": "memory://"})
    finally:
        dify.shutdown()


def test_the_hook_needs_no_dify_plugin_and_entry_points_name_the_extra() -> None:
    """Importing reach_plugins.dify leaves dify_plugin unimported; an entry point without it names the extra."""
    script = textwrap.dedent(
        """
        import sys
        import reach_plugins.dify as dify
        assert "dify_plugin" not in sys.modules
        try:
            dify.ReachTool
        except ImportError as exc:
            print(exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    assert 'pip install "reach-plugins[dify]"' in out.stdout


# ----------------------------------------------------------------------------- entry points (fake dify_plugin)


@pytest.fixture
def plugin(enhancer: ReachEnhancer) -> Iterator[ModuleType]:
    """The Dify entry points imported over the fake SDK, with ``enhancer`` configured; all undone after."""
    names = dify_fake.install()
    dify.configure(enhancer)
    try:
        yield importlib.import_module("reach_plugins.frameworks.dify.plugin")
    finally:
        dify.configure(None)
        for name in [*names, "reach_plugins.frameworks.dify.plugin"]:
            sys.modules.pop(name, None)


def session(conversation: str | None = "conv-1", **parts: Any) -> SimpleNamespace:
    return SimpleNamespace(conversation_id=conversation, app_id="app-9", **parts)


def runtime(**credentials: Any) -> SimpleNamespace:
    return SimpleNamespace(credentials=credentials, user_id="user-3")


def test_reach_tool_class_forwards_one_capability(plugin: ModuleType, transport: MockTransport) -> None:
    """reach_tool('query_order') is a Tool class whose calls reach query_order in the Dify conversation."""
    tool_class = plugin.reach_tool("query_order")
    assert tool_class.__name__ == "QueryOrder" and issubclass(tool_class, dify_fake.Tool)
    [message] = tool_class(runtime(), session()).invoke({"order_id": "A1"})
    assert message.type == "json" and message.message.json_object["payload"] == {"order_id": "A1"}
    assert transport.calls[0].request.session_id == "conv-1"


def test_generic_reach_tool_takes_the_capability_from_a_form_parameter(
    plugin: ModuleType, transport: MockTransport
) -> None:
    """The reach_capability parameter picks the capability and is not sent; without one the tool refuses."""
    tool = plugin.ReachTool(runtime(), session(None))
    [message] = tool.invoke({"reach_capability": "search_knowledge", "query": "returns"})
    assert message.message.json_object["capability"] == "search_knowledge"
    assert transport.calls[0].request.payload == {"query": "returns"}
    with pytest.raises(ConfigError, match="names no capability"):
        list(tool.invoke({"query": "returns"}))


def test_failed_reach_is_text_for_the_model(plugin: ModuleType) -> None:
    """A failed reach yields a text message carrying the error and the advice."""
    [message] = plugin.reach_tool("query_order")(runtime(), session()).invoke({"order_id": "X"})
    assert message.type == "text" and "there is no order X" in message.message.text


class LocalTools:
    """The Dify side of ``session.tool``: records what it was asked to run."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, str, dict[str, Any]]] = []

    def invoke(
        self, provider_type: Any, provider: str, tool_name: str, parameters: dict[str, Any], credential_id: Any = None
    ) -> Iterator[Any]:
        self.ran.append((provider_type.value, tool_name, parameters))
        yield dify_fake.ToolInvokeMessage(type="text", message={"text": f"local {tool_name}"})


def answers(messages: Iterator[Any]) -> list[Any]:
    """A strategy's messages without its agent logs."""
    return [message for message in messages if message.type != "log"]


def tool_entity(name: str, description: str) -> dict[str, Any]:
    return {
        "identity": {"author": "reach", "name": name, "label": {"en_US": name}, "provider": "builtin_provider"},
        "description": {"human": {"en_US": description}, "llm": description},
    }


def scripted_llm(*replies: dict[str, Any]) -> tuple[SimpleNamespace, list[list[Any]]]:
    """An LLM whose replies are scripted; returns it and the prompts it saw."""
    queue, prompts = list(replies), []

    def invoke(model_config: Any, prompt_messages: list[Any], tools: Any = None, stream: bool = True) -> Any:
        prompts.append(list(prompt_messages))
        return dify_fake.LLMResult(model="m", message=dify_fake.AssistantPromptMessage(**queue.pop(0)), usage={})

    return SimpleNamespace(llm=SimpleNamespace(invoke=invoke)), prompts


def calls(*named: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    tool_calls = [
        {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        for n, (name, args) in enumerate(named)
    ]
    return {"content": "", "tool_calls": tool_calls}


STRATEGY_PARAMETERS = {
    "query": "Where is A1, and what is the weather?",
    "instruction": "Be brief.",
    "model": {"provider": "openai", "model": "gpt", "mode": "chat", "history_prompt_messages": []},
    "tools": [tool_entity("query_order", "Look up an order"), tool_entity("get_weather", "Weather in a city")],
    "maximum_iterations": 3,
}


def test_agent_strategy_reaches_mapped_tools_and_runs_the_others(plugin: ModuleType, transport: MockTransport) -> None:
    """ReachAgentStrategy: query_order is reached (conversation affinity), get_weather runs in Dify; outputs go back."""
    local = LocalTools()
    model, prompts = scripted_llm(
        calls(("query_order", {"order_id": "A1"}), ("get_weather", {"city": "HZ"})), {"content": "A1 shipped; sunny."}
    )
    strategy = plugin.ReachAgentStrategy(SimpleNamespace(user_id="user-3"), session(tool=local, model=model))
    messages = answers(strategy.invoke(dict(STRATEGY_PARAMETERS)))
    assert [m.message.text for m in messages] == ["A1 shipped; sunny."]
    assert [call.request.session_id for call in transport.calls] == ["conv-1"]
    assert local.ran == [("builtin", "get_weather", {"city": "HZ"})]
    outputs = [m.content for m in prompts[1] if m.role == "tool"]
    assert json.loads(outputs[0])["payload"] == {"order_id": "A1"} and outputs[1] == "local get_weather"
    assert [m.role for m in prompts[0]] == ["system", "user"]


def test_agent_strategy_stops_after_maximum_iterations(plugin: ModuleType) -> None:
    """A model that keeps calling tools is stopped after maximum_iterations rounds."""
    rounds = [calls(("get_weather", {"city": "HZ"})) for _ in range(2)]
    model, prompts = scripted_llm(*rounds)
    strategy = plugin.ReachAgentStrategy(SimpleNamespace(user_id=None), session(tool=LocalTools(), model=model))
    messages = list(strategy.invoke({**STRATEGY_PARAMETERS, "maximum_iterations": 2}))
    assert len(prompts) == 2 and "Stopped after 2 rounds" in messages[-1].message.text


def test_reach_strategy_hooks_a_custom_strategy(plugin: ModuleType, transport: MockTransport) -> None:
    """@reach_strategy puts before_invoke in front of a custom strategy's invoke_builtin_tool calls."""
    local = LocalTools()

    @plugin.reach_strategy
    class Custom(dify_fake.AgentStrategy):
        def _invoke(self, parameters: dict[str, Any]) -> Iterator[Any]:
            for name, args in (("query_order", {"order_id": "A7"}), ("get_weather", {})):
                yield from self.session.tool.invoke_builtin_tool("provider", name, args)

    messages = answers(Custom(SimpleNamespace(user_id="u"), session("conv-2", tool=local)).invoke({"tools": []}))
    assert messages[0].message.json_object["session"] == "conv-2"
    assert messages[1].message.text == "local get_weather"
    assert Custom.__name__ == "Custom" and [name for _, name, _ in local.ran] == ["get_weather"]
    assert len(transport.calls) == 1


# ----------------------------------------------------------------------------- Ask an agent's payload

MESSAGE = {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}
TWO = {"type": "object", "properties": {"order_id": {"type": "string"}, "reason": {"type": "string"}}}


@pytest.mark.parametrize(
    ("schema", "field"),
    [
        (None, "query"),
        (MESSAGE, "message"),
        (ORDER_ID, "order_id"),
        ({"type": "object", "required": ["text"]}, "text"),
        ({"properties": {"n": {"type": "integer"}, "q": {"type": ["string", "null"]}}}, "q"),
        ({"properties": {"n": {"type": "integer"}}, "required": ["n"]}, None),
        ({**TWO, "required": ["order_id", "reason"]}, None),
        (TWO, None),
    ],
)
def test_the_question_fills_the_schemas_one_text_field(schema: dict[str, Any] | None, field: str | None) -> None:
    """The one required string field, else the one string property; none when the schema has no single such field."""
    assert dify.text_field(schema) == field


def test_ask_payload_places_the_question_and_keeps_given_arguments() -> None:
    """The question goes into the text field unless the arguments already set it; a JSON text is parsed."""
    chat = Capability(name="triage_ticket", params_schema=MESSAGE)
    assert dify.ask_payload(chat, {"query": " late parcel ", "arguments": ""}) == {"message": "late parcel"}
    assert dify.ask_payload(chat, {"query": "x", "arguments": '{"message": "y"}'}) == {"message": "y"}
    assert dify.ask_payload(None, {"query": "returns"}) == {"query": "returns"}
    two = Capability(name="open_ticket", params_schema={**TWO, "required": ["order_id", "reason"]})
    given = {"order_id": "A1", "reason": "late"}
    assert dify.ask_payload(two, {"arguments": given}) == given


def test_ask_payload_names_what_to_give_when_it_cannot_shape_one() -> None:
    """No single text field, not JSON, not an object, nothing at all: InvalidPayload saying what to give."""
    two = Capability(name="open_ticket", params_schema={**TWO, "required": ["order_id", "reason"]})
    with pytest.raises(InvalidPayload, match=r"takes fields 'order_id', 'reason'.*JSON object in 'arguments'"):
        dify.ask_payload(two, {"query": "A1 is late"})
    with pytest.raises(InvalidPayload, match="are not JSON"):
        dify.ask_payload(two, {"arguments": "{order_id: A1"})
    with pytest.raises(InvalidPayload, match="must be a JSON object"):
        dify.ask_payload(two, {"arguments": "[1, 2]"})
    with pytest.raises(InvalidPayload, match="neither a question"):
        dify.ask_payload(two, {"query": " ", "arguments": ""})


def test_ask_agent_tool_sends_the_question_as_the_capabilitys_field(
    plugin: ModuleType, transport: MockTransport
) -> None:
    """AskAgent on query_order (schema order_id) sends {order_id}, not {query}; a schema-less one gets {query}."""
    tool = plugin.AskAgent(runtime(), session())
    [message] = tool.invoke({"reach_capability": "query_order", "query": "A1"})
    assert message.message.json_object["payload"] == {"order_id": "A1"}
    list(tool.invoke({"reach_capability": "search_knowledge", "query": "returns"}))
    assert [call.request.payload for call in transport.calls] == [{"order_id": "A1"}, {"query": "returns"}]


# ----------------------------------------------------------------------------- streaming and agent logs (fake SDK)


def test_stream_reach_collects_items_as_the_agent_sdk_does() -> None:
    """Strings join into one text, a single item stays itself, several items are a list, none is an empty list;
    a served agent's progress items are left out and its closing result is the reply."""
    assert reply_of(["a", "b"]) == "ab"
    assert reply_of([{"x": 1}]) == {"x": 1}
    assert reply_of([{"x": 1}, "b"]) == [{"x": 1}, "b"]
    assert reply_of([]) == []
    token = {"type": "token", "agent": "orders", "node": "model", "text": "A1 ships"}
    assert reply_of([token, {"type": "reach.result", "data": {"reply_content": "A1 ships"}}]) == {
        "reply_content": "A1 ships"
    }


def test_a_reached_tool_call_writes_an_agent_log_under_its_call(plugin: ModuleType) -> None:
    """ROUND -> CALL -> reach logs, the reach's finished with capability and output; a local tool gets no reach log."""
    local = LocalTools()
    model, _ = scripted_llm(
        calls(("query_order", {"order_id": "A1"}), ("get_weather", {"city": "HZ"})), {"content": "ok"}
    )
    strategy = plugin.ReachAgentStrategy(SimpleNamespace(user_id="user-3"), session(tool=local, model=model))
    logs = [m.message for m in strategy.invoke(dict(STRATEGY_PARAMETERS)) if m.type == "log"]
    first = {log.id: log for log in reversed(logs)}
    labels = {log.label: log for log in first.values()}
    assert set(labels) == {"ROUND 1", "ROUND 2", "CALL query_order", "CALL get_weather", "reach query_order"}
    reach = [log for log in logs if log.label == "reach query_order"]
    assert reach[0].parent_id == labels["CALL query_order"].id
    assert labels["CALL query_order"].parent_id == labels["ROUND 1"].id
    assert [log.status.value for log in reach] == ["start", "start", "success"]
    assert reach[-1].data["capability"] == "query_order" and reach[-1].data["items"] == 1
    assert json.loads(reach[-1].data["output"])["payload"] == {"order_id": "A1"}


def test_a_raising_enhancer_still_finishes_and_yields_the_reach_log(
    plugin: ModuleType, registry: MemoryRegistry, transport: MockTransport
) -> None:
    """on_error="raise": the failure reaches the strategy's caller after the reach's log, finished with an error."""

    @plugin.reach_strategy
    class Custom(dify_fake.AgentStrategy):
        def _invoke(self, parameters: dict[str, Any]) -> Iterator[Any]:
            yield from self.session.tool.invoke_builtin_tool("provider", "query_order", {"order_id": "X"})

    seen: list[Any] = []
    with ReachEnhancer(registry=registry, transport=transport, matcher=False, on_error="raise") as raising:
        dify.configure(raising)
        with pytest.raises(BusinessError, match="there is no order X"):
            for message in Custom(SimpleNamespace(user_id="u"), session(tool=LocalTools())).invoke({"tools": []}):
                seen.append(message)
    logs = [message.message for message in seen]
    assert [(log.label, log.status.value) for log in logs] == [("reach query_order", s) for s in ("start", "error")]
    assert "there is no order X" in (logs[-1].error or "") and len(transport.calls) == 1


def chunks(*pieces: dict[str, Any]) -> Iterator[Any]:
    """A streamed model answer: one chunk per piece."""
    for index, piece in enumerate(pieces):
        message = dify_fake.AssistantPromptMessage(**piece)
        yield dify_fake.LLMResultChunk(model="m", delta=dify_fake.LLMResultChunkDelta(index=index, message=message))


def test_the_strategy_streams_the_models_text_and_joins_a_tool_call_sent_in_pieces(
    plugin: ModuleType, transport: MockTransport
) -> None:
    """stream=True: each text chunk is a message as it comes; a tool call's arguments split over chunks are joined."""
    first = {"id": "c0", "type": "function", "function": {"name": "query_order", "arguments": '{"order_'}}
    rest = {"id": "", "type": "function", "function": {"name": "", "arguments": 'id": "A1"}'}}
    rounds = iter(
        [
            chunks({"content": "", "tool_calls": [first]}, {"content": "", "tool_calls": [rest]}),
            chunks({"content": "A1 is "}, {"content": "shipped."}),
        ]
    )
    asked: list[bool] = []

    def invoke(model_config: Any, prompt_messages: list[Any], tools: Any = None, stream: bool = True) -> Any:
        asked.append(stream)
        return next(rounds)

    model = SimpleNamespace(llm=SimpleNamespace(invoke=invoke))
    strategy = plugin.ReachAgentStrategy(SimpleNamespace(user_id="u"), session(tool=LocalTools(), model=model))
    texts = [m.message.text for m in strategy.invoke(dict(STRATEGY_PARAMETERS)) if m.type == "text"]
    assert texts == ["A1 is ", "shipped."] and asked == [True, True]
    assert [call.request.payload for call in transport.calls] == [{"order_id": "A1"}]
