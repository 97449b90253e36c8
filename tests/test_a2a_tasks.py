"""The A2A task table on a fake clock: the lifecycle's moves, continuity rules, history, listing (sans-IO)."""

from __future__ import annotations

import pytest

from reach_plugins.agent.a2a_rpc import INVALID_PARAMS, TASK_NOT_FOUND, UNSUPPORTED, RpcError
from reach_plugins.agent.a2a_tasks import Task, TaskBook, stamp
from reach_plugins.stores.budget import Budget
from reach_plugins.testing.clock import FakeClock


def book_with(clock: FakeClock, *states: str, tenant: str = "acme") -> tuple[TaskBook, list[Task]]:
    book = TaskBook(Budget(max_entries=100, max_bytes=1 << 20))
    tasks = []
    for n, state in enumerate(states):
        task = Task(f"t{n}", f"c{n % 2}", "echo", "submitted", clock.now())
        if state != "submitted":
            task.move("working", clock.now())
            task.move(state, clock.now())
        book.keep(tenant, task)
        tasks.append(task)
        clock.advance(1.0)
    return book, tasks


def test_the_lifecycle_takes_only_the_moves_of_its_table() -> None:
    """submitted -> working -> input-required -> working -> completed; nothing leaves a terminal state."""
    clock = FakeClock()
    task = Task("t", "c", "book", "submitted", clock.now())
    for state in ("working", "input-required", "working", "completed"):
        clock.advance(2.0)
        task.move(state, clock.now(), {"role": "ROLE_AGENT", "parts": [{"text": state}]})
    assert task.status("1.0") == {
        "state": "TASK_STATE_COMPLETED",
        "timestamp": stamp(clock.now()),
        "message": {"role": "ROLE_AGENT", "parts": [{"text": "completed"}]},
    }
    assert len(task.history) == 4
    with pytest.raises(ValueError, match="no move from 'completed' to 'working'"):
        task.move("working", clock.now())


def test_a_message_may_continue_only_a_waiting_task_of_its_own_context_and_tenant() -> None:
    """Unknown or another tenant's: -32001; terminal or running: -32004; another contextId: -32602."""
    clock = FakeClock()
    book, (_, waiting, _) = book_with(clock, "completed", "input-required", "submitted")
    assert book.continued("acme", "t1", "c1") is waiting
    expected = [
        (("acme", "nope", None), TASK_NOT_FOUND),
        (("beta", "t1", None), TASK_NOT_FOUND),
        (("acme", "t0", None), UNSUPPORTED),
        (("acme", "t2", None), UNSUPPORTED),
        (("acme", "t1", "c0"), INVALID_PARAMS),
    ]
    for args, code in expected:
        with pytest.raises(RpcError) as refused:
            book.continued(*args)
        assert refused.value.code == code, args


def test_listing_is_newest_first_filtered_and_paged_to_an_empty_last_token() -> None:
    """ListTasks: by status time descending, contextId and status filters, pages chained, the last token ""."""
    clock = FakeClock()
    book, _ = book_with(clock, "completed", "completed", "input-required", "completed", "failed")
    every = book.listed("acme", {"pageSize": 2}, "1.0")
    assert [t["id"] for t in every["tasks"]] == ["t4", "t3"]
    rest = book.listed("acme", {"pageSize": 2, "pageToken": every["nextPageToken"]}, "1.0")
    last = book.listed("acme", {"pageSize": 2, "pageToken": rest["nextPageToken"]}, "1.0")
    assert [t["id"] for t in rest["tasks"] + last["tasks"]] == ["t2", "t1", "t0"]
    assert last["nextPageToken"] == ""
    in_c0 = book.listed("acme", {"contextId": "c0", "status": "TASK_STATE_COMPLETED"}, "1.0")
    assert [t["id"] for t in in_c0["tasks"]] == ["t0"]
    assert book.listed("beta", {}, "1.0")["tasks"] == []
    with pytest.raises(RpcError):
        book.listed("acme", {"pageSize": 0}, "1.0")


def test_history_length_keeps_the_last_messages_and_zero_none() -> None:
    """historyLength n: the last n messages; 0: no history member at all."""
    clock = FakeClock()
    task = Task("t", "c", "book", "submitted", clock.now())
    task.history.extend({"role": "ROLE_USER", "messageId": str(n), "parts": [{"text": str(n)}]} for n in range(3))
    assert [m["messageId"] for m in task.shaped("1.0", history=2)["history"]] == ["1", "2"]
    assert "history" not in task.shaped("1.0", history=0)
    assert task.shaped("0.3")["history"][0]["role"] == "user"
