"""The book's cell sizes: each chapter's exported code reads in small cells (median at most 10 lines, none over 30).

Lines are counted without blank lines and `#|` directives. The limits are the ones the book set itself (issue 14);
a chapter that grows a long cell fails here rather than drifting unnoticed.
"""
import json
import statistics
from pathlib import Path

import pytest

NBS = Path(__file__).resolve().parents[1] / "nbs"
MEDIAN, LONGEST = 10, 30


def exported_cell_sizes(notebook: Path) -> list[int]:
    "Lines of code in each `#| export` cell of a notebook."
    sizes = []
    for cell in json.loads(notebook.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and source.lstrip().startswith("#| export"):
            sizes.append(sum(1 for line in source.splitlines() if line.strip() and not line.startswith("#|")))
    return sizes


CHAPTERS = [p for p in sorted(NBS.glob("*.ipynb")) if exported_cell_sizes(p)]


@pytest.mark.parametrize("notebook", CHAPTERS, ids=lambda p: p.stem)
def test_exported_cells_are_small(notebook):
    sizes = exported_cell_sizes(notebook)
    assert statistics.median(sizes) <= MEDIAN and max(sizes) <= LONGEST, (statistics.median(sizes), max(sizes))


def test_a_long_cell_is_noticed(tmp_path):
    "A planted 31-line exported cell fails the check."
    cell = {"cell_type": "code", "source": ["#| export\n"] + [f"x{i} = {i}\n" for i in range(31)]}
    (tmp_path / "nb.ipynb").write_text(json.dumps({"cells": [cell]}))
    assert max(exported_cell_sizes(tmp_path / "nb.ipynb")) > LONGEST
