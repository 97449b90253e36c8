"""Cells of ``04_llamaindex_and_dify.ipynb``: the same agents reached from LlamaIndex and from Dify's tool hook."""

CELLS: list[tuple[str, str]] = [
    (
        "md",
        """
# LlamaIndex and Dify

The same agents, reached from the two other hosts:

* **LlamaIndex** has no hook around tool calls, so `enhance_agent` wraps the
  agent's tools (keeping their metadata) and adds the proxy tools `expose` names. One workflow
  `Context` is one conversation.
* **Dify** has no `tool.before_invoke` hook, so `reach_plugins.dify` provides
  one; the Reach agent strategy for Dify calls it around every tool call, with
  Dify's conversation id as the affinity key. Here we call it directly.

Both are traced: the spans show the framework's tool call, the reach and the
agent. Offline, scripted LLM, no API key.
""",
    ),
    (
        "code",
        """
import json
import re
import warnings

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ToolCallBlock
from llama_index.core.llms import ChatMessage, MessageRole
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.workflow import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from reach_plugins import ReachEnhancer
from reach_plugins.agent import BackgroundServer
from reach_plugins.demo.agents import inventory_agent, orders_agent
from reach_plugins.dify import before_invoke, close_conversation
from reach_plugins.llamaindex import SESSION_KEY, enhance_agent
from reach_plugins.registry import MemoryRegistry

warnings.filterwarnings("ignore", message="Skipping serialization")  # LlamaIndex notes its memory is not serialised
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))

registry = MemoryRegistry()
servers = []
for instance_id, factory in [("orders-1", orders_agent), ("orders-2", orders_agent), ("inventory-1", inventory_agent)]:
    agent = factory(provider)
    server = BackgroundServer(agent.app).start()
    await agent.register(registry, server.url, instance_id=instance_id)
    servers.append(server)
enhancer = ReachEnhancer(
    registry=registry, capability_map={"lookup_order": "query_order"}, expose=["check_inventory"], tracer_provider=provider
)
""",
    ),
    (
        "md",
        """
## LlamaIndex: a FunctionAgent, enhanced

`MockFunctionCallingLLM` with a scripted response generator plays the model:
it calls the tool the question asks for, then repeats the tool's answer.
""",
    ),
    (
        "code",
        """
def scripted(messages, **kwargs) -> ChatMessage:
    if messages[-1].role == MessageRole.TOOL:
        return ChatMessage(role="assistant", content=f"Tool said: {messages[-1].content}")
    question = messages[-1].content or ""
    if match := re.search(r"order ([A-Z]\\d+)", question):
        call = ToolCallBlock(tool_call_id="c1", tool_name="lookup_order", tool_kwargs={"order_id": match.group(1)})
    elif match := re.search(r"SKU ([A-Z]-\\d+)", question):
        call = ToolCallBlock(tool_call_id="c2", tool_name="check_inventory", tool_kwargs={"sku": match.group(1)})
    else:
        return ChatMessage(role="assistant", content="I can look up orders and stock.")
    return ChatMessage(role="assistant", blocks=[call])


def lookup_order(order_id: str) -> str:
    \"\"\"Look up where a customer's order is.\"\"\"
    return f"(local fallback) order {order_id}: unknown"


llm = MockFunctionCallingLLM(response_generator=scripted)
agent = enhance_agent(FunctionAgent(tools=[lookup_order], llm=llm), enhancer)
print("tools the model sees:", [tool.metadata.name for tool in await agent.get_tools("")])

conversation = Context(agent)
llama_answers = []
for question in ("Where is order A1001?", "Is SKU K-7 in stock?", "And order A1002?", "And order Z9?"):
    answer = str(await agent.run(question, ctx=conversation))
    llama_answers.append(answer)
    print(f"> {question}\\n  {answer[:160]}")
print("conversation key kept in ctx.store:", await conversation.store.get(SESSION_KEY))
""",
    ),
    (
        "md",
        """
## Dify: the `before_invoke` hook

A Dify agent about to run a tool asks the hook first. A result means an agent
answered; `None` means Dify runs its own tool. Closing the Dify conversation
ends its session: later calls are refused without being sent.

Dify calls tools synchronously, in its own plugin process; here a second
enhancer plays that process.
""",
    ),
    (
        "code",
        """
dify_enhancer = ReachEnhancer(registry=registry, matcher=False, tracer_provider=provider)


def dify_tool(tool: str, parameters: dict, conversation: str):
    return before_invoke(
        tool, parameters, conversation_id=conversation, app_id="app-cs", user_id="end-user-7", enhancer=dify_enhancer
    )


dify_results = [
    dify_tool("query_order", {"order_id": "A1001"}, "dify-conv-1"),
    dify_tool("query_order", {"order_id": "A1002"}, "dify-conv-1"),
    dify_tool("current_time", {"timezone": "Asia/Shanghai"}, "dify-conv-1"),
]
close_conversation("dify-conv-1", enhancer=dify_enhancer)
dify_results.append(dify_tool("query_order", {"order_id": "A1001"}, "dify-conv-1"))
for result in dify_results:
    if result is None:
        print("None -> Dify runs its own tool")
    else:
        where = result.route.instance if result.route else "-"
        print(f"{'ok ' if result.ok else 'err'} {where:<9} {result.content[:110]}")
""",
    ),
    (
        "md",
        """
## The spans

Each framework tool call is an `execute_tool` span; under it the client's
`reach` span, and under that the agent's server span (through `traceparent`).
Dify's calls sit under a `dify.tool` span that names the app and end user.
""",
    ),
    (
        "code",
        """
spans = exporter.get_finished_spans()
children = {}
for span in spans:
    children.setdefault(span.parent.span_id if span.parent else None, []).append(span)


SHOWN = ("gen_ai.conversation.id", "dify.app_id", "reach.instance")


def show(span, depth=0):
    attributes = {key: value for key, value in (span.attributes or {}).items() if key in SHOWN}
    print(f"{'  ' * depth}{span.name}  {attributes if attributes else ''}")
    for child in sorted(children.get(span.context.span_id, []), key=lambda s: s.start_time):
        show(child, depth + 1)


roots = sorted(children[None], key=lambda s: s.start_time)
for root in roots[:2] + roots[-2:]:
    show(root)
""",
    ),
    (
        "code",
        """
await enhancer.aclose()
dify_enhancer.close()
for server in servers:
    server.stop()
llama_reaches = [
    span
    for span in spans
    if span.attributes.get("gen_ai.operation.name") == "invoke_agent"
    and span.attributes.get("reach.capability") == "query_order"
    and span.attributes.get("gen_ai.conversation.id", "").startswith("llamaindex")
]
summary = {
    "llama_answers": llama_answers,
    "llama_instances": sorted({s.attributes.get("reach.instance") for s in llama_reaches}),
    "dify": [None if r is None else {"ok": r.ok, "instance": r.route and r.route.instance} for r in dify_results],
    "span_names": sorted({s.name for s in spans}),
}
print("SUMMARY", json.dumps(summary))
""",
    ),
]
