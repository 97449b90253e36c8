"""The target asks for approval and the caller's framework answers: a LangGraph interrupt or a LlamaIndex
InputRequiredEvent, resumed the host's way; the approval travels to the target as a signed single-use ticket that its
CallerApproval checks, so the approved call runs once. Without a human in the loop the error says who approves where.

No ``from __future__ import annotations`` (LlamaIndex reads tool annotations as classes).
"""

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from host_support import calls, model, tool_message
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Command, interrupt
from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
from llama_index.core.base.llms.types import ToolCallBlock
from llama_index.core.llms import ChatMessage
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.workflow import HumanResponseEvent, InputRequiredEvent

from reach_plugins import ReachClient, ReachEnhancer
from reach_plugins.agent import BackgroundServer, CallerApproval, ReachAgent
from reach_plugins.agent.approval import TICKET_PREFIX
from reach_plugins.agent.langgraph import serve_graph
from reach_plugins.errors import ApprovalRequired, BusinessError
from reach_plugins.frameworks.toolcalls import ToolCall
from reach_plugins.langchain import create_agent
from reach_plugins.llamaindex import enhance_agent
from reach_plugins.registry import MemoryRegistry
from transports.direct import DirectTransport

NOW = [1_000_000.0]
"""The CallerApproval's wall clock (tests move it)."""


class Payments:
    """A payments agent whose refunds need the approval of the caller's reviewer; it records every run."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.registry = MemoryRegistry()
        agent = ReachAgent("payments", approver=CallerApproval(ttl=60, clock=lambda: NOW[0]))

        @agent.capability(
            "refund_payment",
            require_approval=True,
            description="Refund a payment",
            params_schema={"type": "object", "properties": {"payment_id": {"type": "string"}}},
        )
        def refund(payment_id: str) -> dict[str, str]:
            self.ran.append(payment_id)
            return {"refunded": payment_id}

        self.server = BackgroundServer(agent.app)
        agent.register_on_startup(self.registry, self.server.url)
        self.server.start()
        self.enhancers: list[ReachEnhancer] = []

    def enhancer(self, **options: Any) -> ReachEnhancer:
        enhancer = ReachEnhancer(
            registry=self.registry, transport=DirectTransport(), matcher=False, expose=["refund_payment"], **options
        )
        self.enhancers.append(enhancer)
        return enhancer

    def close(self) -> None:
        for enhancer in self.enhancers:
            enhancer.close()
        self.server.stop()


@pytest.fixture
def payments() -> Iterator[Payments]:
    served = Payments()
    yield served
    served.close()


async def test_a_ticket_runs_the_call_once_and_only_for_whom_it_was_issued(payments: Payments) -> None:
    """No ticket: approval_required with a ticket, nothing run; with it: runs; again: refused; expired: refused."""
    async with ReachClient(payments.registry, DirectTransport(), tenant="acme") as client:
        asked = (await client.reach("refund_payment", {"payment_id": "P-1"})).raise_for_status
        with pytest.raises(ApprovalRequired) as refused:
            asked()
        ticket = refused.value.ticket
        assert ticket is not None and ticket.startswith(TICKET_PREFIX) and payments.ran == []
        first = await client.reach("refund_payment", {"payment_id": "P-1"}, action=ticket)
        again = await client.reach("refund_payment", {"payment_id": "P-1"}, action=ticket)
        assert first.ok and first.data == {"refunded": "P-1"}
        with pytest.raises(BusinessError, match="already used"):
            again.raise_for_status()
        other = await client.reach("refund_payment", {"payment_id": "P-2"}, action=ticket, tenant="globex")
        with pytest.raises(BusinessError, match="another capability, tenant or caller"):
            other.raise_for_status()
        late = await client.reach("refund_payment", {"payment_id": "P-3"})
        late_ticket = error_ticket(late)
        NOW[0] += 61
        with pytest.raises(BusinessError, match="expired"):
            (await client.reach("refund_payment", {"payment_id": "P-3"}, action=late_ticket)).raise_for_status()
        forged = late_ticket[:-4] + ("AAAA" if not late_ticket.endswith("AAAA") else "BBBB")
        with pytest.raises(BusinessError, match="not one this agent issued"):
            (await client.reach("refund_payment", {"payment_id": "P-3"}, action=forged)).raise_for_status()
    assert payments.ran == ["P-1"]


def error_ticket(response: Any) -> str:
    try:
        response.raise_for_status()
    except ApprovalRequired as exc:
        assert exc.ticket is not None
        return exc.ticket
    raise AssertionError("the agent did not ask for approval")


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_langgraph_interrupts_once_and_the_resume_carries_the_approval(payments: Payments, decision: str) -> None:
    """The caller's graph interrupts (one question); resumed with LangChain's decision, the target runs it once."""
    desk = create_agent(
        model(calls("refund_payment", payment_id="P-7"), "Done."),
        [],
        checkpointer=InMemorySaver(),
        enhanced_by=payments.enhancer(),
    )
    config: Any = {"configurable": {"thread_id": f"t-{decision}"}}
    paused = desk.invoke({"messages": [("user", "refund P-7")]}, config)
    (pending,) = paused["__interrupt__"]
    assert pending.value["name"] == "refund_payment" and payments.ran == []
    answer = {"type": "approve"} if decision == "approve" else {"type": "reject", "message": "not this one"}
    done = desk.invoke(Command(resume={"decisions": [answer]}), config)
    assert "__interrupt__" not in done, "asked twice"
    message = tool_message(done["messages"])
    if decision == "approve":
        assert payments.ran == ["P-7"]
        assert message.status == "success" and message.artifact["structured_content"] == {"refunded": "P-7"}
    else:
        assert payments.ran == [] and message.status == "error" and "not this one" in str(message.content)


def test_without_a_human_in_the_loop_the_error_says_who_approves_where(payments: Payments) -> None:
    """A caller without an approver (a Dify plugin, a plain enhancer) gets ApprovalRequired naming who and where."""
    result = payments.enhancer().reach(ToolCall("refund_payment", {"payment_id": "P-8"}, has_local=False))
    assert isinstance(result.error, ApprovalRequired) and payments.ran == []
    assert "needs a person's approval and this caller has no approver" in result.content
    assert "pass ReachEnhancer(approver=...)" in result.content and "check the arguments" not in result.content
    target = payments.enhancer(approver=lambda pending: True, policy="remote_only")
    asked = ToolCall("refund_payment", {"payment_id": "P-9"}, has_local=False)
    assert target.reach(asked).ok and payments.ran == ["P-9"]


async def test_a_caller_that_never_asked_gets_the_targets_own_words(payments: Payments) -> None:
    """When only the target asks (the caller's catalogue does not say so), its message says who must approve where."""
    registry = MemoryRegistry()
    (descriptor,) = payments.registry.agents().values()
    capability = descriptor.capabilities[0].model_copy(update={"require_approval": False})
    registry.put_agent(descriptor.model_copy(update={"capabilities": [capability]}))
    for instance in payments.registry.instances("payments").values():
        await registry.register_instance(instance)
    async with ReachEnhancer(registry=registry, transport=DirectTransport(), matcher=False) as enhancer:
        result = await enhancer.areach(ToolCall("refund_payment", {"payment_id": "P-10"}, has_local=False))
    assert isinstance(result.error, ApprovalRequired) and payments.ran == []
    assert "needs the approval of the caller's reviewer" in result.content
    assert "ask the operator of 'payments'" in result.content
    assert "check the arguments" not in result.content


def llm(name: str, args: dict[str, Any], answer: str) -> MockFunctionCallingLLM:
    turns: list[Any] = [[(name, args)], answer]

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        turn = turns.pop(0)
        if isinstance(turn, str):
            return ChatMessage(role="assistant", content=turn)
        return ChatMessage(
            role="assistant", blocks=[ToolCallBlock(tool_call_id="c1", tool_name=t, tool_kwargs=kw) for t, kw in turn]
        )

    return MockFunctionCallingLLM(response_generator=respond)


async def test_llamaindex_asks_with_input_required_and_the_target_runs_once(payments: Payments) -> None:
    """InputRequiredEvent out, HumanResponseEvent back: the approved refund runs once at the target."""
    agent = enhance_agent(
        FunctionAgent(tools=[], llm=llm("refund_payment", {"payment_id": "P-11"}, "Refunded.")), payments.enhancer()
    )
    handler = agent.run("refund P-11")
    asked = 0
    results: list[ToolCallResult] = []
    async for event in handler.stream_events():
        if isinstance(event, InputRequiredEvent):
            asked += 1
            assert handler.ctx is not None and payments.ran == []
            handler.ctx.send_event(HumanResponseEvent(response="yes", waiter_id=event.waiter_id))
        elif isinstance(event, ToolCallResult):
            results.append(event)
    assert str(await handler) == "Refunded."
    assert asked == 1 and payments.ran == ["P-11"]
    assert [result.tool_output.is_error for result in results] == [False]


def test_a_served_graph_that_pauses_says_who_approves_where(payments: Payments) -> None:
    """A served graph that interrupts for a human is ApprovalRequired naming the agent, not 'check the arguments'."""

    def ask_a_human(state: MessagesState) -> dict[str, Any]:
        interrupt({"question": "ship it?"})
        return {"messages": [("ai", "shipped")]}

    builder = StateGraph(MessagesState)
    builder.add_node("ask", ask_a_human)
    builder.add_edge(START, "ask")
    served = serve_graph(
        builder.compile(checkpointer=InMemorySaver()), "shipping", ["ship_order"], registry=payments.registry
    )
    try:
        result = payments.enhancer().reach(ToolCall("ship_order", {"message": "ship A1"}, has_local=False))
    finally:
        served.stop()
    assert isinstance(result.error, ApprovalRequired)
    assert "agent 'shipping' paused its graph for a human's approval" in result.content
    assert "check the arguments" not in result.content
