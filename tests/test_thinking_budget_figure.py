"""The thinking budget's timeline figure (chapter 09): what `thinking_timeline` reads off a real run of the holder,
what `thinking_timeline_svg` draws from it, and that the picture committed beside the chapter is still its output.
Regenerate the picture with `KVREF_WRITE_FIGURES=1 python -m pytest tests/test_thinking_budget_figure.py`."""
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvref.sample.thinking_budget import (
    PHASE_COLOURS, ReasoningConfig, ThinkingBudgetStateHolder, greedy_run, thinking_timeline, thinking_timeline_svg,
)

PICTURE = Path(__file__).resolve().parents[1] / "nbs" / "images" / "thinking_budget_timeline.svg"
E3 = ReasoningConfig([100], [200, 201, 202])
WANTS = [50, 100] + [60] * 6 + [50] * 3  # the chapter's example: content, S, a model that would think on, content


def run(config=E3, budget=3, wants=WANTS):
    return greedy_run(ThinkingBudgetStateHolder(config, 4), [], wants, budget)


def texts(svg: str) -> list[str]:
    return [t.text or "" for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]


def test_the_timeline_of_the_chapters_run():
    assert thinking_timeline(*run(), E3, 3) == [
        (50, "answer", None), (100, "thinking", 3), (60, "thinking", 2), (60, "thinking", 1), (60, "thinking", 0),
        (200, "forced end", 0), (201, "forced end", 0), (202, "forced end", None),
        (50, "answer", None), (50, "answer", None), (50, "answer", None)]


@pytest.mark.parametrize("budget", [None, -1, 0, 1, 5])
def test_forced_tokens_are_exactly_the_runs_forced_flags(budget):
    tokens, forced = run(budget=budget)
    phases = [phase for _, phase, _ in thinking_timeline(tokens, forced, E3, budget)]
    assert [p == "forced end" for p in phases] == forced
    assert ("forced end" in phases) == (budget not in (None, -1) and budget < 6)


def test_the_svg_holds_every_column_and_the_legend():
    svg = thinking_timeline_svg(WANTS, run(), E3, 3)
    root = ET.fromstring(svg)
    assert int(root.get("width")) <= 1280 and int(root.get("font-size")) >= 11  # legible at 1280 px
    shown = texts(svg)
    assert "thinking_token_budget=3, S=[100], E=[200, 201, 202]" in shown
    tokens = [str(t) for t in run()[0]]
    assert tokens == ["50", "100", "60", "60", "60", "200", "201", "202", "50", "50", "50"]
    emitted = [t for t in shown if t in set(tokens)]  # wanted and emitted tokens, column by column
    assert emitted == [x for w, t in zip(WANTS, tokens) for x in (str(w), t)]
    assert all(phase in shown for phase in PHASE_COLOURS)
    for phase, fill in PHASE_COLOURS.items(): assert svg.count(f'fill="{fill}"') >= 1


def test_the_committed_picture_is_current():
    svg = thinking_timeline_svg(WANTS, run(), E3, 3) + "\n"
    if os.environ.get("KVREF_WRITE_FIGURES"): PICTURE.write_text(svg)
    assert PICTURE.read_text() == svg, "regenerate it (see this file's docstring)"
