"""Every notebook runs top to bottom offline in under a minute and shows what it promises.

Each notebook ends with a ``SUMMARY {json}`` line; the tests read it, and the
figures, from the executed notebook. Figures use the inline backend (PNG
outputs), whatever ``MPLBACKEND`` the test run has.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NAMES = ["01_quickstart", "02_multi_agent_chain", "03_failure_drill", "04_llamaindex_and_dify"]
LIMIT_SECONDS = 60


@pytest.fixture(scope="module")
def executed() -> Iterator[dict[str, tuple[nbformat.NotebookNode, float]]]:
    """Each notebook executed once in a fresh kernel, with how long it took."""
    results = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        for name in NAMES:
            notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
            client = NotebookClient(
                notebook, timeout=LIMIT_SECONDS, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
            )
            started = time.perf_counter()
            client.execute()
            results[name] = (notebook, time.perf_counter() - started)
    yield results


def outputs(notebook: nbformat.NotebookNode) -> list[dict[str, Any]]:
    return [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])]


def summary(notebook: nbformat.NotebookNode) -> dict[str, Any]:
    """The ``SUMMARY`` line the last cell prints."""
    text = "".join(output.get("text", "") for output in outputs(notebook) if output["output_type"] == "stream")
    line = next(line for line in text.splitlines() if line.startswith("SUMMARY "))
    result: dict[str, Any] = json.loads(line.removeprefix("SUMMARY "))
    return result


def figures(notebook: nbformat.NotebookNode) -> int:
    return sum(1 for output in outputs(notebook) if "image/png" in output.get("data", {}))


@pytest.mark.parametrize("name", NAMES)
def test_runs_clean_and_fast(executed: dict[str, tuple[nbformat.NotebookNode, float]], name: str) -> None:
    """The notebook ran without an error output, in under a minute."""
    notebook, seconds = executed[name]
    assert not [output for output in outputs(notebook) if output["output_type"] == "error"]
    assert seconds < LIMIT_SECONDS


def test_quickstart(executed: dict[str, tuple[nbformat.NotebookNode, float]]) -> None:
    """Each tool reaches its capability; after the pinned instance dies the conversation moves with its context."""
    result = summary(executed["01_quickstart"][0])
    capabilities = [capability for capability, _ in result["routes"]]
    assert capabilities == ["query_order", "check_inventory", "search_knowledge", "query_order"]
    assert result["routes"][0][1] == result["killed"] != result["routes"][-1][1]
    assert result["context_restore"] is True


def test_multi_agent_chain_is_one_trace_drawn_as_a_waterfall(
    executed: dict[str, tuple[nbformat.NotebookNode, float]],
) -> None:
    """Spans from the notebook and three agent processes form one trace, nested in chain order, and a figure."""
    notebook = executed["02_multi_agent_chain"][0]
    result = summary(notebook)
    assert result["status"] == "success" and result["traces"] == 1 and result["roots"] == 1
    assert result["services"] == ["desk", "inventory", "notebook", "orders"]
    assert result["server_spans"] == ["desk", "orders", "inventory"]
    assert figures(notebook) == 1


def test_failure_drill_drops_then_recovers(executed: dict[str, tuple[nbformat.NotebookNode, float]]) -> None:
    """Losing one instance costs nothing; the outage drops success near zero, then recovers; metrics show the same."""
    notebook = executed["03_failure_drill"][0]
    result = summary(notebook)
    assert result["before_kill"] >= 0.95 and result["after_kill"] >= 0.9
    assert result["during_outage"] <= 0.2
    assert result["after_recovery"] >= 0.8
    assert result["opened"] == ["orders-0", "orders-1"] and "orders-0" in result["closed_again"]
    metrics = result["metrics"]
    assert metrics["requests"] >= 200 and metrics["opened"] == result["opened"]
    assert metrics["outcomes"]["not_delivered"] >= 1 and metrics["outcomes"]["success"] >= 100
    assert figures(notebook) == 2


def test_llamaindex_and_dify(executed: dict[str, tuple[nbformat.NotebookNode, float]]) -> None:
    """LlamaIndex keeps one conversation on one instance and reports errors as text; Dify's hook reaches or declines."""
    result = summary(executed["04_llamaindex_and_dify"][0])
    answers = result["llama_answers"]
    assert '"on_hand": 12' in answers[1] and '"asked_in_this_conversation": ["A1001", "A1002"]' in answers[2]
    assert "there is no order Z9" in answers[3]
    assert len(result["llama_instances"]) == 1
    first, second, declined, closed = result["dify"]
    assert first["ok"] and second["ok"] and first["instance"] == second["instance"]
    assert declined is None and closed == {"ok": False, "instance": None}
    assert {"dify.tool query_order", "execute_tool lookup_order", "reach.agent query_order"} <= set(
        result["span_names"]
    )


def test_notebooks_match_their_cell_sources() -> None:
    """The committed notebooks are what build_notebooks.py writes from the cells_*.py sources."""
    sys.path.insert(0, str(NOTEBOOKS))
    try:
        from build_notebooks import NOTEBOOKS as SOURCES
        from build_notebooks import build
    finally:
        sys.path.remove(str(NOTEBOOKS))
    assert sorted(SOURCES) == NAMES
    for name, cells in SOURCES.items():
        committed = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        assert [cell.source for cell in committed.cells] == [cell.source for cell in build(cells).cells], name
