"""Hybrid KV cache groups: every recorded vLLM 0.33 hybrid trace decision by decision, and the single-group case of
the hybrid machinery against the KV cache manager on every single-group trace and on random workloads."""
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from kvref.core.free_queue import block_ids
from kvref.core.hybrid import FullAttentionSpec, HybridKVCacheManager, HybridRequest
from kvref.oracle.hybrid_replay import HybridTraceReplayer, replay_hybrid
from kvref.core.kv_cache_manager import KVCacheManager, Request

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


def random_ops(seed: int, n: int = 150) -> list[tuple[str, int, int]]:
    "A random workload: mostly adds and schedules, with appends, preemptions, frees and the odd prefix-cache reset."
    rng = random.Random(seed)
    kinds = rng.choices(["add", "schedule", "append", "preempt", "free", "reset"], [3, 8, 4, 1, 2, 0.2], k=n)
    return [(kind, rng.randrange(60), rng.randrange(1, 25)) for kind in kinds]


@settings(max_examples=150)
@given(seed=st.integers(0, 2**32 - 1), num_blocks=st.integers(2, 40), block_size=st.sampled_from([1, 2, 4, 8]))
def test_one_full_attention_group_decides_like_the_kv_cache_manager(seed, num_blocks, block_size):
    "Random workloads in lockstep: every hit, refusal, new block, block table and the free queue after every op agree."
    single = KVCacheManager(num_blocks, block_size, max_model_len=65536)
    one = HybridKVCacheManager([FullAttentionSpec(block_size)], num_blocks)
    requests, running = {}, set()  # request id -> (single's Request, the hybrid manager's HybridRequest)
    for n, (kind, a, b) in enumerate(random_ops(seed)):
        live = sorted(requests)
        if kind == "add":
            rid = f"r{n}"
            prompt = [a % 4 * 7 + i % 5 for i in range(b + a % 17)]  # four stems, so lookups hit
            requests[rid] = (Request(rid, prompt), HybridRequest(rid, prompt))
        elif kind == "schedule" and live:
            rid = live[a % len(live)]
            (r1, r2), waiting = requests[rid], rid not in running
            h1, n1 = single.get_computed_blocks(r1) if waiting else ([], 0)
            h2, n2, _ = one.get_computed_blocks(r2) if waiting else ([[]], 0, 0)
            assert n1 == n2 and block_ids(h1) == block_ids(h2[0]), f"{rid}: hits"
            num_new = min(r1.num_tokens - r1.num_computed_tokens - n1, b)
            if num_new <= 0: continue
            new1, new2 = single.allocate_slots(r1, num_new, n1, h1), one.allocate_slots(r2, num_new, n2, h2)
            assert (new1 is None) == (new2 is None), f"{rid}: refusal"
            if new1 is not None:
                assert block_ids(new1) == block_ids(new2[0]), f"{rid}: new blocks"
                for r in (r1, r2): r.num_computed_tokens += n1 + num_new
                running.add(rid)
        elif kind == "append" and running:
            rid = sorted(running)[a % len(running)]
            for r in requests[rid]:
                if r.num_computed_tokens == r.num_tokens: r.append_output_token_ids(b)
        elif kind in ("preempt", "free") and live:
            rid = live[a % len(live)]
            single.free(requests[rid][0]); one.free(requests[rid][1]); running.discard(rid)
            if kind == "free": del requests[rid]
            else:
                for r in requests[rid]: r.num_computed_tokens = 0
        elif kind == "reset":
            assert single.reset_prefix_cache() == one.reset_prefix_cache()
        for rid in requests: assert [single.get_block_ids(rid)] == one.get_block_ids(rid), f"{rid}: table"
        assert single.get_free_queue_ids() == one.get_free_queue_ids(), f"after {kind}: free queue"


def test_group_tables_svg_escapes_request_ids():
    "A request id holding XML's special characters still gives a well-formed picture that shows it."
    import xml.etree.ElementTree as ET
    from kvref.core.hybrid import SlidingWindowSpec, group_tables_svg
    manager = HybridKVCacheManager([SlidingWindowSpec(4, sliding_window=8), FullAttentionSpec(4)], 20)
    rid = 'a<b&"c"'
    request = HybridRequest(rid, list(range(10)))
    manager.allocate_slots(request, 10)
    svg = group_tables_svg(manager, [rid])
    texts = [t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]
    assert any(t.startswith(rid) for t in texts), texts


ATTENTION_ONLY_RUN = """
import json, sys
import kvref.core.hybrid as hybrid
if sys.argv[1] == "mamba": import kvref.core.mamba
from kvref.distributed.kv_events import event_to_json, wire_events
manager = hybrid.HybridKVCacheManager([hybrid.FullAttentionSpec(8), hybrid.SlidingWindowSpec(8, 16)], 16,
                                      prefix_match_unit=2, enable_kv_cache_events=True)
a = hybrid.HybridRequest("a", list(range(13)))
manager.allocate_slots(a, 13); a.num_computed_tokens = 13
for t in range(3):
    a.append_output_token_ids(100 + t); manager.allocate_slots(a, 1); a.num_computed_tokens += 1
pool = manager.block_pool
print(json.dumps({"mamba_loaded": "kvref.core.mamba" in sys.modules,
                  "keys": {b.block_id: [b.block_hash.hex(), *sorted(k.hex() for k in pool.cached_block_hashes_by_block.get(b.block_id, ()))]
                           for b in pool.blocks if b.block_hash is not None},
                  "events": [event_to_json(e) for e in wire_events(manager.take_events(), "int", {})]}))
"""


def attention_only_run(extra: str) -> dict:
    "ATTENTION_ONLY_RUN in a fresh interpreter: kvref.core.hybrid alone (`extra='none'`) or with kvref.core.mamba too (`'mamba'`)."
    import os, subprocess, sys
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", ATTENTION_ONLY_RUN, extra], capture_output=True, text=True, env=env, cwd=root, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_attention_only_prompt_tail_does_not_depend_on_importing_mamba():
    """Full attention block 8, hash unit 2, no Mamba group: the block holding the prompt's last hash boundary is keyed
    and reported (vLLM's `FullAttentionManager._cache_partial_tail_block`) whether or not `kvref.core.mamba` was imported."""
    alone, with_mamba = attention_only_run("none"), attention_only_run("mamba")
    assert (alone.pop("mamba_loaded"), with_mamba.pop("mamba_loaded")) == (False, True)
    assert alone == with_mamba
    tails = [e for e in alone["events"] if e["type"] == "BlockStored" and e["block_size"] == 2]
    assert [(e["token_ids"], e["group_idx"]) for e in tails] == [([10, 11], 0)]  # the tail key of 12 tokens, in block 2
    assert len(alone["keys"]["2"]) == 2  # its full key, and the tail's beside it
