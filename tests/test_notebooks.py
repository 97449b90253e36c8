"""Every notebook runs top to bottom offline in under a minute and shows what it promises.

Each notebook ends with a ``SUMMARY {json}`` line; the tests read it, and the
figures, from the executed notebook. Figures use the inline backend (PNG
outputs), whatever ``MPLBACKEND`` the test run has. Before a notebook runs, a
cell is put in front that records what every ``plt.show()`` draws (each axes'
lines, bars and limits), and one at the end prints it: a figure is checked by
its data, not only by its PNG being there.
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
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

RECORD_FIGURES = textwrap.dedent(
    """
    import json as _json
    import matplotlib.pyplot as _plt

    _FIGURES, _show = [], _plt.show


    def _drawn(axis):
        lines = [line for line in axis.get_lines() if line.get_transform() is axis.transData]
        return {
            "xlabel": axis.get_xlabel(),
            "xlim": [float(v) for v in axis.get_xlim()],
            "lines": [[[float(v) for v in line.get_xdata()], [float(v) for v in line.get_ydata()]] for line in lines],
            "bars": [[float(p.get_x()), float(p.get_width()), float(p.get_height())] for p in axis.patches],
        }


    def _recording_show(*args, **kwargs):
        _FIGURES.extend([_drawn(axis) for axis in _plt.figure(n).axes] for n in _plt.get_fignums())
        return _show(*args, **kwargs)


    _plt.show = _recording_show
    """
)
PRINT_FIGURES = 'print("FIGURES " + _json.dumps(_FIGURES))'
UNITS = {"millisecond": 1000.0, "second": 1.0}
"""Time units an x axis may be labelled in, per second (the first found in its label counts)."""


@pytest.fixture(scope="module")
def executed() -> Iterator[dict[str, tuple[nbformat.NotebookNode, float]]]:
    """Each notebook executed once in a fresh kernel, with how long it took."""
    results = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        for name in NAMES:
            notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
            notebook.cells.insert(0, nbformat.v4.new_code_cell(RECORD_FIGURES))
            notebook.cells.append(nbformat.v4.new_code_cell(PRINT_FIGURES))
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


def drawn(notebook: nbformat.NotebookNode) -> list[list[dict[str, Any]]]:
    """What each shown figure drew: per axes, its x label and limits, its data lines and its bars."""
    text = "".join(output.get("text", "") for output in outputs(notebook) if output["output_type"] == "stream")
    line = next(line for line in text.splitlines() if line.startswith("FIGURES "))
    found: list[list[dict[str, Any]]] = json.loads(line.removeprefix("FIGURES "))
    return found


def degenerate(axes: dict[str, Any], seconds: float) -> list[str]:
    """Why one axes shows nothing worth looking at (empty: it is fine); ``seconds`` is how long the notebook ran."""
    lines, bars = axes["lines"], axes["bars"]
    problems = [] if lines or bars else ["no data"]
    if lines and not any(len(set(ys)) > 1 for _, ys in lines):
        problems.append("every line stays at one value")
    if bars and not any(width and height for _, width, height in bars):
        problems.append("every bar is empty")
    unit = next((per for word, per in UNITS.items() if word in axes["xlabel"]), None)
    if unit is not None:
        xs = [x for xs, _ in lines for x in xs] + [x for left, width, _ in bars for x in (left, left + width)]
        low, high = axes["xlim"]
        if not all(math.isfinite(x) and -0.5 * unit <= x <= seconds * unit for x in xs):
            problems.append(f"x data outside the run (0 .. {seconds:.1f} s)")
        if high - low > 1.1 * seconds * unit:  # matplotlib pads 5 % on each side
            problems.append(f"x axis spans {high - low:g}, more than the run ({seconds:.1f} s)")
    return problems


@pytest.mark.parametrize("name", NAMES)
def test_every_figure_shows_data_within_the_run(
    executed: dict[str, tuple[nbformat.NotebookNode, float]], name: str
) -> None:
    """Each shown figure has data, not all one value, and a time axis no longer than the notebook's run."""
    notebook, seconds = executed[name]
    shown = drawn(notebook)
    assert len(shown) == figures(notebook)
    problems = [(number, index, degenerate(axes, seconds)) for number, figure in enumerate(shown)
                for index, axes in enumerate(figure)]  # fmt: skip
    assert [problem for problem in problems if problem[2]] == []


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
    assert result["before_kill"] >= 0.95
    assert result["during_outage"] <= 0.2
    assert result["after_recovery"] is not None, "orders-0's breaker never closed again after the outage"
    before = result["windows"]["before_kill"]
    for name in ("after_kill", "after_recovery"):  # as good as before the kill, within the binomial's spread
        window = result["windows"][name]
        failed, allowed = window["calls"] - window["ok"], recovery_allowance(before, window["calls"])
        assert failed <= allowed, f"{name}: {failed} of {window['calls']} calls failed; at most {allowed} expected"
    assert result["opened"] == ["orders-0", "orders-1"] and "orders-0" in result["closed_again"]
    metrics = result["metrics"]
    assert metrics["requests"] >= 200 and metrics["opened"] == result["opened"]
    assert metrics["outcomes"]["not_delivered"] >= 1 and metrics["outcomes"]["success"] >= 100
    assert figures(notebook) == 2


def recovery_allowance(before: dict[str, int], calls: int, *, tail: float = 1e-3) -> int:
    """How many of ``calls`` may fail (after the kill, after recovery), were they as likely to fail as before it.

    The failure rate before the kill, with Laplace's rule so that no failure seen there is not a zero
    rate, gives a binomial over ``calls``; the allowance is its quantile leaving ``tail`` above it.
    """
    rate = (before["calls"] - before["ok"] + 1) / (before["calls"] + 2)
    total = 0.0
    for failures in range(calls + 1):
        total += math.comb(calls, failures) * rate**failures * (1 - rate) ** (calls - failures)
        if total >= 1 - tail:
            return failures
    return calls


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
