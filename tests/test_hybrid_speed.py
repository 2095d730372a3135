"""The hybrid chapter's shortcuts (`_checked_step`, `remove_skipped_blocks`, the coordinator's `cache_blocks`) against
the plain definitions they fall through to: every recorded hybrid and Mamba trace, and random workloads on random
group mixes, replayed both ways, decision by decision."""
import json
import math
import random
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

import kvref.core.mamba  # noqa: F401  registers the Mamba kind
from kvref.core import hybrid
from kvref.core.hybrid import (FullAttentionSpec, HybridKVCacheCoordinator, HybridKVCacheManager, HybridRequest,
                          SingleTypeKVCacheManager, SlidingWindowSpec)
from kvref.oracle.hybrid_replay import HybridTraceReplayer

ROOT = Path(__file__).resolve().parent.parent / "golden" / "hybrid"
TRACES = sorted(p for p in [*ROOT.glob("*.jsonl"), *ROOT.glob("mamba/*.jsonl")] if not p.name.endswith(".vllm.jsonl"))
SHORTCUTS = [(HybridKVCacheManager, "_checked_step", hybrid._checked_step_plain),
             (SingleTypeKVCacheManager, "remove_skipped_blocks", hybrid._remove_skipped_blocks_plain),
             (HybridKVCacheCoordinator, "cache_blocks", hybrid._coordinator_cache_blocks_plain)]


@contextmanager
def plain_definitions():
    "Run with the shortcuts removed: each method is its plain definition again."
    saved = [(cls, name, getattr(cls, name)) for cls, name, _ in SHORTCUTS]
    try:
        for cls, name, plain in SHORTCUTS: setattr(cls, name, plain)
        yield
    finally:
        for cls, name, method in saved: setattr(cls, name, method)


def replay(ops: list[dict]) -> list[dict]:
    replayer = HybridTraceReplayer()
    return [replayer.apply(op) for op in ops]


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_shortcuts_are_installed():
    for cls, name, plain in SHORTCUTS: assert getattr(cls, name) is not plain, f"{cls.__name__}.{name}"


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_recorded_traces_decide_alike_with_and_without_shortcuts(trace):
    ops = read(trace)
    with plain_definitions(): plain = replay(ops)
    assert replay(ops) == plain


GROUPS = [{"kind": "full", "block_size": 4}, {"kind": "full", "block_size": 8},
          {"kind": "sliding_window", "block_size": 4, "sliding_window": 9},
          {"kind": "sliding_window", "block_size": 4, "sliding_window": 24},
          {"kind": "chunked_local", "block_size": 8, "attention_chunk_size": 16},
          {"kind": "mamba", "block_size": 8, "checkpoint_alignment": None},
          {"kind": "mamba", "block_size": 8, "checkpoint_alignment": 1}]


def random_trace(seed: int) -> list[dict]:
    "A random group mix and a workload on it, built by replaying as it goes so every op is valid."
    rng = random.Random(seed)
    groups = rng.sample(GROUPS, rng.randint(1, 4))
    if any(g["kind"] == "mamba" for g in groups): groups = [g for g in groups if g["kind"] != "chunked_local"]
    mamba = any(g["kind"] == "mamba" for g in groups)
    lcm = math.lcm(*(g["block_size"] for g in groups))
    retained = any(g["kind"] in ("sliding_window", "mamba") for g in groups)
    config = {"op": "config", "groups": groups, "num_blocks": rng.randint(8, 60), "full_sequence_must_fit": rng.random() < 0.5,
              "retention_interval": rng.choice([None, 0, lcm, 2 * lcm] if retained else [None, 0]),
              "prefix_match_unit": rng.choice([None, 2]) if mamba else None, "max_in_flight_tokens": rng.choice([None, 8, 32])}
    ops, replayer = [config], HybridTraceReplayer()
    replayer.apply(config)
    for n in range(120):
        kind, live = rng.choices(["add", "schedule", "append", "preempt", "free", "new_step"], [3, 8, 4, 1, 2, 3])[0], sorted(replayer.requests)
        running = [rid for rid in live if replayer.requests[rid].num_computed_tokens]
        if kind == "add": op = {"op": "add", "id": f"r{n}", "prompt": [rng.randrange(3) * 7 + i % 5 for i in range(rng.randint(1, 40))]}
        elif kind == "schedule" and live:
            rid = rng.choice(live); r = replayer.requests[rid]
            if r.num_computed_tokens == r.num_tokens: continue
            op = {"op": "schedule", "id": rid, "budget": rng.randint(1, 24)}
        elif kind == "append" and running:
            rid = rng.choice(running)
            if replayer.requests[rid].num_computed_tokens < replayer.requests[rid].num_tokens: continue
            op = {"op": "append", "id": rid, "tokens": [rng.randrange(40)]}
        elif kind in ("preempt", "free") and (running if kind == "preempt" else live):
            op = {"op": kind, "id": rng.choice(running if kind == "preempt" else live)}
        elif kind == "new_step": op = {"op": "new_step"}
        else: continue
        replayer.apply(op); ops.append(op)
    return ops


@settings(max_examples=80)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_workloads_decide_alike_with_and_without_shortcuts(seed):
    ops = random_trace(seed)
    with plain_definitions(): plain = replay(ops)
    assert replay(ops) == plain


@settings(max_examples=200)
@given(num_new=st.sampled_from([-1, 0, 1, 5, 9, 12, True]), num_hit=st.sampled_from([-1, 0, 4, False]), hits=st.sampled_from(["none", "empty", "one", "short"]),
       gate=st.sampled_from([False, True, 1]), computed=st.integers(0, 9), max_model_len=st.sampled_from([6, 64]))
def test_checked_step_shortcut_equals_plain(num_new, num_hit, hits, gate, computed, max_model_len):
    "Every argument mix: the same hits, or the same error, with the shortcut as with the plain definition."
    m = HybridKVCacheManager([SlidingWindowSpec(4, 8), FullAttentionSpec(4)], 20, max_model_len=max_model_len)
    r = HybridRequest("r", list(range(9)))
    r.num_computed_tokens = computed
    blocks = {"none": None, "empty": [[], []], "one": [[], [m.block_pool.blocks[1]]], "short": [[]]}[hits]

    def outcome(checked_step):
        try: return "ok", [list(h) for h in checked_step(m, r, num_new, num_hit, blocks, gate)]
        except (ValueError, TypeError) as e: return type(e).__name__, str(e)
    assert outcome(HybridKVCacheManager._checked_step) == outcome(hybrid._checked_step_plain)
