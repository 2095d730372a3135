"""Hybrid KV cache groups: every recorded vLLM 0.33 hybrid trace decision by decision, and the single-group case of
the hybrid machinery against the KV cache manager on every single-group trace."""
import json
from pathlib import Path

import pytest

from kvref.hybrid import FullAttentionSpec, HybridKVCacheManager, HybridTraceReplayer, replay_hybrid

ROOT = Path(__file__).resolve().parent.parent / "golden"
ATTENTION = sorted(p for p in (ROOT / "hybrid").glob("*.jsonl") if not p.name.endswith(".vllm.jsonl"))
SINGLE = sorted(p for p in (ROOT / "traces").glob("*.jsonl") if not p.name.endswith(".vllm.jsonl"))


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def decisions_of(trace: Path) -> list[dict]:
    return read(trace.with_name(trace.stem + ".vllm.jsonl"))


def test_golden_hybrid_traces_are_present():
    assert {p.stem for p in ATTENTION} == {"hybrid-gemma3-11-0", "hybrid-gpt-oss-11-1", "hybrid-llama4-11-2",
                                          "hybrid-gemma4-11-3", "hybrid-two-windows-11-4", "hybrid-sw-chunked-11-5"}


@pytest.mark.parametrize("trace", ATTENTION, ids=lambda p: p.stem)
def test_every_vllm_hybrid_decision_reproduced(trace):
    ops, want = read(trace), decisions_of(trace)
    replayer = HybridTraceReplayer()
    for i, (op, w) in enumerate(zip(ops, want, strict=True)):
        got = replayer.apply(op)
        assert got == w, f"op {i}: {op}"
        assert list(got) == list(w), "keys in the recorded order"


def as_one_group(op: dict) -> dict:
    "A single-group trace op in the hybrid format (one full-attention group)."
    if op["op"] != "config": return op
    config = {k: v for k, v in op.items() if k not in ("block_size", "version")}
    if config.get("max_model_len") is None: config.pop("max_model_len", None)
    return {**config, "groups": [{"kind": "full", "block_size": op["block_size"]}]}


@pytest.mark.parametrize("trace", SINGLE, ids=lambda p: p.stem)
def test_one_full_attention_group_is_the_kv_cache_manager(trace):
    "The hybrid machinery with one full-attention group makes every decision the single-group manager made."
    ops, want = read(trace), decisions_of(trace)
    got = replay_hybrid([as_one_group(op) for op in ops])
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        g = {k: (v[0] if k == "block_ids" else v) for k, v in g.items() if k != "shared_prefix_boundary"}
        assert g == w, f"op {i}: {ops[i]}"
