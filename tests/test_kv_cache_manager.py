"""KV cache manager: the seeds' worked examples, a stateful invariant check, a differential test against a
deliberately naive allocator, and bad input."""
import random

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvref.core.block_pool import BlockRemoved, BlockStored
from kvref.core.free_queue import block_ids
from kvref.core.hashing import LoRARequest, hash_request_tokens
from kvref.core.kv_cache_manager import KVCacheManager, Request, cdiv
from kvref.oracle.replay import replay


def step(m, r, n=None, lookahead=0):
    "Schedule `r` once as a scheduler would (hits only when nothing is computed); the new blocks or None."
    hits, num_hit = m.get_computed_blocks(r) if r.num_computed_tokens == 0 else ([], 0)
    todo = r.num_tokens - r.num_computed_tokens - num_hit
    n = todo if n is None else min(n, todo)
    if n == 0: return []
    got = m.allocate_slots(r, n, num_hit, hits, num_lookahead_tokens=lookahead)
    if got is not None: r.num_computed_tokens += num_hit + n
    return got


# ---------------------------------------------------------------- the seeds' worked examples

def design_doc_run(behavior):
    m = KVCacheManager(10, 4, behavior=behavior)
    r0, r1 = Request("0", list(range(15))), Request("1", list(range(10)) + [100, 101, 102, 103])
    step(m, r0)
    time1 = (m.get_block_ids("0"), len(m.block_pool.cached_block_hash_to_block))
    r0.append_output_token_ids(15); step(m, r0)
    r0.append_output_token_ids(16); step(m, r0)
    time3 = m.get_block_ids("0")
    hits, num_hit = m.get_computed_blocks(r1)
    step(m, r1)
    m.free(r0)
    time5 = m.get_free_queue_ids()
    m.free(r1)
    time6 = m.get_free_queue_ids()
    r2 = Request("2", list(range(12)) + list(range(200, 217)))
    hit2 = m.get_computed_blocks(r2)[1]
    step(m, r2)
    return dict(time1=time1, time3=time3, hit1=(block_ids(hits), num_hit), table1=m.get_block_ids("1"),
                time5=time5, time6=time6, hit2=hit2, table2=m.get_block_ids("2"), after7=m.get_free_queue_ids())


def test_design_doc_example_exactly_as_printed():
    got = design_doc_run("design_doc")
    assert got["time1"] == ([0, 1, 2, 3], 3)
    assert got["time3"] == [0, 1, 2, 3, 4]
    assert got["hit1"] == ([0, 1], 8)
    assert got["time5"] == [7, 8, 9, 4, 3, 2]
    assert got["time6"] == [7, 8, 9, 4, 3, 2, 6, 5, 1, 0]
    assert got["hit2"] == 12
    assert got["table2"] == [0, 1, 2, 7, 8, 9, 4, 3]
    assert got["after7"] == [6, 5]


def test_design_doc_example_through_vllm_0_33():
    got = design_doc_run("vllm_0_33")
    assert got["time6"] == [7, 5, 8, 9, 4, 3, 6, 2, 1]
    assert got["table2"] == [1, 2, 3, 7, 5, 8, 9, 4]


def test_design_doc_time7_evicts_block_3():
    m = KVCacheManager(10, 4, behavior="design_doc", enable_kv_cache_events=True)
    r0 = Request("0", list(range(15)))
    step(m, r0); r0.append_output_token_ids(15); step(m, r0); r0.append_output_token_ids(16); step(m, r0)
    r1 = Request("1", list(range(10)) + [100, 101, 102, 103]); step(m, r1)
    m.free(r0); m.free(r1)
    h3 = m.block_pool.blocks[3].block_hash
    m.take_events()
    step(m, Request("2", list(range(12)) + list(range(200, 217))))
    events = m.take_events()
    assert [e for e in events if isinstance(e, BlockRemoved)] == [BlockRemoved([h3])]
    assert isinstance(events[-1], BlockStored) and len(events[-1].block_hashes) == 4
    assert h3 not in m.block_pool.cached_block_hash_to_block


def test_seed_004_append_only_duplicates():
    "Seed 004: a running request keeps its own copy of a block another request cached meanwhile."
    m = KVCacheManager(10, 4, behavior="design_doc")
    a, b = Request("A", [1, 2, 3, 4, 5, 6, 7, 8, 9]), Request("B", [1, 2, 3, 4, 5, 6, 7, 8, 10])
    step(m, a, 4); step(m, b, 2); step(m, a); step(m, b)
    assert (m.get_block_ids("A"), m.get_block_ids("B")) == ([0, 2, 3], [0, 1, 4])
    h = m.block_pool.blocks[1].block_hash
    assert list(m.block_pool.cached_block_hash_to_block[h]) == [2, 1]
    m.free(a); m.free(b)
    c = Request("C", [1, 2, 3, 4, 5, 6, 7, 8, 11])
    assert block_ids(m.get_computed_blocks(c)[0]) == [0, 2]   # earliest cached duplicate


def test_hit_cap_leaves_the_last_token_to_compute():
    m = KVCacheManager(20, 4)
    p = Request("p", list(range(16))); step(m, p); m.free(p)
    assert m.get_computed_blocks(Request("q", list(range(16))))[1] == 12
    assert m.get_computed_blocks(Request("q", list(range(17))))[1] == 16
    assert m.get_computed_blocks(Request("q", list(range(4))))[1] == 0


def test_lookup_stops_at_the_first_miss():
    "A hit after a miss is useless (the prefix is broken), even if a later block is still cached."
    m = KVCacheManager(20, 4)
    p = Request("p", list(range(17))); step(m, p); m.free(p)
    m.block_pool._maybe_evict_cached_block(m.block_pool.blocks[2])   # p's second block only
    hits, num_hit = m.get_computed_blocks(Request("q", list(range(17))))
    assert (block_ids(hits), num_hit) == ([1], 4)
    assert m.block_pool.get_cached_block(p.block_hashes[2]) is m.block_pool.blocks[3]


def test_caching_at_allocation_time_lets_a_later_request_in_the_same_step_hit():
    m = KVCacheManager(20, 4)
    a, b = Request("a", list(range(9))), Request("b", list(range(9)))
    step(m, a)                    # nothing computed yet, but blocks are cached already
    assert m.get_computed_blocks(b)[1] == 8
    step(m, b)
    assert m.get_block_ids("b")[:2] == m.get_block_ids("a")[:2]


def test_lookahead_slots_are_allocated_but_not_cached():
    m = KVCacheManager(20, 4)
    r = Request("r", list(range(6)))
    got = step(m, r, lookahead=5)            # 6 + 5 slots: 3 blocks, only 1 full of known tokens
    assert len(got) == 3 and [b.block_hash is not None for b in got] == [True, False, False]
    m.free(r)
    assert m.get_free_queue_ids()[:2] == [3, 2]   # hashless blocks to the head, last block first


def test_lookahead_is_capped_by_max_model_len():
    "7 tokens + 4 lookahead at block size 4 would need 3 blocks; max_model_len=8 caps the slots at 2 blocks."
    m = KVCacheManager(10, 4, max_model_len=8)
    r = Request("r", list(range(7)))
    assert len(m.allocate_slots(r, 7, num_lookahead_tokens=4)) == 2


def test_chunked_prefill_caches_only_the_computed_blocks():
    m = KVCacheManager(20, 4)
    r = Request("r", list(range(16)))
    step(m, r, 5, lookahead=8)     # 5 of 16 tokens computed: one full block; 13 slots reach block 3
    assert [b.block_hash is not None for b in m.req_to_blocks["r"]] == [True, False, False, False]
    step(m, r, 7)                  # 12 computed: three full blocks
    assert [b.block_hash is not None for b in m.req_to_blocks["r"]] == [True, True, True, False]


def test_preallocation_design_doc_only():
    m = KVCacheManager(20, 4, behavior="design_doc", num_preallocate_tokens=8)
    r = Request("r", list(range(5)))
    assert len(step(m, r)) == 2 + 2
    r.append_output_token_ids([1, 2, 3])
    assert step(m, r) == []               # fits in preallocated blocks
    capped = KVCacheManager(20, 4, behavior="design_doc", num_preallocate_tokens=64, max_model_len=12)
    assert len(step(capped, Request("c", list(range(5))))) == 3        # never past cdiv(max_model_len, block_size)
    tight = KVCacheManager(4, 4, behavior="design_doc", num_preallocate_tokens=64)
    assert len(step(tight, Request("t", list(range(5))))) == 4         # never past the free blocks
    with pytest.raises(ValueError, match="design_doc feature"):
        KVCacheManager(20, 4, num_preallocate_tokens=8)


def test_caching_off():
    for behavior, expect in (("vllm_0_33", [4, 3, 2, 1, 5]), ("design_doc", [4, 5, 0, 1, 2, 3])):
        m = KVCacheManager(6, 2, behavior=behavior, enable_caching=False)
        r = Request("r", [1, 2, 3, 4, 5, 6, 7])
        step(m, r)
        assert m.get_computed_blocks(r) == ([], 0) and not m.block_pool.cached_block_hash_to_block
        m.free(r)
        assert m.get_free_queue_ids() == expect


# ---------------------------------------------------------------- bad input

def test_bad_input():
    m = KVCacheManager(8, 4, max_model_len=16)
    r = Request("r7", list(range(20)))
    with pytest.raises(ValueError, match="request 'r7' needs 17 tokens but max_model_len is 16"):
        m.allocate_slots(r, 17)
    for kw in ({"num_new_tokens": -1}, {"num_new_tokens": 1, "num_lookahead_tokens": -2}, {"num_new_tokens": 1.5}):
        with pytest.raises(TypeError if 1.5 in kw.values() else ValueError, match="must be an int >= 0"):
            m.allocate_slots(r, **kw)
    with pytest.raises(ValueError, match="request 'r7': num_new_tokens must be > 0"):
        m.allocate_slots(r, 0, num_lookahead_tokens=2)
    with pytest.raises(ValueError, match="num_new_computed_tokens=4 but 0 hit blocks"):
        m.allocate_slots(r, 1, 4, [])
    with pytest.raises(ValueError, match="block_size must be an int >= 1, got 0"):
        KVCacheManager(8, 0)
    with pytest.raises(ValueError, match="num_blocks must be an int >= 1"):
        KVCacheManager(0, 4)
    with pytest.raises(ValueError, match=">= 1"):
        KVCacheManager(0, 4, behavior="design_doc")
    with pytest.raises(ValueError, match="max_model_len must be an int >= 1"):
        KVCacheManager(8, 4, max_model_len=0)
    with pytest.raises(ValueError, match="request_id must be a non-empty str"):
        Request("", [1])
    with pytest.raises(ValueError, match=r"request 'x': token_ids\[0\] is -1; token ids must be ints in \[0, 2\*\*64\)"):
        Request("x", [1]).append_output_token_ids([-1])
    assert m.get_free_queue_ids() == list(range(1, 8))


def test_free_unknown_is_noop_unless_strict():
    m = KVCacheManager(8, 4)
    m.free("nobody")
    r = Request("r", [1, 2, 3])
    step(m, r); m.free(r); m.free(r)
    s = KVCacheManager(8, 4, strict=True)
    step(s, r := Request("r", [1, 2, 3]))
    s.free(r)
    with pytest.raises(ValueError, match="request 'r' holds no blocks: never allocated, or already freed"):
        s.free(r)


# ---------------------------------------------------------------- stateful invariants

def snapshot(m):
    pool = m.block_pool
    return (m.get_free_queue_ids(), [(b.ref_cnt, b.block_hash) for b in pool.blocks],
            {k: list(v) for k, v in pool.cached_block_hash_to_block.items()},
            {k: block_ids(v) for k, v in m.req_to_blocks.items()}, dict(m.num_cached_block))


PROMPT_PARTS = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 7], [9, 9], [1, 2]]


class AllocatorMachine(RuleBasedStateMachine):
    @initialize(behavior=st.sampled_from(["vllm_0_33", "design_doc"]), caching=st.booleans(),
                num_blocks=st.integers(2, 10), block_size=st.integers(1, 4))
    def setup(self, behavior, caching, num_blocks, block_size):
        self.m = KVCacheManager(num_blocks, block_size, behavior=behavior, enable_caching=caching)
        self.reqs, self.tables, self.next_id = {}, {}, 0
        self.seen_hash = {}   # block id -> the hash it was last seen holding while held

    @rule(part=st.sampled_from(PROMPT_PARTS), tail=st.lists(st.integers(0, 3), max_size=6),
          salt=st.sampled_from([None, "s"]), lora=st.booleans())
    def add(self, part, tail, salt, lora):
        rid = f"r{self.next_id}"; self.next_id += 1
        self.reqs[rid] = Request(rid, part + tail, cache_salt=salt,
                                 lora_request=LoRARequest("L", "/l") if lora else None)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data(), budget=st.none() | st.integers(1, 5), lookahead=st.integers(0, 2))
    def schedule(self, data, budget, lookahead):
        r = self.reqs[data.draw(st.sampled_from(sorted(self.reqs)))]
        if r.num_computed_tokens == r.num_tokens: return
        before = snapshot(self.m)
        got = step(self.m, r, budget, lookahead)
        if got is None:
            assert snapshot(self.m) == before, "a refused allocation changed something"
        else:
            assert all(b.block_id not in [x for t in before[3].values() for x in t] for b in got)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 3), min_size=1, max_size=3))
    def append(self, data, tokens):
        r = self.reqs[data.draw(st.sampled_from(sorted(self.reqs)))]
        if r.num_computed_tokens == r.num_tokens: r.append_output_token_ids(tokens)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data(), finish=st.booleans())
    def free_or_preempt(self, data, finish):
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        self.m.free(self.reqs[rid])
        self.reqs[rid].num_computed_tokens = 0
        self.tables.pop(rid, None)
        if finish: del self.reqs[rid]

    @rule()
    def reset(self):
        held = any(b.ref_cnt for b in self.m.block_pool.blocks if not b.is_null)
        assert self.m.reset_prefix_cache() is (not held)
        if not held: self.seen_hash.clear()

    @invariant()
    def consistent(self):
        m = getattr(self, "m", None)
        if m is None: return
        pool, null = m.block_pool, m.block_pool.null_block
        queued = m.get_free_queue_ids()
        assert len(queued) == len(set(queued)) == m.num_free_blocks
        # the free list is consistent both ways
        node, back = pool.free_block_queue.fake_tail, []
        while node.prev_free_block is not None:
            node = node.prev_free_block; back.append(node.block_id)
        assert back[:-1][::-1] == queued
        holders = {}
        for rid, table in m.req_to_blocks.items():
            for b in table: holders[b.block_id] = holders.get(b.block_id, 0) + 1
        for b in pool.blocks:
            if b is null:
                assert b.block_id == 0 and b.block_id not in queued and b.block_id not in holders
                continue
            if b.block_id in queued: assert b.ref_cnt == 0 and b.block_id not in holders
            else: assert b.ref_cnt == holders.get(b.block_id, 0) > 0
        # cache map and blocks agree
        for h, blocks in pool.cached_block_hash_to_block.items():
            assert blocks
            for bid, b in blocks.items(): assert b.block_id == bid and b.block_hash == h
        for b in pool.blocks:
            if b.block_hash is not None: assert b.block_id in pool.cached_block_hash_to_block[b.block_hash]
            if not m.enable_caching: assert b.block_hash is None
        # a held cached block's hash is the hash of the tokens that filled it
        for rid, table in m.req_to_blocks.items():
            r = self.reqs.get(rid)
            if r is None: continue
            want = hash_request_tokens(r.all_token_ids, m.block_size, m.hash_algo, cache_salt=r.cache_salt,
                                       lora=r.lora_request)
            for i, b in enumerate(table):
                if b.block_hash is not None:
                    assert b.block_hash == want[i]
                    assert i < r.num_computed_tokens // m.block_size, "a block was cached before its KV was computed"
                    self.seen_hash[b.block_id] = b.block_hash
            # tables only grow while held
            old = self.tables.get(rid, [])
            assert block_ids(table)[:len(old)] == old
            self.tables[rid] = block_ids(table)
        for b in pool.blocks:   # a free cached block keeps the hash it had, until evicted or reset
            if b.block_hash is not None and b.block_id in self.seen_hash:
                assert b.block_hash == self.seen_hash[b.block_id]

    def teardown(self):
        m = getattr(self, "m", None)
        if m is None: return
        for r in list(self.reqs.values()): m.free(r)
        usable = len(m.block_pool.blocks) - (m.block_pool.null_block is not None)
        assert m.num_free_blocks == usable
        assert all(b.ref_cnt == 0 for b in m.block_pool.blocks if not b.is_null)


TestAllocatorMachine = AllocatorMachine.TestCase


# ---------------------------------------------------------------- differential: a deliberately naive allocator

class NaiveAllocator:
    "Lists and dicts, O(n) everything: the documented rules, nothing clever. Block contents are token tuples."
    def __init__(self, num_blocks, block_size, behavior, enable_caching):
        self.vllm, self.bs, self.caching = behavior == "vllm_0_33", block_size, enable_caching
        self.queue = list(range(1 if self.vllm else 0, num_blocks))
        self.ref, self.key = [0] * num_blocks, [None] * num_blocks
        self.cache, self.tables, self.ncached = {}, {}, {}

    def content(self, req, i):
        return (req["salt"], req["lora"], tuple(req["tokens"][:(i + 1) * self.bs]))

    def hits(self, req):
        out = []
        if self.caching:
            for i in range((len(req["tokens"]) - 1) // self.bs):
                holders = self.cache.get(self.content(req, i))
                if not holders: break
                out.append(holders[0])
        return out

    def allocate(self, rid, req, num_new, hits):
        table = self.tables.setdefault(rid, [])
        computed = req["computed"] + len(hits) * self.bs
        need = -(-(computed + num_new) // self.bs) - len(table) - len(hits)
        if max(need, 0) + sum(self.ref[h] == 0 for h in hits) > len(self.queue): return False
        for h in hits:
            if self.ref[h] == 0: self.queue.remove(h)
            self.ref[h] += 1
            table.append(h)
        if hits: self.ncached[rid] = len(table)
        for _ in range(need):
            b = self.queue.pop(0)
            if self.key[b] is not None:
                self.cache[self.key[b]].remove(b)
                if not self.cache[self.key[b]]: del self.cache[self.key[b]]
                self.key[b] = None
            self.ref[b] = 1
            table.append(b)
        if self.caching:
            full = min(computed + num_new, len(req["tokens"])) // self.bs
            for i in range(self.ncached.get(rid, 0), full):
                self.key[table[i]] = self.content(req, i)
                self.cache.setdefault(self.key[table[i]], []).append(table[i])
            self.ncached[rid] = max(self.ncached.get(rid, 0), full)
        return True

    def free(self, rid):
        table = self.tables.pop(rid, None)
        self.ncached.pop(rid, None)
        if table is None: return
        walk = table[::-1] if (self.vllm or self.caching) else table
        front = []
        for b in walk:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (front if self.vllm and self.key[b] is None else self.queue).append(b)
        self.queue[:0] = front

    def reset(self):
        if any(self.ref): return False
        self.key = [None] * len(self.key); self.cache = {}
        return True


class NaiveReplayer:
    "Plays trace ops on the naive allocator, op by op, producing decisions in the recorded format."
    def __init__(self, behavior):
        self.behavior, self.reqs, self.a = behavior, {}, None

    def pending(self, rid):
        r = self.reqs[rid]
        return len(r["tokens"]) - r["computed"]

    def apply(self, op):
        a, d = self.a, {"op": op["op"]}
        if "id" in op: d["id"] = op["id"]
        if op["op"] == "config":
            a = self.a = NaiveAllocator(op["num_blocks"], op["block_size"], self.behavior, op.get("enable_caching", True))
        elif op["op"] == "add":
            lora = op.get("lora")
            self.reqs[op["id"]] = {"tokens": list(op["prompt"]), "computed": 0, "salt": op.get("cache_salt"),
                                   "lora": (lora["name"], lora["path"]) if lora else None}
        elif op["op"] == "schedule":
            r = self.reqs[op["id"]]
            hits = a.hits(r) if r["computed"] == 0 else []
            n = len(r["tokens"]) - r["computed"] - len(hits) * a.bs
            if op.get("budget") is not None: n = min(n, op["budget"])
            ok = a.allocate(op["id"], r, n, hits)
            if ok: r["computed"] += len(hits) * a.bs + n
            d.update(hit_tokens=len(hits) * a.bs, num_new_tokens=n, allocated=ok,
                     block_ids=list(a.tables.get(op["id"], [])))
        elif op["op"] == "append":
            self.reqs[op["id"]]["tokens"] += op["tokens"]
        elif op["op"] == "preempt":
            a.free(op["id"]); self.reqs[op["id"]]["computed"] = 0
        elif op["op"] == "free":
            a.free(op["id"]); self.reqs.pop(op["id"], None)
        elif op["op"] == "reset_prefix_cache":
            d["ok"] = a.reset()
        d.update(free_queue=list(a.queue), num_free=len(a.queue))
        return d


def random_trace(rng: random.Random, behavior: str, num_ops: int = 40) -> tuple[list[dict], list[dict]]:
    "A random trace over a tiny pool (shared prefixes, salts, LoRA, budgets, preemption, frees, resets) and the naive decisions."
    ops = [{"op": "config", "num_blocks": rng.randint(2, 12), "block_size": rng.randint(1, 4),
            "enable_caching": rng.random() < 0.8, "hash_algo": "sha256"}]
    live, n = [], 0
    naive = NaiveReplayer(behavior)
    decisions = [naive.apply(ops[0])]
    prefixes = [[rng.randint(0, 50) for _ in range(rng.randint(1, 9))] for _ in range(3)]
    for _ in range(num_ops):
        kind = rng.choices(["add", "schedule", "append", "preempt", "free", "reset"], [3, 6, 3, 1, 2, 1])[0]
        if kind == "add" or not live:
            rid = f"r{n}"; n += 1; live.append(rid)
            prompt = rng.choice(prefixes) + [rng.randint(0, 3) for _ in range(rng.randint(0, 6))]
            ops.append({"op": "add", "id": rid, "prompt": prompt, "cache_salt": rng.choice([None, None, "a"]),
                        "lora": rng.choice([None, None, {"name": "L", "path": "/l"}])})
        elif kind == "schedule":
            rid = rng.choice(live)
            if naive.pending(rid) == 0:   # nothing to compute: vLLM refuses such a step, a scheduler never asks
                ops.append({"op": "append", "id": rid, "tokens": [rng.randint(0, 3)]})
            else:
                ops.append({"op": "schedule", "id": rid, "budget": rng.choice([None, 1, 2, 3, 5])})
        elif kind == "append":
            ops.append({"op": "append", "id": rng.choice(live), "tokens": [rng.randint(0, 3)] * rng.randint(1, 2)})
        elif kind == "preempt":
            ops.append({"op": "preempt", "id": rng.choice(live)})
        elif kind == "free":
            rid = rng.choice(live + ["ghost"])
            if rid in live: live.remove(rid)
            ops.append({"op": "free", "id": rid})
        else:
            ops.append({"op": "reset_prefix_cache"})
        decisions.append(naive.apply(ops[-1]))
    return ops, decisions


@pytest.mark.parametrize("behavior", ["vllm_0_33", "design_doc"])
def test_differential_against_naive_allocator(behavior):
    rng = random.Random(f"kvref-{behavior}")
    refused = evicted_hits = 0
    for t in range(1500):
        ops, want = random_trace(rng, behavior)
        got = list(replay(ops, behavior))
        for i, (g, w) in enumerate(zip(got, want)):
            assert g == w, f"trace {t}, op {i}: {ops[i]}\nkvref: {g}\nnaive: {w}"
        refused += sum(d.get("allocated") is False for d in got)
        evicted_hits += sum(d.get("hit_tokens", 0) > 0 for d in got)
    assert refused > 500 and evicted_hits > 500   # the traces do exercise refusal and prefix hits


def test_manager_events_carry_lora_name_and_parent_chain():
    m = KVCacheManager(10, 2, enable_kv_cache_events=True)
    r = Request("r", [1, 2, 3, 4, 5], lora_request=LoRARequest("L", "/l"))
    step(m, r, 3)
    step(m, r)
    e1, e2 = m.take_events()
    assert (e1.token_ids, e1.parent_block_hash, e1.lora_name, e1.block_size) == ([1, 2], None, "L", 2)
    assert (e2.token_ids, e2.parent_block_hash, e2.block_hashes) == ([3, 4], e1.block_hashes[-1], [r.block_hashes[1]])
    assert m.take_events() == [] and KVCacheManager(10, 2).take_events() == []


@pytest.mark.parametrize("behavior", ["vllm_0_33", "design_doc"])
def test_differential_on_the_workload_generators(behavior):
    "The realistic request mixes of `kvref.oracle.workloads` (longer prompts, bigger pools) agree with the naive model too."
    workloads = pytest.importorskip("kvref.oracle.workloads")
    for name, make in workloads.WORKLOADS.items():
        ops = workloads.to_trace(make())
        naive = NaiveReplayer(behavior)
        for i, (op, got) in enumerate(zip(ops, replay(ops, behavior))):
            assert got == naive.apply(op), f"{name}, op {i}: {op}"


# ---------------------------------------------------------------- cdiv refuses what is not a token or block count

@pytest.mark.parametrize("a, b, error, message", [
    (7, 0, ValueError, "cdiv: b must be an int >= 1, got 0"),
    (7, -2, ValueError, "cdiv: b must be an int >= 1, got -2"),
    (7, True, TypeError, "cdiv: b must be an int >= 1, got True"),
    (7, 2.0, TypeError, "cdiv: b must be an int >= 1, got 2.0"),
    (True, 3.0, TypeError, "cdiv: a must be an int, got True"),
    (7.0, 2, TypeError, "cdiv: a must be an int, got 7.0"),
    ("7", 2, TypeError, "cdiv: a must be an int, got '7'"),
    (None, 2, TypeError, "cdiv: a must be an int, got None"),
])
def test_cdiv_refuses_by_name(a, b, error, message):
    with pytest.raises(error) as got:
        cdiv(a, b)
    assert str(got.value) == message


def test_cdiv_rounds_up_for_any_int_numerator():
    assert [cdiv(a, 4) for a in (-5, -4, 0, 1, 4, 5, 10**30)] == [-1, -1, 0, 1, 1, 2, 10**30 // 4]
