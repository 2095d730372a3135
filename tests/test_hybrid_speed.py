"""The hybrid chapter's fast twins (`HybridKVCacheManager._checked_step_fast`, `HybridKVCacheCoordinator.cache_blocks_fast`,
the ones `allocate_slots` calls) in lockstep with the plain definitions they fall through to (`_checked_step`,
`cache_blocks`): every recorded hybrid and Mamba trace, and random workloads on random group mixes, replayed both ways
(each twin replaced by its plain definition), decision by decision."""
import json
import math
import random
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import example, given, settings, strategies as st

import kvref.core.mamba  # noqa: F401  registers the Mamba kind
from kvref.core.hybrid import (FullAttentionSpec, HybridKVCacheCoordinator, HybridKVCacheManager, HybridRequest,
                          SingleTypeKVCacheManager, SlidingWindowSpec)
from kvref.oracle.hybrid_replay import HybridTraceReplayer

ROOT = Path(__file__).resolve().parent.parent / "golden" / "hybrid"
TRACES = sorted(p for p in [*ROOT.glob("*.jsonl"), *ROOT.glob("mamba/*.jsonl")] if not p.name.endswith(".vllm.jsonl"))
TWINS = [(HybridKVCacheManager, "_checked_step_fast", "_checked_step"),  # (class, fast twin, its plain definition)
         (HybridKVCacheCoordinator, "cache_blocks_fast", "cache_blocks")]


@contextmanager
def plain_definitions():
    "Run with each fast twin replaced by its plain definition."
    saved = [(cls, fast, getattr(cls, fast)) for cls, fast, _ in TWINS]
    try:
        for cls, fast, plain in TWINS: setattr(cls, fast, getattr(cls, plain))
        yield
    finally:
        for cls, fast, method in saved: setattr(cls, fast, method)


def replay(ops: list[dict]) -> list[dict]:
    replayer = HybridTraceReplayer()
    return [replayer.apply(op) for op in ops]


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_allocate_slots_calls_the_fast_twins():
    "Each twin is its own function, and `allocate_slots` reaches it: replaced by a counter, the counter counts."
    calls = []
    for cls, fast, plain in TWINS:
        assert getattr(cls, fast) is not getattr(cls, plain), f"{cls.__name__}.{fast}"
    saved = [(cls, fast, getattr(cls, fast)) for cls, fast, _ in TWINS]
    try:
        for cls, fast, _ in TWINS:
            setattr(cls, fast, lambda self, *a, _m=getattr(cls, fast), _n=fast: (calls.append(_n), _m(self, *a))[1])
        m = HybridKVCacheManager([SlidingWindowSpec(4, 8), FullAttentionSpec(4)], 20)
        m.allocate_slots(HybridRequest("r", list(range(9))), 9)
    finally:
        for cls, fast, method in saved: setattr(cls, fast, method)
    assert calls == ["_checked_step_fast", "cache_blocks_fast"]


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_recorded_traces_decide_alike_with_fast_twins_and_plain(trace):
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
def test_random_workloads_decide_alike_with_fast_twins_and_plain(seed):
    ops = random_trace(seed)
    with plain_definitions(): plain = replay(ops)
    assert replay(ops) == plain


@settings(max_examples=400)
@given(num_new=st.sampled_from([-1, 0, 1, 5, 9, 12, True]), num_hit=st.sampled_from([-1, 0, 4, False]), hits=st.sampled_from(["none", "empty", "one", "short"]),
       gate=st.sampled_from([False, True, 1]), computed=st.one_of(st.integers(-1, 9), st.sampled_from([2.0, True])),
       boundary=st.sampled_from([0, 4, -1, 2.0, None]), max_model_len=st.sampled_from([6, 64]), stranger=st.booleans())
def test_checked_step_fast_equals_plain(num_new, num_hit, hits, gate, computed, boundary, max_model_len, stranger):
    "Every argument mix: the same hits, or the same error, from the fast twin as from the plain definition."
    m = HybridKVCacheManager([SlidingWindowSpec(4, 8), FullAttentionSpec(4)], 20, max_model_len=max_model_len)
    r = HybridRequest("r", list(range(9)))
    r.num_computed_tokens, r.shared_prefix_boundary = computed, boundary  # a scheduler's fields, set after it is built
    if stranger: m.live_requests["r"] = HybridRequest("r", list(range(9)))  # another request object holds the id
    blocks = {"none": None, "empty": [[], []], "one": [[], [m.block_pool.blocks[1]]], "short": [[]]}[hits]

    def outcome(checked_step):
        try: return "ok", [list(h) for h in checked_step(m, r, num_new, num_hit, blocks, gate)]
        except (ValueError, TypeError) as e: return type(e).__name__, str(e)
    assert outcome(HybridKVCacheManager._checked_step_fast) == outcome(HybridKVCacheManager._checked_step)


# A step the fast twin answers alone, and one case for each condition of its test turned false.
OK_STEP = dict(num_new=1, gate=False, computed=0, boundary=0, max_model_len=64, stranger=False)
@example(**OK_STEP)
@example(**{**OK_STEP, "boundary": -1})
@example(**{**OK_STEP, "boundary": 2.0})
@example(**{**OK_STEP, "boundary": None})
@example(**{**OK_STEP, "computed": -1})
@example(**{**OK_STEP, "computed": 2.0})
@example(**{**OK_STEP, "computed": True})
@example(**{**OK_STEP, "stranger": True})
@example(**{**OK_STEP, "num_new": True})
@example(**{**OK_STEP, "num_new": 0})
@example(**{**OK_STEP, "num_new": 10})
@example(**{**OK_STEP, "max_model_len": 6, "num_new": 7})
@example(**{**OK_STEP, "gate": None})
@settings(max_examples=200)
@given(num_new=st.one_of(st.integers(-1, 11), st.just(True)), gate=st.sampled_from([False, True, None]),
       computed=st.one_of(st.integers(-1, 9), st.sampled_from([2.0, True])), boundary=st.sampled_from([0, 4, -1, 2.0, None]),
       max_model_len=st.sampled_from([6, 64]), stranger=st.booleans())
def test_checked_step_fast_equals_plain_on_steps_without_hits(num_new, gate, computed, boundary, max_model_len, stranger):
    "The calls the fast twin answers alone (no hits given): the same empty hits, or the same error, as the plain definition."
    m = HybridKVCacheManager([SlidingWindowSpec(4, 8), FullAttentionSpec(4)], 20, max_model_len=max_model_len)
    r = HybridRequest("r", list(range(9)))
    r.num_computed_tokens, r.shared_prefix_boundary = computed, boundary
    if stranger: m.live_requests["r"] = HybridRequest("r", list(range(9)))

    def outcome(checked_step):
        try: return "ok", [list(h) for h in checked_step(m, r, num_new, 0, None, gate)]
        except (ValueError, TypeError) as e: return type(e).__name__, str(e)
    assert outcome(HybridKVCacheManager._checked_step_fast) == outcome(HybridKVCacheManager._checked_step)
