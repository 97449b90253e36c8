"""The example agents of ``examples/agents/``, each started as its own process, reached by capability.

Every script runs with ``--port`` on a free port. A demo-tenant client routes
with ``examples/agents.yaml`` (ports replaced, tenants and credentials as
written); the two agents the YAML does not list are reached by the
descriptors their scripts give. Both go through DirectTransport.
"""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from servers import free_port, startup_seconds

from reach_plugins import ReachClient, ReachResponse
from reach_plugins.config.loader import ReachConfig, load_config
from reach_plugins.registry import MemoryRegistry, open_registry

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
AGENTS = EXAMPLES / "agents"
IN_YAML = {
    "front_desk": "front-desk",
    "orders": "orders",
    "tickets": "tickets",
    "knowledge": "knowledge",
    "inventory": "inventory",
    "cloud_chat": "cloud-chat-sales",
}
SCRIPTS = [*IN_YAML, "notification", "private_orders"]
SECRETS = {"DEMO_ORDERS_KEY": "orders-key", "DEMO_CLOUD_SALES_TOKEN": "sales-token"}


def start(script: str, *arguments: str) -> subprocess.Popen[str]:
    command = [sys.executable, str(AGENTS / f"{script}.py"), *arguments]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_ready(process: subprocess.Popen[str], url: str, deadline: float) -> None:
    """Poll ``/readyz`` until it answers 200; fail with the script's output if it exits or the deadline passes."""
    while True:
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"the script for {url} exited {process.returncode}:\n{out}\n{err}")
        try:
            if httpx.get(f"{url}/readyz", timeout=0.5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            out, err = process.communicate()
            raise AssertionError(f"the script for {url} was not ready in time (load-derived bound):\n{out}\n{err}")
        time.sleep(0.05)


def terminate(process: subprocess.Popen[str]) -> None:
    """Ask for a graceful shutdown (SIGTERM), once: a second SIGTERM makes uvicorn skip it."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)


def reap(process: subprocess.Popen[str]) -> str:
    """Wait for a terminated script (kill it if it lingers); its stdout."""
    try:
        out, _ = process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
    return out


def load_script(script: str) -> ModuleType:
    """Import an example script (without running it) to read its descriptor."""
    sys.path.insert(0, str(AGENTS))
    try:
        spec = importlib.util.spec_from_file_location(f"example_{script}", AGENTS / f"{script}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(AGENTS))


@pytest.fixture(scope="module")
def urls() -> Iterator[dict[str, str]]:
    """Every script running on a free port, ready; stopped (SIGTERM) afterwards."""
    ports = {script: free_port() for script in SCRIPTS}
    processes = {script: start(script, "--port", str(port)) for script, port in ports.items()}
    urls = {script: f"http://127.0.0.1:{port}" for script, port in ports.items()}
    try:
        deadline = time.monotonic() + startup_seconds(len(processes))
        for script, process in processes.items():
            wait_ready(process, urls[script], deadline)
        yield urls
    finally:
        for process in processes.values():
            terminate(process)
        for process in processes.values():
            reap(process)


@pytest.fixture(scope="module")
def config(urls: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> ReachConfig:
    """examples/agents.yaml with each agent's port replaced by the one its script got."""
    text = (EXAMPLES / "agents.yaml").read_text(encoding="utf-8")
    documented = load_config(EXAMPLES / "agents.yaml")
    for script, name in IN_YAML.items():
        old = documented.agent(name).endpoints[0].split("//")[1].split("/")[0]
        text = text.replace(old, urls[script].removeprefix("http://"))
    path = tmp_path_factory.mktemp("examples") / "agents.yaml"
    path.write_text(text, encoding="utf-8")
    return load_config(path)


@pytest.fixture
async def client(config: ReachConfig) -> AsyncIterator[ReachClient]:
    """A demo-tenant client routing over the agents of examples/agents.yaml, with its tenants and credentials."""
    registry = MemoryRegistry()
    for descriptor in config.agents:
        await registry.register_agent(descriptor)
    async with ReachClient(registry, tenant="demo", tenants=config.tenants, environ=SECRETS) as client:
        yield client


@pytest.fixture
async def unlisted(urls: dict[str, str]) -> AsyncIterator[ReachClient]:
    """A client routing over the two agents the YAML does not list, described by their scripts."""
    registry = MemoryRegistry()
    await registry.register_agent(load_script("notification").agent.descriptor(urls["notification"]))
    await registry.register_agent(load_script("private_orders").descriptor(urls["private_orders"]))
    async with ReachClient(registry) as client:
        yield client


def ok(response: ReachResponse) -> Any:
    return response.raise_for_status().data


def refused(response: ReachResponse) -> str:
    assert response.status == "fail" and response.error is not None and response.error.type == "business", response
    return response.error.message


async def test_front_desk_triages_messages(client: ReachClient) -> None:
    """The front desk names the kind of help a message needs; unknown topics are sales questions."""
    messages = ["My kettle arrived broken", "Where is my order?", "Is the SKU K-7 in stock?", "Any kettles on offer?"]
    intents = [ok(await client.reach("triage_request", {"message": text}))["intent"] for text in messages]
    assert intents == ["after_sales", "order", "stock", "sales"]


async def test_orders_answers_and_cancels_only_unshipped_orders(client: ReachClient) -> None:
    """query_order fits the YAML's return_schema; cancel_order cancels a pending order and refuses a shipped one."""
    order = ok(await client.reach("query_order", {"order_id": "A1001"}))
    assert (order["status"], order["items"]) == ("shipped", ["blue kettle"])
    assert ok(await client.reach("cancel_order", {"order_id": "A1003", "reason": "changed my mind"}))["cancelled"]
    assert "open an after-sales ticket" in refused(await client.reach("cancel_order", {"order_id": "A1001"}))
    assert "order ids look like" in refused(await client.reach("query_order", {"order_id": "B7"}))


async def test_tickets_opens_one_ticket_per_work_order(client: ReachClient, config: ReachConfig) -> None:
    """A repeated work-order number gets the first ticket back, even from another client (agent-side idempotency)."""
    ticket = {"wo_number": f"WO-{uuid.uuid4().hex[:6]}", "order_id": "A1001", "problem": "the lid is cracked"}
    first = ok(await client.reach("create_ticket", ticket))
    async with ReachClient(client.registry, tenant="demo", tenants=config.tenants, environ=SECRETS) as other:
        again = ok(await other.reach("create_ticket", ticket))
    other_ticket = ok(await client.reach("create_ticket", {**ticket, "wo_number": f"{ticket['wo_number']}-2"}))
    assert again == first and first["status"] == "open"
    assert other_ticket["ticket_id"] != first["ticket_id"]


async def test_knowledge_ranks_passages(client: ReachClient) -> None:
    """search_knowledge returns the passage sharing most words with the query first, and nothing for nonsense."""
    passages = ok(await client.reach("search_knowledge", {"query": "what is the returns policy", "top_k": 1}))
    assert passages == {"passages": [next(text for text in passages["passages"] if "returned within 7 days" in text)]}
    assert ok(await client.reach("search_knowledge", {"query": "zebra"})) == {"passages": []}


async def test_inventory_checks_and_holds_stock(client: ReachClient) -> None:
    """lock_stock takes units off what check_inventory reports; more than there is is refused."""
    before = ok(await client.reach("check_inventory", {"sku": "C-4"}))["available"]
    hold = ok(await client.reach("lock_stock", {"sku": "C-4", "quantity": 3, "order_id": f"O-{uuid.uuid4().hex}"}))
    after = ok(await client.reach("check_inventory", {"sku": "C-4"}))["available"]
    assert hold["available"] == after == before - 3
    too_many = {"sku": "T-2", "quantity": 1, "order_id": "A1002"}
    assert "only 0 x tea set in stock" in refused(await client.reach("lock_stock", too_many))


async def test_notification_sends_messages(unlisted: ReachClient) -> None:
    """send_message answers with a message id; an e-mail to a phone number is refused with what to use."""
    sent = ok(await unlisted.reach("send_message", {"to": "+86 138 0000 0000", "text": f"parcel {uuid.uuid4().hex}"}))
    assert sent["status"] == "sent" and sent["message_id"].startswith("M-") and sent["channel"] == "sms"
    wrong = {"to": "+86 138 0000 0000", "text": "hello", "channel": "email"}
    assert "use channel 'sms'" in refused(await unlisted.reach("send_message", wrong))


async def test_cloud_chat_is_reached_as_openai_compatible(client: ReachClient) -> None:
    """The fake cloud model's completion, tool call and stream come back normalised."""
    answer = ok(await client.reach("chat", {"input": "How much are the cups?"}))
    assert answer["reply_content"] == "The cups costs 59 yuan; 40 in stock."
    assert answer["raw_meta"]["model"] == "cloud-chat-sales" and answer["raw_meta"]["usage"]["total_tokens"] > 0
    call = ok(await client.reach("chat", {"input": "Where is A1002?"}))["tool_calls"]
    assert call == [{"id": "call_1", "name": "query_order", "arguments": {"order_id": "A1002"}}]
    events = [event async for event in client.stream("chat", {"input": "Tell me about the kettle"})]
    words = "".join(event.data["reply_content"] for event in events if event.kind == "data")
    assert words == "The blue kettle costs 199 yuan; 12 in stock." and events[-1].kind == "end"


async def test_cloud_chat_streams_usage_tool_calls_and_refusals(client: ReachClient) -> None:
    """The fake cloud model honours include_usage, streams tool-call fragments and refuses as OpenAI models do."""
    events = [event async for event in client.stream("chat", {"input": "Tell me about the kettle"})]
    usage = [event.data["usage"] for event in events if event.kind == "data" and "usage" in event.data]
    assert len(usage) == 1 and usage[0]["total_tokens"] > 0
    events = [event async for event in client.stream("chat", {"input": "Where is A1002?"})]
    calls = [call for event in events if event.kind == "data" for call in event.data["tool_calls"]]
    assert [(c["name"], c["arguments"]) for c in calls] == [("query_order", {"order_id": "A1002"})]
    refusal = await client.reach("chat", {"input": "What is my password?"})
    assert refusal.error is not None
    assert (refusal.status, refusal.error.type) == ("fail", "refusal")


async def test_cloud_chat_refuses_a_request_without_a_key(urls: dict[str, str]) -> None:
    """Without an Authorization header the fake cloud model answers 401 with an OpenAI error body."""
    async with httpx.AsyncClient() as http:
        answer = await http.post(f"{urls['cloud_chat']}/v1/chat/completions", json={"messages": []})
    assert answer.status_code == 401 and "API key" in answer.json()["error"]["message"]


async def test_private_agent_reply_is_unwrapped(unlisted: ReachClient) -> None:
    """The raw-http agent's wrapped answer becomes reply_content, its business fields raw_meta; code 1001 is refused."""
    answer = ok(await unlisted.reach("ask_order", {"question": "Where is A1002?"}, session_id="conv-1"))
    assert answer["reply_content"] == "Your order A1002 is paid; it arrives in 3 days."
    assert answer["raw_meta"]["data"]["order_info"] == {
        "id": "A1002",
        "status": "paid",
        "items": ["tea set", "cups"],
        "asked_by": "conv-1",
    }
    assert "give an order id" in refused(await unlisted.reach("ask_order", {"question": "Where is my parcel?"}))


async def test_registry_flag_registers_then_deregisters_on_shutdown(etcd_url: str) -> None:
    """--registry registers the running agent (reachable through that registry); SIGTERM deregisters it."""
    url, port = f"{etcd_url}/reach-examples-{uuid.uuid4().hex[:8]}/", free_port()
    process = start("notification", "--port", str(port), "--registry", url)
    try:
        wait_ready(process, f"http://127.0.0.1:{port}", time.monotonic() + startup_seconds())
        async with ReachClient(url) as client:
            [instance] = client.registry.instances("notification").values()
            sent = ok(await client.reach("send_message", {"to": "u-1", "text": "hi", "channel": "app"}))
        assert (instance.endpoint, sent["channel"]) == (f"http://127.0.0.1:{port}", "app")
    finally:
        terminate(process)
        out = reap(process)
    assert process.returncode in (0, -signal.SIGTERM) and f"registered in {url}" in out  # uvicorn re-raises SIGTERM
    after = open_registry(url)
    try:
        assert dict(after.instances("notification")) == {}
    finally:
        await after.aclose()
