"""Write the demo notebooks from the cell sources in ``cells_*.py`` (run after editing those).

    python notebooks/build_notebooks.py

The notebooks are committed unexecuted; ``tests/test_notebooks.py`` executes
them and checks what they show.
"""

from pathlib import Path

import cells_01_quickstart
import cells_02_multi_agent_chain
import cells_03_failure_drill
import cells_04_llamaindex_and_dify
import nbformat

HERE = Path(__file__).resolve().parent
NOTEBOOKS = {
    "01_quickstart": cells_01_quickstart.CELLS,
    "02_multi_agent_chain": cells_02_multi_agent_chain.CELLS,
    "03_failure_drill": cells_03_failure_drill.CELLS,
    "04_llamaindex_and_dify": cells_04_llamaindex_and_dify.CELLS,
}


def build(cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    """A notebook from ``(kind, source)`` pairs, kind ``md`` or ``code``."""
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.metadata["language_info"] = {"name": "python"}
    for number, (kind, source) in enumerate(cells):
        text = source.strip("\n")
        cell = nbformat.v4.new_markdown_cell(text) if kind == "md" else nbformat.v4.new_code_cell(text)
        cell["id"] = f"cell-{number}"
        notebook.cells.append(cell)
    return notebook


def main() -> None:
    for name, cells in NOTEBOOKS.items():
        nbformat.write(build(cells), HERE / f"{name}.ipynb")
        print(f"wrote notebooks/{name}.ipynb ({len(cells)} cells)")


if __name__ == "__main__":
    main()
