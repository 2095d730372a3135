"""Soak: long runs of random allocator ops (valid ones and refused ones) with every invariant of the free queue,
the block pool and the KV cache manager checked after each op. 2*10^4 ops in CI; 10^6 with KVREF_SLOW=1."""
import random

import pytest

from kvref.core.free_queue import block_ids
from kvref.core.hashing import LoRARequest
from kvref.core.kv_cache_manager import KVCacheManager, Request
from test_allocator_refusals import bad_manager_calls, manager_state, refused


def check_invariants(m: KVCacheManager, reqs: dict) -> None:
    "Everything that must hold between any two calls, walked from scratch."
    pool, queue = m.block_pool, m.block_pool.free_block_queue
    forward, node = [], queue.fake_head
    while node.next_free_block is not queue.fake_tail:      # links agree both ways
        assert node.next_free_block.prev_free_block is node
        node = node.next_free_block
        forward.append(node)
    assert queue.fake_tail.prev_free_block is node and queue.fake_head.prev_free_block is None
    queued = {b for b in pool.blocks if b.free_queue is queue}           # the blocks that name this queue
    assert len(forward) == queue.num_free_blocks == len(queued) and set(forward) == queued
    assert block_ids(forward) == m.get_free_queue_ids()
    held = {}
    for table in m.req_to_blocks.values():
        for b in table: held[b] = held.get(b, 0) + 1
    for b in pool.blocks:
        assert pool.blocks[b.block_id] is b
        if b.is_null:
            assert b is pool.null_block and b.block_id == 0 and b not in queued and b.block_hash is None
            continue
        assert (b in queued) == (b.ref_cnt == 0)
        assert b.ref_cnt == held.get(b, 0)                    # a count is exactly the tables holding the block
        assert b.block_hash is None or b.block_id in pool.cached_block_hash_to_block[b.block_hash]
        assert m.enable_caching or b.block_hash is None
    for h, holders in pool.cached_block_hash_to_block.items():
        assert holders and all(pool.blocks[i] is b and b.block_hash == h for i, b in holders.items())
    assert set(m.req_to_blocks) == set(m.live_requests) and set(m.num_cached_block) <= set(m.req_to_blocks)
    for rid, table in m.req_to_blocks.items():
        r = m.live_requests[rid]
        assert reqs.get(rid) is r and len(set(table)) == len(table)
        assert r.num_computed_tokens <= len(table) * m.block_size
        for i in range(m.num_cached_block.get(rid, 0)):     # cached prefix: the request's own hashes, in order
            assert table[i].block_hash == r.block_hashes[i]


def soak(num_ops: int, seed: int) -> dict:
    "Run `num_ops` random ops over fresh random configurations; return how many of each kind ran."
    rng, counts = random.Random(seed), {}
    prefixes = [[rng.randrange(40) for _ in range(rng.randint(1, 12))] for _ in range(4)]
    m = reqs = None
    for op_index in range(num_ops):
        if op_index % 2000 == 0:
            max_len = rng.choice([None, None, 16, 40])
            m = KVCacheManager(rng.randint(1, 24), rng.randint(1, 4), behavior=rng.choice(["vllm_0_33", "design_doc"]),
                               enable_caching=rng.random() < 0.85, max_model_len=max_len,
                               enable_kv_cache_events=rng.random() < 0.3)
            reqs, next_id = {}, 0
        kind = rng.choices(["add", "schedule", "preempt", "finish", "reset", "bad"], [3, 10, 1, 2, 0.3, 1])[0]
        if kind == "add" or not reqs:
            if len(reqs) >= 8: kind = "finish"
            else:
                rid, next_id = f"r{next_id}", next_id + 1
                prompt = rng.choice(prefixes) + [rng.randrange(4) for _ in range(rng.randint(0, 8))]
                if m.max_model_len: prompt = prompt[:m.max_model_len - 1] or [1]
                reqs[rid] = Request(rid, prompt, cache_salt=rng.choice([None, None, "s"]),
                                    lora_request=rng.choice([None, None, LoRARequest("L", "/l")]))
                kind = "add"
        if kind == "schedule":
            r = reqs[rng.choice(sorted(reqs))]
            if r.num_computed_tokens == r.num_tokens:
                if m.max_model_len and r.num_tokens >= m.max_model_len: kind = "finish"
                else: r.append_output_token_ids([rng.randrange(4)]); kind = "append"
            else:
                hits, num_hit = m.get_computed_blocks(r) if r.num_computed_tokens == 0 else ([], 0)
                n = min(rng.randint(1, 6), r.num_tokens - r.num_computed_tokens - num_hit)
                before = manager_state(m, reqs.values())
                got = m.allocate_slots(r, n, num_hit, hits, num_lookahead_tokens=rng.choice([0, 0, 1, 3]))
                if got is None: assert manager_state(m, reqs.values()) == before; kind = "refused_no_room"
                else: r.num_computed_tokens += num_hit + n
        if kind in ("preempt", "finish"):
            rid = rng.choice(sorted(reqs))
            m.free(reqs[rid] if rng.random() < 0.5 else rid)
            reqs[rid].num_computed_tokens = 0
            if kind == "finish": del reqs[rid]
        elif kind == "reset":
            assert m.reset_prefix_cache() == all(b.ref_cnt == 0 for b in m.block_pool.blocks if not b.is_null)
        elif kind == "bad":
            calls = bad_manager_calls(m, reqs)
            refused(rng.choice(calls), lambda: manager_state(m, reqs.values()))
        if rng.random() < 0.1: m.take_events()
        check_invariants(m, reqs)
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def test_soak_quick():
    counts = soak(20_000, seed=0)
    assert sum(counts.values()) == 20_000
    assert min(counts[k] for k in ("add", "schedule", "append", "preempt", "finish", "bad", "refused_no_room")) > 100


@pytest.mark.slow
def test_soak_million_ops():
    counts = soak(1_000_000, seed=1)
    assert sum(counts.values()) == 1_000_000 and counts["refused_no_room"] > 1000
