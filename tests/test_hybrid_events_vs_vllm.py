"""KV events of kvref's `HybridKVCacheManager(..., enable_kv_cache_events=True)` against vLLM 0.33's own
`KVCacheManager` with events on (`vllm/v1/core/block_pool.py` at v0.33.0), op by op, on the random hybrid workloads of
`hybrid_vllm_support.py` (attention-only, Mamba, Mamba with sub-block hits): every `BlockStored`, `BlockRemoved` and
`AllBlocksCleared`, every field as vLLM publishes it (int hashes), in order.

The lockstep tests skip where vLLM 0.33 does not import (run them with /work/venv-vllm/bin/python -m pytest); the
recorded runs (`golden/hybrid/events/`) replay everywhere."""
import json
from pathlib import Path

import pytest

from hybrid_vllm_support import LAYOUTS, events_in_lockstep, kvref_events, load_vllm, lockstep_events
from kvref.oracle.hybrid_replay import HybridTraceReplayer
import kvref.core.mamba  # noqa: F401  (registers the Mamba kind)

EVENTS = Path(__file__).resolve().parent.parent / "golden" / "hybrid" / "events"


def read(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def replay_events(ops: list[dict]) -> list[list[dict]]:
    "kvref's events after each op of a hybrid trace."
    replayer, out, lora_ids = HybridTraceReplayer(enable_kv_cache_events=True), [], {}
    for op in ops:
        replayer.apply(op)
        out.append(kvref_events(replayer, op, lora_ids))
    return out


@pytest.mark.parametrize("name", sorted(p.name.removesuffix(".events.jsonl") for p in EVENTS.glob("*.events.jsonl")))
def test_recorded_vllm_events_replay(name):
    "vLLM 0.33's events for recorded hybrid runs, op by op: kvref emits the same."
    want = read(EVENTS / f"{name}.events.jsonl")
    got = replay_events(read(EVENTS / f"{name}.jsonl"))
    for i, (g, w) in enumerate(zip(got, want, strict=True)): assert g == w, f"op {i}"


def test_the_recordings_hold_what_a_router_finds_surprising():
    "The goldens cover the cases the chapter warns about: empty sliding-window stores, evictions, several groups."
    events = [e for p in EVENTS.glob("*.events.jsonl") for es in read(p) for e in es]
    stored = [e for e in events if e["type"] == "BlockStored"]
    assert any(not e["block_hashes"] and e["token_ids"] for e in stored)  # a store of no block, with tokens
    assert any(not e["block_hashes"] and e["lora_id"] for e in stored)     # ... naming its request's adapter
    unit = read(EVENTS / "hybrid-sub_block-6.jsonl")[0]["prefix_match_unit"]  # sliding window beside Mamba: sub-block hits off
    assert any(e["type"] == "BlockStored" and e["block_size"] == unit and e["kv_cache_spec_kind"] == "full_attention"
               for es in read(EVENTS / "hybrid-sub_block-6.events.jsonl") for e in es)  # yet a prompt tail keyed
    assert any(e["type"] == "BlockRemoved" and e["group_idx"] for e in events)
    assert {e["kv_cache_spec_kind"] for e in stored} >= {"full_attention", "sliding_window", "mamba"}


@pytest.fixture(scope="module")
def vllm():
    try: return load_vllm()
    except ImportError as e: pytest.skip(str(e))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_random_workloads_emit_vllms_events(vllm, layout):
    "Sliding-window groups included: beside Mamba groups they switch sub-block hits off."
    assert [d for s in range(60) if (d := lockstep_events(s, 60, vllm, layout)[2])] == []


def test_prompt_tail_keys_without_sub_block_hits(vllm):
    """A sliding-window group turns sub-block hits off, yet vLLM's `FullAttentionManager.cache_blocks` still keys (and
    reports) the prompt tail ending inside a block when the hash unit is smaller than the block
    (`vllm/v1/core/single_type_kv_cache_manager.py` at v0.33.0, `_cache_partial_tail_block`)."""
    ops = lockstep_events(6, 0, vllm, "sub_block")[0]
    assert any(g["kind"] == "sliding_window" for g in ops[0]["groups"]) and ops[0]["prefix_match_unit"] < ops[0]["groups"][0]["block_size"]
    assert lockstep_events(6, 60, vllm, "sub_block")[2] is None


def with_adapters(ops: list[dict]) -> list[dict]:
    "The ops with every request under one of two LoRA adapters, in turn."
    adapters = [{"name": name, "path": f"/adapters/{name}"} for name in ("sql", "chat")]
    adds = iter(range(len(ops)))
    return [{**op, "lora": adapters[next(adds) % 2]} if op["op"] == "add" else op for op in ops]


def test_lora_requests_name_their_adapter_even_in_a_store_of_no_block(vllm):
    "vLLM's `BlockStored` carries the request's adapter id whether or not it holds blocks (`block_pool.py`, `cache_full_blocks`)."
    ops = with_adapters(read(EVENTS / "hybrid-attention-0.jsonl"))
    assert events_in_lockstep(ops, vllm) is None


ATTENTION_TAIL = {"op": "config", "groups": [{"kind": "full", "block_size": 8}, {"kind": "sliding_window", "block_size": 8, "sliding_window": 16}],
                  "num_blocks": 7, "prefix_match_unit": 2}


def test_attention_only_prompt_tail_as_the_chapter_shows_it(vllm):
    "04a's worked example (full attention block 8 beside a sliding window, hash unit 2, no Mamba group), op by op against vLLM."
    ops = [ATTENTION_TAIL, {"op": "add", "id": "a", "prompt": list(range(13))}, {"op": "schedule", "id": "a"}]
    for t in range(3): ops += [{"op": "append", "id": "a", "tokens": [100 + t]}, {"op": "schedule", "id": "a"}]
    ops += [{"op": "free", "id": "a"}, {"op": "add", "id": "c", "prompt": list(range(500, 524))}, {"op": "schedule", "id": "c"}]
    assert events_in_lockstep(ops, vllm) is None


def test_prompt_tail_keyed_in_a_step_that_fills_no_block(vllm):
    """A preempted request resumes with a hit past its prompt's last hash boundary, on a block another request filled:
    no block becomes full in that step, yet vLLM keys (and reports) the prompt tail in it."""
    ops = [{**ATTENTION_TAIL, "num_blocks": 16}, {"op": "add", "id": "a", "prompt": list(range(13))}, {"op": "schedule", "id": "a"},
           {"op": "append", "id": "a", "tokens": [13, 14, 15, 16]}, {"op": "preempt", "id": "a"},
           {"op": "add", "id": "x", "prompt": list(range(20))}, {"op": "schedule", "id": "x"}, {"op": "new_step"},
           {"op": "schedule", "id": "a"}]
    assert events_in_lockstep(ops, vllm) is None
