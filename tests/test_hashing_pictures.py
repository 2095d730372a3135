"""The chapters' figures: chapter 01's hash chain (`chain_svg`) and chapter 04's opening picture, the design doc's
Time 7 as vLLM 0.33.0 decided it (golden/traces/design-doc-example), drawn by kvref.pictures."""
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvref.core.hashing import chain_svg, generate_block_hash_extra_keys, LoRARequest, request_block_hashes

ROOT = Path(__file__).resolve().parents[1]
SVG = "{http://www.w3.org/2000/svg}"


def texts(svg: str) -> list[str]:
    return [t.text for t in ET.fromstring(svg).iter(f"{SVG}text")]


def test_the_worked_example_holds_its_blocks_hashes_and_arrows():
    svg = chain_svg([(0, 1, 2, 3), (4, 5, 6, 7)], ["h0", "h1"], partial=(8, 9))
    root = ET.fromstring(svg)  # well-formed XML
    assert {"NONE_HASH", "0 1 2 3", "4 5 6 7", "h0", "h1", "8 9"} <= set(texts(svg))
    # one arrow from each block's parent hash, one from each block's tokens to its hash
    assert len(list(root.iter(f"{SVG}line"))) == 4
    assert any("no hash yet" in t for t in texts(svg))


def test_extra_keys_and_real_hashes_are_drawn_legibly():
    tokens = list(range(100, 118))
    keys = dict(lora=LoRARequest("sql", "/a"), cache_salt="tenant-a")
    hashes = request_block_hashes(tokens, 4, seed="vllm-none-hash", **keys)
    extra = [generate_block_hash_extra_keys(4 * k, 4 * k + 4, **keys) for k in range(len(hashes))]
    svg = chain_svg([tokens[4 * k:4 * k + 4] for k in range(len(hashes))], [h.hex()[:12] for h in hashes], extra,
                    partial=tokens[16:])
    shown = texts(svg)
    assert [h.hex()[:12] for h in hashes] == [t for t in shown if t in {h.hex()[:12] for h in hashes}]
    assert "cache_salt tenant-a" in shown and shown.count("lora sql /a") == 4  # the salt on block 0 only
    sizes = [int(s) for s in re.findall(r'font-size="(\d+)"', svg)]
    assert sizes and min(sizes) >= 11
    assert int(ET.fromstring(svg).get("width")) <= 1280  # four blocks, a parent and a partial block fit


def test_text_is_escaped_and_a_mismatch_refused():
    svg = chain_svg([(1,)], ["<h&>"], [(("cache_salt", "a<b"),)])
    assert "<h&>" in texts(svg) and "cache_salt a<b" in texts(svg)
    with pytest.raises(ValueError, match="2 blocks but 1 hashes"):
        chain_svg([(1,), (2,)], ["h"])


def test_chapter_04_opens_with_the_golden_time_7():
    pytest.importorskip("matplotlib")
    from kvref.pictures import follow, step_svg
    read = lambda name: [json.loads(line) for line in (ROOT / "golden/traces" / name).read_text().splitlines()]
    time7 = list(follow(read("design-doc-example.jsonl"), read("design-doc-example.vllm.jsonl")))[-1]
    assert (time7.hit_blocks, time7.new_blocks, time7.evicted) == ([1, 2, 3], [7, 5, 8, 9, 4], [4])
    svg = step_svg(time7, title="Time 7")
    assert "req 2" in svg and "evicted: block 4" in svg
