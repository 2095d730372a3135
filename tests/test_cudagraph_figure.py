"""The CUDA graph dispatch picture (chapter 10): `dispatch_table` is the dispatcher's own decision, the SVG shows
every row legibly, and the picture committed beside the chapter is still its output. Regenerate the picture with
`KVREF_WRITE_FIGURES=1 python -m pytest tests/test_cudagraph_figure.py`."""
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvref.compilation.cudagraph import MODE_COLOURS, CudagraphDispatcher, dispatch_table, dispatch_table_svg

PICTURE = Path(__file__).resolve().parents[1] / "nbs" / "images" / "cudagraph_dispatch.svg"
BATCHES = [(3, True), (3, False), (8, True), (6, False), (9, False)]  # the chapter's worked example


def dispatcher(mode="FULL_AND_PIECEWISE", sizes=(1, 2, 4, 8), max_num_seqs=8):
    d = CudagraphDispatcher(list(sizes), max_num_seqs)
    d.initialize_cudagraph_keys(mode)
    return d


def texts(svg: str) -> list[str]:
    return [t.text or "" for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]


def test_the_worked_example():
    rows = [(n, u, mode, key.num_tokens, key.num_reqs, key.uniform) for n, u, mode, key in dispatch_table(dispatcher(), BATCHES)]
    assert rows == [(3, True, "FULL", 4, 4, True), (3, False, "PIECEWISE", 4, None, False), (8, True, "FULL", 8, 8, True),
                    (6, False, "PIECEWISE", 8, None, False), (9, False, "NONE", 9, None, False)]


@pytest.mark.parametrize("mode", ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_rows_are_the_dispatchers_decisions(mode):
    d = dispatcher(mode)
    batches = [(n, u) for n in range(1, 11) for u in (False, True) if not u or n <= 8]
    assert [(m, key) for _, _, m, key in dispatch_table(d, batches)] == \
           [(m.name, key) for m, key in (d.dispatch(n, uniform_decode=u) for n, u in batches)]


def test_the_svg_shows_every_batch_and_mode():
    svg = dispatch_table_svg(dispatcher(), BATCHES)
    root = ET.fromstring(svg)
    assert int(root.get("width")) <= 1280 and int(root.get("font-size")) >= 11  # legible at 1280 px
    shown = texts(svg)
    assert "cudagraph_mode=FULL_AND_PIECEWISE, capture sizes [1, 2, 4, 8], max_num_seqs=8" in shown
    assert [t for t in shown if t in MODE_COLOURS] == ["FULL", "PIECEWISE", "FULL", "PIECEWISE", "NONE"]
    for wanted in ["3 tokens, uniform decode", "(4 tokens, 4 requests, uniform)", "(4 tokens), attention eager",
                   "(8 tokens, 8 requests, uniform)", "eager, 9 tokens unpadded"]:
        assert wanted in shown


def test_the_committed_picture_is_current():
    svg = dispatch_table_svg(dispatcher(), BATCHES) + "\n"
    if os.environ.get("KVREF_WRITE_FIGURES"): PICTURE.write_text(svg)
    assert PICTURE.read_text() == svg, "regenerate it (see this file's docstring)"
