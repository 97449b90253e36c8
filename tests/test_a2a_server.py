"""The agent SDK's A2A server on a real uvicorn: task continuity, ask/continue, cancel, streaming, parts, the
envelope, the card, ListTasks / SubscribeToTask and the HTTP+JSON binding (issue 27, deliverable 1)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest

from reach_plugins.agent import BackgroundServer, File, ReachAgent, ReachContext, Reply, ask
from reach_plugins.agent.a2a import A2AServer
from reach_plugins.agent.a2a_rpc import RpcError
from reach_plugins.server.layer import Inbound

WITHIN = 10.0
agent = ReachAgent("desk", tokens="open")
CANCELLED = threading.Event()
STARTED = threading.Event()


@agent.capability("echo")
def echo(text: str) -> str:
    return f"echo {text}"


@agent.capability("book")
def book(text: str, ctx: ReachContext) -> Any:
    """Asks for a date first; the next message of the task (same context) is the date."""
    if "what" not in ctx.state:
        ctx.state["what"] = text
        return ask("Which date?")
    return f"booked {ctx.state.pop('what')} on {text}"


def sleeper(started: threading.Event, cancelled: threading.Event) -> Callable[[str], Awaitable[str]]:
    """A handler that runs 30 s unless cancelled: sets ``started``, then ``cancelled`` when it is."""

    async def slow(text: str) -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    return slow


agent.capability("slow")(sleeper(STARTED, CANCELLED))


@agent.capability("count")
async def count(text: str) -> AsyncIterator[str]:
    for item in ("1", "2", "3"):
        yield item
        await asyncio.sleep(0.5)


@agent.capability("report")
def report(text: str) -> File:
    return File(raw=b"\x00\x01", media_type="application/pdf", filename="r.pdf")


@agent.capability("upload")
def upload(files: list[dict[str, Any]]) -> dict[str, Any]:
    return {"reply_content": f"{len(files)} file(s)", "names": [f["filename"] for f in files]}


@agent.capability("hello")
def hello(text: str) -> Reply:
    return Reply(text="hi there")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with BackgroundServer(agent.app) as server:
        yield server.url


def message(text: str, capability: str, **ids: str) -> dict[str, Any]:
    return {
        "role": "ROLE_USER",
        "messageId": f"m-{time.monotonic_ns()}",
        "parts": [{"text": text}],
        "metadata": {"reach.capability": capability},
        **ids,
    }


def rpc(url: str, method: str, params: Any, headers: dict[str, str] | None = None, path: str = "/a2a") -> Any:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    sent = {"A2A-Version": "1.0", **(headers or {})}
    return httpx.post(url + path, json=body, headers=sent, timeout=WITHIN).json()


def sent(url: str, text: str, capability: str, **ids: str) -> dict[str, Any]:
    answer = rpc(url, "SendMessage", {"message": message(text, capability, **ids)})
    assert "result" in answer, answer
    return answer["result"]["task"]  # type: ignore[no-any-return]


def reason(answer: dict[str, Any]) -> tuple[int, str]:
    """The error's code and the reason of its ErrorInfo."""
    error = answer["error"]
    info = next(d for d in error["data"] if d["@type"] == "type.googleapis.com/google.rpc.ErrorInfo")
    assert info["domain"] == "a2a-protocol.org"
    return error["code"], info["reason"]


def test_a_message_to_a_finished_or_unknown_task_is_refused(url: str) -> None:
    """A terminal task takes no more messages (-32004), an unknown taskId is -32001: neither runs as a new task."""
    task = sent(url, "one", "echo")
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    again = rpc(url, "SendMessage", {"message": message("two", "echo", taskId=task["id"])})
    assert reason(again) == (-32004, "UNSUPPORTED_OPERATION")
    unknown = rpc(url, "SendMessage", {"message": message("two", "echo", taskId="nope")})
    assert reason(unknown) == (-32001, "TASK_NOT_FOUND")


def test_ask_leaves_the_task_input_required_and_the_next_message_continues_it(url: str) -> None:
    """``return ask(...)``: input-required with the question; the next message to the task completes it there."""
    first = sent(url, "a table", "book")
    assert first["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert first["status"]["message"]["parts"] == [{"text": "Which date?"}]
    assert first["status"]["timestamp"].endswith("Z")
    wrong = rpc(url, "SendMessage", {"message": message("x", "book", taskId=first["id"], contextId="other")})
    assert wrong["error"]["code"] == -32602
    follow_up = message("friday", "book", taskId=first["id"])
    del follow_up["metadata"]  # a continued task keeps its capability: the follow-up need not name it
    done = rpc(url, "SendMessage", {"message": follow_up})["result"]["task"]
    assert (done["id"], done["contextId"]) == (first["id"], first["contextId"])
    assert done["status"]["state"] == "TASK_STATE_COMPLETED"
    assert done["artifacts"][-1]["parts"] == [{"text": "booked a table on friday"}]
    full = rpc(url, "GetTask", {"id": first["id"]})["result"]
    assert [m["role"] for m in full["history"]] == ["ROLE_USER", "ROLE_AGENT", "ROLE_USER"]
    assert len(rpc(url, "GetTask", {"id": first["id"], "historyLength": 1})["result"]["history"]) == 1


def test_cancel_reaches_the_running_handler(url: str) -> None:
    """CancelTask of a running task cancels its handler (it sees CancelledError) and answers it canceled."""
    STARTED.clear()
    CANCELLED.clear()
    params = {"message": message("zzz", "slow"), "configuration": {"returnImmediately": True}}
    task = rpc(url, "SendMessage", params)["result"]["task"]
    assert task["status"]["state"] in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING")
    assert STARTED.wait(WITHIN)
    canceled = rpc(url, "CancelTask", {"id": task["id"]})["result"]
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
    assert CANCELLED.wait(WITHIN)
    assert reason(rpc(url, "CancelTask", {"id": task["id"]})) == (-32002, "TASK_NOT_CANCELABLE")


def events(
    url: str, method: str, params: Any, found: list[tuple[float, dict[str, Any]]] | None = None
) -> list[tuple[float, dict[str, Any]]]:
    """A JSON-RPC stream's results, each with the monotonic time it arrived (appended to ``found`` as they come)."""
    body = {"jsonrpc": "2.0", "id": 3, "method": method, "params": params}
    found = [] if found is None else found
    with httpx.stream("POST", url + "/a2a", json=body, headers={"A2A-Version": "1.0"}, timeout=WITHIN) as answer:
        for line in answer.iter_lines():
            if line.startswith("data:"):
                found.append((time.monotonic(), json.loads(line[5:])["result"]))
    return found


def test_a_streaming_handler_streams_each_item_as_it_comes(url: str) -> None:
    """Items produced 0.5 s apart arrive as three artifact updates over >= 0.9 s, not as one at the end."""
    seen = events(url, "SendStreamingMessage", {"message": message("go", "count")})
    assert "task" in seen[0][1]
    chunks = [(at, item["artifactUpdate"]) for at, item in seen if "artifactUpdate" in item]
    assert [c["artifact"]["parts"] for _, c in chunks] == [[{"text": "1"}], [{"text": "2"}], [{"text": "3"}]]
    assert [c["append"] for _, c in chunks] == [False, True, True]
    assert chunks[-1][0] - chunks[0][0] >= 0.9
    assert seen[-1][1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"


def test_file_parts_go_out_and_come_in_and_unaccepted_media_is_refused(url: str) -> None:
    """A returned File is a file part; a file part reaches a handler taking ``files``; elsewhere it is -32005."""
    out = sent(url, "q", "report")["artifacts"][0]["parts"]
    assert out == [{"raw": "AAE=", "mediaType": "application/pdf", "filename": "r.pdf"}]
    part = {"raw": "dGNr", "mediaType": "text/csv", "filename": "a.csv"}
    inbound = message("", "upload")
    inbound["parts"] = [part]
    got = rpc(url, "SendMessage", {"message": inbound})["result"]["task"]["artifacts"][0]["parts"]
    assert got[0] == {"text": "1 file(s)"}
    assert got[1]["data"]["names"] == ["a.csv"]
    inbound["metadata"] = {"reach.capability": "echo"}
    assert reason(rpc(url, "SendMessage", {"message": inbound})) == (-32005, "CONTENT_TYPE_NOT_SUPPORTED")


def test_a_reply_is_a_direct_message_and_not_a_task(url: str) -> None:
    """``return Reply(...)``: SendMessage answers a Message; its stream is that message alone."""
    answer = rpc(url, "SendMessage", {"message": message("hi", "hello")})["result"]
    assert list(answer) == ["message"]
    assert answer["message"]["parts"] == [{"text": "hi there"}]
    assert [list(item) for _, item in events(url, "SendStreamingMessage", {"message": message("hi", "hello")})] == [
        ["message"]
    ]


def test_the_envelope_is_read_strictly_and_the_version_checked(url: str) -> None:
    """Bad jsonrpc / id / method are -32600 (id echoed when valid), A2A-Version 99.0 is -32009, push is -32003."""

    def raw(body: Any, headers: dict[str, str] | None = None) -> Any:
        return httpx.post(url + "/a2a/", json=body, headers=headers or {}, timeout=WITHIN).json()

    assert raw({"jsonrpc": "aaa", "id": 1, "method": "GetTask", "params": {}})["error"]["code"] == -32600
    wrong_id = raw({"jsonrpc": "2.0", "id": {"x": 1}, "method": "GetTask", "params": {}})
    assert (wrong_id["error"]["code"], wrong_id["id"]) == (-32600, None)
    no_method = raw({"jsonrpc": "2.0", "id": 5, "params": {}})
    assert (no_method["error"]["code"], no_method["id"]) == (-32600, 5)
    versioned = raw({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}, {"A2A-Version": "99.0"})
    assert reason(versioned) == (-32009, "VERSION_NOT_SUPPORTED")
    push = rpc(url, "CreateTaskPushNotificationConfig", {"taskId": "x"})
    assert reason(push) == (-32003, "PUSH_NOTIFICATION_NOT_SUPPORTED")
    typed = httpx.post(url + "/a2a", content=b"{}", headers={"Content-Type": "text/plain"}, timeout=WITHIN).json()
    assert reason(typed) == (-32005, "CONTENT_TYPE_NOT_SUPPORTED")


def test_the_card_has_no_0_3_fields_unless_asked_and_is_revalidated_by_etag(url: str) -> None:
    """A 1.0 card without url/protocolVersion/preferredTransport (added for A2A-Version 0.3); ETag -> 304."""
    answer = httpx.get(url + "/.well-known/agent-card.json", timeout=WITHIN)
    card = answer.json()
    assert not {"url", "protocolVersion", "preferredTransport"} & set(card)
    assert {i["protocolBinding"] for i in card["supportedInterfaces"]} == {"JSONRPC", "HTTP+JSON"}
    assert "max-age" in answer.headers["cache-control"] and answer.headers["last-modified"]
    again = httpx.get(url + "/.well-known/agent-card.json", headers={"If-None-Match": answer.headers["etag"]})
    assert again.status_code == 304
    legacy = httpx.get(url + "/.well-known/agent-card.json", headers={"A2A-Version": "0.3"}).json()
    assert legacy["url"] == f"{url}/a2a"


def test_list_tasks_shows_a_tenant_only_its_own_tasks_newest_first_a_page_at_a_time(url: str) -> None:
    """ListTasks: another tenant's tasks never listed; pages of 2 chained by nextPageToken, the last one ""."""
    mine = [
        rpc(url, "SendMessage", {"message": message(str(n), "echo")}, {"X-Tenant": "t-list-a"})["result"]["task"]["id"]
        for n in range(3)
    ]
    rpc(url, "SendMessage", {"message": message("other", "echo")}, {"X-Tenant": "t-list-b"})
    first = rpc(url, "ListTasks", {"pageSize": 2}, {"X-Tenant": "t-list-a"})["result"]
    second = rpc(url, "ListTasks", {"pageSize": 2, "pageToken": first["nextPageToken"]}, {"X-Tenant": "t-list-a"})
    listed = [t["id"] for t in first["tasks"] + second["result"]["tasks"]]
    assert listed == mine[::-1]
    assert (first["totalSize"], second["result"]["nextPageToken"]) == (3, "")
    lean = rpc(url, "ListTasks", {"includeArtifacts": False}, {"X-Tenant": "t-list-a"})["result"]["tasks"]
    assert not [t for t in lean if "artifacts" in t]


def test_subscribe_follows_a_running_task_to_its_end(url: str) -> None:
    """SubscribeToTask: the task first, then its updates until it is canceled; an unknown task is -32001."""
    assert reason(rpc(url, "SubscribeToTask", {"id": "nope"})) == (-32001, "TASK_NOT_FOUND")
    STARTED.clear()
    params = {"message": message("zzz", "slow"), "configuration": {"returnImmediately": True}}
    task = rpc(url, "SendMessage", params)["result"]["task"]
    assert STARTED.wait(WITHIN)
    seen: list[tuple[float, dict[str, Any]]] = []
    follower = threading.Thread(target=events, args=(url, "SubscribeToTask", {"id": task["id"]}, seen))
    follower.start()
    deadline = time.monotonic() + WITHIN
    while not seen:  # the task snapshot: the follower is subscribed
        assert time.monotonic() < deadline, "no first event"
        time.sleep(0.01)
    rpc(url, "CancelTask", {"id": task["id"]})
    follower.join(WITHIN)
    items = [item for _, item in seen]
    assert items[0]["task"]["id"] == task["id"]
    assert items[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_CANCELED"
    assert reason(rpc(url, "SubscribeToTask", {"id": task["id"]})) == (-32004, "UNSUPPORTED_OPERATION")


def test_the_http_json_binding_serves_the_same_tasks(url: str) -> None:
    """POST /a2a/rest/message:send, GET /a2a/rest/tasks/{id}; an unknown task is 404 with an AIP-193 ErrorInfo."""
    sent_ = httpx.post(f"{url}/a2a/rest/message:send", json={"message": message("rest", "echo")}, timeout=WITHIN)
    task = sent_.json()["task"]
    read = httpx.get(f"{url}/a2a/rest/tasks/{task['id']}", timeout=WITHIN).json()
    assert read["artifacts"][0]["parts"] == [{"text": "echo rest"}]
    missing = httpx.get(f"{url}/a2a/rest/tasks/nope", timeout=WITHIN)
    assert missing.status_code == 404
    assert missing.json()["error"]["details"][0]["reason"] == "TASK_NOT_FOUND"


async def test_returning_immediately_cannot_start_more_tasks_than_the_bound() -> None:
    """``returnImmediately`` sends past ``max_running`` running tasks are refused, and none of them runs."""
    server = A2AServer(agent, max_running=2)
    inbound = Inbound(request=None, headers={}, caller=None, body=None)  # type: ignore[arg-type]
    params = {"message": message("zzz", "slow"), "configuration": {"returnImmediately": True}}
    for _ in range(2):
        await server.send({**params, "message": message("zzz", "slow")}, inbound, "1.0", stream=False)
    with pytest.raises(RpcError) as refused:
        await server.send(params, inbound, "1.0", stream=False)
    assert refused.value.code == -32603
    assert len(server.book.table) == 2
    runners = [live.runner for live in server.live.values() if live.runner is not None]
    assert len(runners) == 2
    for runner in runners:
        runner.cancel()
    await asyncio.gather(*runners, return_exceptions=True)


def test_stopping_the_agent_cancels_the_handlers_of_its_running_tasks() -> None:
    """A handler still running when the agent's server stops is cancelled (it sees CancelledError), not orphaned."""
    started, cancelled = threading.Event(), threading.Event()
    stopping = ReachAgent("stopping", tokens="open")
    stopping.capability("wait")(sleeper(started, cancelled))

    with BackgroundServer(stopping.app) as server:
        params = {"message": message("zzz", "wait"), "configuration": {"returnImmediately": True}}
        assert rpc(server.url, "SendMessage", params)["result"]["task"]["status"]["state"] != "TASK_STATE_COMPLETED"
        assert started.wait(WITHIN)
    assert cancelled.wait(WITHIN)
