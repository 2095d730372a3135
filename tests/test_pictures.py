"""`follow` against vLLM 0.33.0's recorded decisions, and the SVG renderer on every golden trace."""
import io
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvref.pictures import follow, progress, step_svg, write_svgs
from kvref.oracle.replay import load_decisions, load_trace

GOLDEN = Path(__file__).parent.parent / "golden" / "traces"
TRACES = sorted(p.name[:-len(".vllm.jsonl")] for p in GOLDEN.glob("*.vllm.jsonl"))


def golden(name):
    return load_trace(GOLDEN / f"{name}.jsonl"), load_decisions(GOLDEN / f"{name}.vllm.jsonl")


@pytest.mark.parametrize("name", TRACES)
def test_follow_agrees_with_vllms_hits_and_evictions(name):
    "Every block vLLM reports as a hit holds the key of the request's block; evicted blocks were free and hashed."
    ops, decisions = golden(name)
    bs, tokens, prev = ops[0]["block_size"], {}, None
    for op, step in zip(ops, follow(ops, decisions)):
        if op["op"] == "add": tokens[op["id"]] = list(op["prompt"])
        if op["op"] == "append": tokens[op["id"]] += op["tokens"]
        if prev is not None:
            for j, b in enumerate(step.hit_blocks):
                # the hit block was hashed, and with exactly the tokens of the request's j-th block
                assert b in prev.cached, (step.index, b)
                assert step.key_tokens[prev.cached[b]] == tuple(tokens[op["id"]][j * bs:(j + 1) * bs])
            for b in step.new_blocks:
                assert b in prev.free_queue, (step.index, b)
                assert (b in prev.cached) == (b in step.evicted)
        held = {b for t in step.tables.values() for b in t}
        assert not held & set(step.free_queue), step.index
        assert set(step.cached) == {b for bs in step.cache_map.values() for b in bs}
        assert 0 not in held | set(step.cached)  # vLLM's null block never holds data
        prev = step


def test_design_doc_time_7():
    ops, decisions = golden("design-doc-example")
    last = list(follow(ops, decisions))[-1]
    assert (last.hit_blocks, last.new_blocks, last.evicted) == ([1, 2, 3], [7, 5, 8, 9, 4], [4])


@pytest.mark.parametrize("name", [n if n in TRACES[:2] else pytest.param(n, marks=pytest.mark.slow) for n in TRACES])
def test_every_step_renders_well_formed_svg(name):
    "Every third step of a recorded trace renders (two traces by default; the rest repeat the same drawing code, slow)."
    ops, decisions = golden(name)
    for step in list(follow(ops, decisions))[::3] + [list(follow(ops, decisions))[-1]]:
        svg = step_svg(step)
        root = ET.fromstring(svg)
        assert root.tag.endswith("svg")
        assert f"op {step.index}:" in svg
        for b in step.evicted: assert f"block {b}" in svg


def test_write_svgs_is_deterministic(tmp_path):
    ops, decisions = golden("design-doc-example")
    a = write_svgs(ops, decisions, tmp_path / "a", token_names=lambda t: chr(65 + t) if t < 26 else str(t))
    b = write_svgs(ops, decisions, tmp_path / "b", token_names=lambda t: chr(65 + t) if t < 26 else str(t))
    assert [p.name for p in a] == [f"step-{i:04d}.svg" for i in range(len(ops))]
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert "[ABCD]" in a[-1].read_text()


def test_progress_bar_only_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self): return True
    tty, pipe = Tty(), io.StringIO()
    assert list(progress(range(5), 5, "svg", stream=tty)) == list(range(5))
    assert list(progress(range(5), 5, "svg", stream=pipe)) == list(range(5))
    assert "5/5" in tty.getvalue() and pipe.getvalue() == ""


def test_mismatched_decisions_are_refused(tmp_path):
    ops, decisions = golden("design-doc-example")
    with pytest.raises(ValueError, match="op 0: trace has 'config'"): list(follow(ops, decisions[1:]))
    with pytest.raises(ValueError, match="13 ops but 12 decisions"): write_svgs(ops, decisions[:-1], tmp_path)


def test_design_doc_behaviour_time_6_and_7_pictures():
    "The design doc's own numbers, replayed with kvref's design_doc behaviour and drawn."
    from kvref.oracle.replay import replay
    ops, _ = golden("design-doc-example")
    steps = list(follow(ops, replay(ops, "design_doc")))
    assert steps[10].free_queue == [7, 8, 9, 4, 3, 2, 6, 5, 1, 0]
    assert (steps[12].hit_blocks, steps[12].new_blocks, steps[12].evicted) == ([0, 1, 2], [7, 8, 9, 4, 3], [3])
    svg = step_svg(steps[12], token_names=lambda t: chr(65 + t) if t < 26 else str(t))
    assert "evicted: block 3" in svg and "[ABCD] -&gt; [0]" in svg


def test_pictures_import_no_other_chapter():
    "Pictures come before the allocator chapters (issue 14): importing them loads only the shared guards (chapter 00)."
    import subprocess, sys
    code = "import sys, kvref.pictures; print(sorted(m for m in sys.modules if m.startswith('kvref.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['kvref.guards', 'kvref.pictures']"


def test_text_is_at_least_11px_and_every_legend_item_is_drawn():
    import re
    from kvref.pictures import FONT_SIZE, rows_svg
    ops, decisions = golden("design-doc-example")
    for svg in (step_svg(list(follow(ops, decisions))[-1]), rows_svg({"q": [1, 2, 3]}, "t", cached=[2])):
        sizes = [float(s) for s in re.findall(r"font-size: ([0-9.]+)px", svg)]
        assert sizes and min(sizes) >= FONT_SIZE == 11
        assert all(label in svg for label in ("hit", "new", "evicted", "holds a hash"))


# chart_svg: the chart primitive other chapters draw their numbers with.
import re as _re

from kvref.pictures import CHART_KINDS, FONT_SIZE, chart_svg


def _font_sizes(svg):
    return [float(s) for s in _re.findall(r"font-size: ?([0-9.]+)px", svg) + _re.findall(r"font: [a-z ]*([0-9.]+)px", svg)]


@pytest.mark.parametrize("kind", CHART_KINDS)
def test_every_chart_kind_draws_its_labels_legibly(kind):
    svg = chart_svg({"hits": [1, 3, 2], "misses": [2, 0, 1]}, x=["op 2", "op 5", "op 9"], title="per op",
                    xlabel="op", ylabel="blocks", kind=kind, marks={"eviction": 1})
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg") and root.get("width") == "684pt"  # 9.5 in: the block pictures' frame
    for text in ("per op", "hits", "misses", "blocks", "eviction"): assert text in svg
    assert _re.findall(r">([^<>]+)</text>", svg)[:3] == ["op 2", "op 5", "op 9"]  # labels as x: one tick per value
    sizes = _font_sizes(svg)
    assert sizes and min(sizes) >= FONT_SIZE


def test_chart_is_deterministic_and_numbers_stand_for_themselves():
    args = ({"lru": [0.1, 0.4, 0.6], "ideal": [0.7, 0.7, 0.7]},)
    kw = dict(x=[256, 512, 1024], logx=True, xlabel="cache blocks", ylabel="hit rate")
    svg = chart_svg(*args, **kw)
    assert svg == chart_svg(*args, **kw)
    texts = _re.findall(r">([^<>]+)</text>", svg)
    assert texts[:3] == ["256", "512", "1024"]  # ticks at the x values, not 2.56e2


def test_chart_inputs_are_refused_by_name():
    with pytest.raises(TypeError, match="series must be a dict"): chart_svg([1, 2])
    with pytest.raises(ValueError, match="kind must be one of 'line'"): chart_svg({"a": [1]}, kind="pie")
    with pytest.raises(TypeError, match="kind must be one of"): chart_svg({"a": [1]}, kind=3)
    with pytest.raises(ValueError, match="series must be lists of one length"): chart_svg({"a": [1, 2], "b": [1]})
    with pytest.raises(ValueError, match="series must be lists of one length"): chart_svg({})
    with pytest.raises(ValueError, match="x must be 2 values"): chart_svg({"a": [1, 2]}, x=[1, 2, 3])
