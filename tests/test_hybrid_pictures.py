"""The hybrid chapter's opening figure: one request's block tables per group, read from a vLLM-recorded trace
(`recorded_steps`, `recorded_rows`) and drawn as SVG (`table_rows_svg`, which `group_tables_svg` draws through)."""
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from kvref.core.hybrid import (FullAttentionSpec, HybridKVCacheManager, HybridRequest, SlidingWindowSpec, group_tables_svg,
                               recorded_rows, recorded_steps, table_rows_svg)

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "hybrid"
SVG = "{http://www.w3.org/2000/svg}"


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def gpt_oss_r4():
    return recorded_steps(read(GOLDEN / "hybrid-gpt-oss-11-1.jsonl"), read(GOLDEN / "hybrid-gpt-oss-11-1.vllm.jsonl"), "r4")


def test_recorded_steps_are_the_tables_vllm_recorded_after_each_step():
    steps = gpt_oss_r4()
    assert [tokens for tokens, _ in steps] == [8, 11, 12, 13, 14, 15, 16, 17, 18, 19, 21, 22, 25]
    assert steps[1] == (11, [[17, 4, 9, 22, 27, 28], [23, 24, 25, 26, 29, 30]])
    assert steps[2] == (12, [[0, 0, 9, 22, 27, 28], [23, 24, 25, 26, 29, 30]])  # window 8: tokens 0-3 out, 17 and 4 freed


def test_a_preempted_request_counts_its_tokens_again_from_zero():
    ops = [{"op": "schedule", "id": "r"}, {"op": "preempt", "id": "r"}, {"op": "schedule", "id": "r"}]
    decisions = [{"allocated": True, "hit_tokens": 0, "num_new_tokens": 8, "block_ids": [[1, 2]]}, {},
                 {"allocated": True, "hit_tokens": 4, "num_new_tokens": 2, "block_ids": [[1, 3]]}]
    assert recorded_steps(ops, decisions, "r") == [(8, [[1, 2]]), (6, [[1, 3]])]


def test_recorded_rows_mark_new_and_freed_blocks_per_group():
    rows = recorded_rows(gpt_oss_r4()[:3], ["sliding", "full"])
    assert [label for label, *_ in rows] == ["8 tokens · sliding", "8 tokens · full", "11 tokens · sliding",
                                             "11 tokens · full", "12 tokens · sliding", "12 tokens · full"]
    assert rows[2][2:] == ([27, 28], [])      # two new window blocks
    assert rows[4][2:] == ([], [17, 4])       # the window slid: two blocks back to the pool
    assert rows[5][2:] == ([], [])            # full attention never frees


def test_the_figure_holds_every_block_legibly():
    rows = recorded_rows(gpt_oss_r4()[:8], ["sliding 8", "full"])
    svg = table_rows_svg(rows)
    root = ET.fromstring(svg)  # well-formed
    assert int(root.get("font-size")) >= 11 and int(root.get("width")) <= 1280
    texts = [t.text for t in root.iter(SVG + "text")]
    assert "freed 17 4" in texts and "freed 9" in texts and "12 tokens · sliding 8" in texts
    drawn = [int(t) for t in texts if t.isdigit()]
    assert drawn == [b for _, ids, *_ in rows for b in ids]  # every block of every row, in order
    green = [r for r in root.iter(SVG + "rect") if r.get("stroke") == "#1a7f37"]
    assert len(green) == sum(len(new) for _, _, new, _ in rows)
    grey = [r for r in root.iter(SVG + "rect") if r.get("fill") == "#ddd"]
    assert len(grey) == sum(ids.count(0) for _, ids, *_ in rows)


def test_group_tables_svg_keeps_the_size_the_replay_pictures_read():
    m = HybridKVCacheManager([SlidingWindowSpec(4, 8), FullAttentionSpec(4)], 20)
    m.allocate_slots(HybridRequest("a", list(range(10))), 10)
    svg = group_tables_svg(m, ["a"])
    width, height = map(int, re.search(r'width="(\d+)" height="(\d+)"', svg).groups())
    assert (width, height) == (190 + 30 * 3, 8 + 30 * 2)
    assert [t.text for t in ET.fromstring(svg).iter(SVG + "text")] == ["a · SlidingWindow 0", "1", "2", "3",
                                                                       "a · FullAttention 1", "4", "5", "6"]
