"""A refused call changes nothing: issue 12's reproducers for the free queue, the block pool and the KV cache
manager, then a property test that every mutating public method, given bad input, raises a named
`TypeError`/`ValueError` and leaves the whole state (free queue order and links, ref counts, cache map, tables,
counters, events) exactly as it was."""
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvref.core.block_pool import BlockPool
from kvref.core.free_queue import FreeKVCacheBlockQueue, KVCacheBlock, block_ids
from kvref.core.hashing import LoRARequest, MultiModalItem
from kvref.core.kv_cache_manager import KVCacheManager, Request


# ---------------------------------------------------------------- state snapshots

def queue_state(q: FreeKVCacheBlockQueue, blocks) -> tuple:
    "Order, counters and every block's links (by id): all a queue's observable state."
    link = lambda b: None if b is None else (b.block_id, id(b))
    return (block_ids(q.get_all_free_blocks()), q.num_free_blocks,
            [(link(b.prev_free_block), link(b.next_free_block)) for b in blocks])


def pool_state(pool: BlockPool) -> tuple:
    return (queue_state(pool.free_block_queue, pool.blocks),
            [(b.ref_cnt, b.block_hash, b.is_null) for b in pool.blocks],
            {h: list(v) for h, v in pool.cached_block_hash_to_block.items()},
            None if pool.kv_event_queue is None else list(pool.kv_event_queue))


def manager_state(m: KVCacheManager, requests=()) -> tuple:
    "The pool, the tables and counters, and each request's tokens and computed count (its hash memo excluded:"
    " computing hashes of valid tokens is a pure function, whether or not the call went through)."
    return (pool_state(m.block_pool), {r: block_ids(t) for r, t in m.req_to_blocks.items()},
            dict(m.num_cached_block), dict(m.live_requests),
            [(r.request_id, list(r.all_token_ids), r.num_computed_tokens) for r in requests])


def refused(call, state, error=(TypeError, ValueError), match=None):
    "`call()` raises `error` (matching `match`) and `state()` is unchanged."
    before = state()
    with pytest.raises(error, match=match):
        call()
    assert state() == before


# ---------------------------------------------------------------- free queue

def fresh_queue(n=4):
    blocks = [KVCacheBlock(i) for i in range(n)]
    return blocks, FreeKVCacheBlockQueue(blocks)


def test_queue_refuses_a_block_twice_in_one_call():
    blocks, q = fresh_queue()
    held = q.popleft_n(2)
    state = lambda: queue_state(q, blocks)
    refused(lambda: q.append_n([held[0], held[0]]), state, ValueError, "block 0 appears twice")
    refused(lambda: q.prepend_n([held[0], held[1], held[0]]), state, ValueError, "block 0 appears twice")
    b = KVCacheBlock(7)
    with pytest.raises(ValueError, match="block 7 appears twice"):
        FreeKVCacheBlockQueue([b, b])
    assert b.prev_free_block is None and b.next_free_block is None


def test_queue_refuses_another_queues_block():
    blocks, q = fresh_queue()
    others, other = fresh_queue()
    q.popleft()
    state = lambda: (queue_state(q, blocks), queue_state(other, others))
    refused(lambda: q.append(others[1]), state, ValueError, "block 1 is already in another free queue")
    refused(lambda: q.remove(others[1]), state, ValueError, "block 1 is not in the free queue")
    with pytest.raises(ValueError, match="block 2 is already in another free queue"):
        FreeKVCacheBlockQueue([others[2]])
    assert queue_state(other, others) == state()[1]


def test_queue_refuses_bad_counts_and_types():
    blocks, q = fresh_queue()
    state = lambda: queue_state(q, blocks)
    for n in (-1, True, 1.0, "1"):
        refused(lambda: q.popleft_n(n), state, ValueError if type(n) is int else TypeError, "n must be an int >= 0")
    refused(lambda: q.append_n([None]), state, TypeError, "must be KVCacheBlock")
    refused(lambda: q.remove(3), state, TypeError, "must be a KVCacheBlock")
    refused(lambda: q.append_n(5), state, TypeError, "must be an iterable of KVCacheBlock")


# ---------------------------------------------------------------- block pool

def test_free_blocks_validates_before_decrementing():
    pool = BlockPool(5)
    held = pool.get_new_blocks(2)
    never_held = pool.blocks[3]
    state = lambda: pool_state(pool)
    refused(lambda: pool.free_blocks([held[0], never_held]), state, ValueError, "block 3 is freed but not held")
    refused(lambda: pool.free_blocks([held[0], held[0]]), state, ValueError, "block 1 is freed 2 times but held 1")
    refused(lambda: pool.free_blocks([held[0], None]), state, TypeError, "must be KVCacheBlock")
    stranger = BlockPool(5).get_new_blocks(1)[0]
    refused(lambda: pool.free_blocks([held[0], stranger]), state, ValueError, "block 1 is not a block of this pool")
    pool.touch(held[:1])
    pool.free_blocks([held[0], held[0]])     # held twice, freed twice: fine
    assert held[0].ref_cnt == 0 and block_ids(pool.free_block_queue.get_all_free_blocks())[-1] == 1


def test_touch_validates_before_counting():
    pool = BlockPool(5)
    held = pool.get_new_blocks(1)[0]
    free_block = pool.blocks[3]
    state = lambda: pool_state(pool)
    refused(lambda: pool.touch([held, KVCacheBlock(99)]), state, ValueError, "block 99 is not a block of this pool")
    refused(lambda: pool.touch([free_block, BlockPool(5).blocks[2]]), state, ValueError, "not a block of this pool")
    refused(lambda: pool.touch([free_block, "x"]), state, TypeError)


def test_cache_full_blocks_validates_before_mapping():
    pool = BlockPool(6, enable_kv_cache_events=True)
    b1, b2, b3 = pool.get_new_blocks(3)
    pool.cache_full_blocks([b2], [b"h2"], 0, 1, block_size=1)
    state = lambda: pool_state(pool)
    refused(lambda: pool.cache_full_blocks([b1, b2], [b"h1", b"h2"], 0, 2, block_size=1), state, ValueError,
            "block 2 is already cached")
    refused(lambda: pool.cache_full_blocks([b1], [None], 0, 1, block_size=1), state, TypeError, "block_hashes")
    refused(lambda: pool.cache_full_blocks([b1], ["h1"], 0, 1, block_size=1), state, TypeError, "block_hashes")
    refused(lambda: pool.cache_full_blocks([b1, b1], [b"x", b"y"], 0, 2, block_size=1), state, ValueError, "twice")
    refused(lambda: pool.cache_full_blocks([pool.blocks[5]], [b"x"], 0, 1, block_size=1), state, ValueError,
            "block 5 is not held")
    refused(lambda: pool.cache_full_blocks([b1], [b"x"], -1, 1, block_size=1), state, ValueError, "num_cached_blocks")
    refused(lambda: pool.cache_full_blocks([b1], [b"x"], 0, 1, block_size=0), state, ValueError, "block_size")
    refused(lambda: pool.cache_full_blocks([KVCacheBlock(1)], [b"x"], 0, 1, block_size=1), state, ValueError,
            "not a block of this pool")
    refused(lambda: pool.cache_full_blocks([b1], [b"x"], 0, 1, block_size=1, lora_name=3), state, TypeError, "lora_name")


def test_get_new_blocks_refuses_bad_counts():
    pool = BlockPool(5)
    for n in (-10**18, -1, True, 2.0):
        refused(lambda: pool.get_new_blocks(n), lambda: pool_state(pool), ValueError if type(n) is int else TypeError,
                "num_blocks must be an int >= 0")


def test_pool_constructor_types():
    for kw in ({"enable_caching": 1}, {"null_block": "yes"}, {"enable_kv_cache_events": None}):
        with pytest.raises(TypeError, match=f"{next(iter(kw))} must be a bool"):
            BlockPool(4, **kw)
    with pytest.raises(TypeError, match="num_blocks must be an int >= 1, got True"):  # a wrong kind: kvref.guards
        BlockPool(True)


def test_one_block_pool_is_valid_and_has_nothing_to_give():
    "vLLM accepts num_blocks=1: block 0 is the null block, so every allocation is refused."
    pool = BlockPool(1)
    assert pool.get_num_free_blocks() == 0 and pool.get_usage() == 0.0 and pool.reset_prefix_cache()
    m = KVCacheManager(1, 4)
    r = Request("r", [1, 2, 3])
    before = manager_state(m, [r])
    assert m.get_computed_blocks(r) == ([], 0) and m.allocate_slots(r, 3) is None
    assert manager_state(m, [r]) == before and m.usage == 0.0
    with pytest.raises(ValueError, match=">= 1"):
        KVCacheManager(0, 4)


# ---------------------------------------------------------------- KV cache manager: hash inputs

@pytest.mark.parametrize("kwargs, error, match", [
    (dict(prompt_token_ids=[1, 2**64]), ValueError, r"request 'a': token_ids\[1\] is 18446744073709551616"),
    (dict(prompt_token_ids=[1, True]), TypeError, r"request 'a': token_ids\[1\] is True"),
    (dict(prompt_token_ids=[1, 2], cache_salt=123), TypeError, "request 'a': cache_salt must be a str or None"),
    (dict(prompt_token_ids=[1, 2], lora_request={"name": "L", "path": "/l"}), TypeError,
     "request 'a': lora_request must be a LoRARequest or None"),
    (dict(prompt_token_ids=[1, 2], mm_items=(MultiModalItem("img", 1, 4),)), ValueError,
     "multimodal item 'img' covers tokens"),
    (dict(prompt_token_ids=[1, 2], mm_items=MultiModalItem("img", 0, 1)), TypeError, "mm_items must be"),
    (dict(prompt_token_ids=5), TypeError, "prompt_token_ids must be"),
    (dict(prompt_token_ids=[1, 2], num_computed_tokens=-1), ValueError, "num_computed_tokens"),
])
def test_request_checks_its_hash_inputs_when_built(kwargs, error, match):
    with pytest.raises(error, match=match):
        Request("a", **kwargs)


def test_appended_tokens_are_checked_before_anything_is_appended():
    r = Request("a", [1, 2, 3])
    for bad in ([4, 2**64], 2**64, [4, -1], [4, "5"], True, [4.0]):
        with pytest.raises((TypeError, ValueError), match="request 'a'"):
            r.append_output_token_ids(bad)
        assert r.all_token_ids == [1, 2, 3]
    r.append_output_token_ids(2**64 - 1)
    assert r.all_token_ids[-1] == 2**64 - 1


def test_a_request_that_would_fail_at_hashing_time_is_never_built():
    "Issue 12: these used to be allocated first, then fail to hash, with the blocks already in the table."
    m = KVCacheManager(8, 2)
    r = Request("a", [1, 2, 3])
    with pytest.raises(ValueError, match="token_ids"):
        r.append_output_token_ids([2**64])
    assert m.allocate_slots(r, 3) is not None and m.get_block_ids("a") == [1, 2]


# ---------------------------------------------------------------- KV cache manager: trusted inputs that lie

def cached_setup():
    "A manager with request p's 3 full blocks cached and freed, and q holding unhashed blocks."
    m = KVCacheManager(12, 2)
    p = Request("p", [1, 2, 3, 4, 5, 6, 7])
    assert m.allocate_slots(p, 7) is not None
    p.num_computed_tokens = 7
    m.free(p)
    q = Request("q", [9, 9, 9])
    assert m.allocate_slots(q, 1, num_lookahead_tokens=3) is not None
    q.num_computed_tokens = 1
    return m, q


@pytest.mark.parametrize("which", ["unhashed", "free_uncached", "null", "twice", "other_prefix", "other_manager"])
def test_allocate_slots_refuses_hits_that_are_not_this_requests_cached_blocks(which):
    m, q = cached_setup()
    r = Request("r", [1, 2, 3, 4, 5, 6, 7])
    hits, num_hit = m.get_computed_blocks(r)
    assert block_ids(hits) == [1, 2, 3]
    other = KVCacheManager(12, 2)
    bad = {"unhashed": [m.req_to_blocks["q"][0]], "free_uncached": [m.block_pool.blocks[11]],
           "null": [m.block_pool.null_block], "twice": [hits[0], hits[0]], "other_prefix": [hits[1]],
           "other_manager": [other.block_pool.blocks[1]]}[which]
    refused(lambda: m.allocate_slots(r, 7 - 2 * len(bad), 2 * len(bad), bad), lambda: manager_state(m, [q, r]),
            ValueError, "is not the block cached for|is not a block of this pool")
    assert m.allocate_slots(r, 1, num_hit, hits) is not None    # the true hits still go through


def test_hits_with_caching_off_are_refused():
    m = KVCacheManager(8, 2, enable_caching=False)
    r = Request("r", [1, 2, 3])
    refused(lambda: m.allocate_slots(r, 1, 2, [m.block_pool.blocks[1]]), lambda: manager_state(m, [r]),
            ValueError, "prefix caching is off")


def test_a_second_request_object_with_a_live_id_is_refused():
    m = KVCacheManager(8, 2)
    a = Request("a", [1, 2, 3])
    m.allocate_slots(a, 3); a.num_computed_tokens = 3
    impostor = Request("a", [7, 7, 7, 7, 7])
    state = lambda: manager_state(m, [a, impostor])
    refused(lambda: m.allocate_slots(impostor, 5), state, ValueError, "another Request object")
    refused(lambda: m.free(impostor), state, ValueError, "another Request object")
    refused(lambda: m.get_computed_blocks(impostor), state, ValueError, "another Request object")
    m.free("a")                                  # by id: the one live request is freed
    assert m.allocate_slots(impostor, 5) is not None


def test_computed_tokens_beyond_the_table_are_refused():
    m = KVCacheManager(8, 2)
    r = Request("r", [1, 2, 3, 4, 5])
    r.num_computed_tokens = 2                    # never allocated: its KV cannot be anywhere
    refused(lambda: m.allocate_slots(r, 1), lambda: manager_state(m, [r]), ValueError, "num_computed_tokens=2")
    r.num_computed_tokens = "2"
    refused(lambda: m.allocate_slots(r, 1), lambda: manager_state(m, [r]), ValueError, "num_computed_tokens")


@pytest.mark.parametrize("call, error, match", [
    (lambda m: m.free(123), TypeError, "request must be a Request or a request id"),
    (lambda m: m.allocate_slots("b", 4), TypeError, "request must be a Request"),
    (lambda m: m.get_computed_blocks("b"), TypeError, "request must be a Request"),
    (lambda m: m.allocate_slots(Request("b", [1, 2, 3]), 1, 2, [None]), TypeError, "new_computed_blocks"),
    (lambda m: m.allocate_slots(Request("b", [1, 2, 3]), True), TypeError, "num_new_tokens must be an int"),
])
def test_wrong_types_get_named_errors(call, error, match):
    m = KVCacheManager(8, 2)
    refused(lambda: call(m), lambda: manager_state(m), error, match)


@pytest.mark.parametrize("args, kwargs, error, match", [
    ((True, 4), {}, TypeError, "num_blocks must be an int >= 1, got True"),
    ((8, True), {}, TypeError, "block_size must be an int >= 1, got True"),
    ((8, 4), {"enable_caching": 1}, TypeError, "enable_caching must be a bool"),
    ((8, 4), {"strict": "no"}, TypeError, "strict must be a bool"),
    ((8, 4), {"enable_kv_cache_events": None}, TypeError, "enable_kv_cache_events must be a bool"),
    ((8, 4), {"max_model_len": True}, TypeError, "max_model_len must be an int >= 1"),
    ((8, 4), {"behavior": ["vllm_0_33"]}, TypeError, "behavior must be one of"),
    ((8, 4), {"hash_algo": 5}, ValueError, "unknown hash algorithm 5"),
])
def test_manager_constructor_refuses_wrong_types(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        KVCacheManager(*args, **kwargs)


# ---------------------------------------------------------------- property: every refusal changes nothing

PROMPTS = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 7], [9, 9], [1, 2]]


def bad_manager_calls(m: KVCacheManager, reqs: dict) -> list:
    "Calls each mutating public method of the manager, its pool and its queue must refuse, in this state."
    pool, q = m.block_pool, m.block_pool.free_block_queue
    other = KVCacheManager(len(pool.blocks) + 1, m.block_size)
    live = [reqs[r] for r in m.req_to_blocks if r in reqs]
    free_blocks = q.get_all_free_blocks()
    held = [b for b in pool.blocks if b.ref_cnt > 0 and not b.is_null]
    stranger = other.block_pool.blocks[-1]  # in the other manager's free queue
    calls = [
        lambda: q.popleft_n(-1), lambda: q.popleft_n(q.num_free_blocks + 1), lambda: q.popleft_n(True),
        lambda: q.remove(stranger), lambda: q.append_n([None]), lambda: q.append(stranger),
        lambda: q.append_n([*free_blocks[:1], *held[:1]]) if free_blocks else q.remove(pool.blocks[0]),
        lambda: q.prepend_n([*held[:1], *held[:1], None]),
        lambda: pool.get_new_blocks(-10**18), lambda: pool.get_new_blocks(pool.get_num_free_blocks() + 1),
        lambda: pool.touch([*held, stranger]), lambda: pool.touch([*free_blocks[:1], KVCacheBlock(99)]),
        lambda: pool.free_blocks([*held, *free_blocks[:1], None]), lambda: pool.free_blocks([*held, stranger]),
        lambda: pool.cache_full_blocks([*held[:1], stranger], [b"x", b"y"], 0, 2, 1),
        lambda: pool.cache_full_blocks(held[:1] or [stranger], [None], 0, 1, 1),
        lambda: m.free(123), lambda: m.allocate_slots("b", 4), lambda: m.allocate_slots(Request("z", [1]), 1, 0, [None]),
        lambda: m.allocate_slots(Request("z", [1, 2, 3, 4, 5]), 1, m.block_size, [stranger]),
        lambda: m.allocate_slots(Request("z", [1, 2, 3, 4, 5]), 1, m.block_size, [pool.null_block or stranger]),
    ]
    for r in live:
        calls += [lambda r=r: m.allocate_slots(Request(r.request_id, [1, 2]), 1),
                  lambda r=r: m.allocate_slots(r, r.num_tokens + 1), lambda r=r: m.free(Request(r.request_id, [1]))]
        if free_blocks and r.num_tokens > m.block_size:  # a hit offered to a request that already computed tokens
            calls.append(lambda r=r: m.allocate_slots(r, 1, m.block_size, free_blocks[:1]))
    for r in reqs.values():
        calls += [lambda r=r: r.append_output_token_ids([1, 2**64]), lambda r=r: r.append_output_token_ids(True)]
    return calls


class RefusalMachine(RuleBasedStateMachine):
    "Valid ops move the allocator around; in every state, every bad call is refused and changes nothing."
    @initialize(behavior=st.sampled_from(["vllm_0_33", "design_doc"]), caching=st.booleans(),
                num_blocks=st.integers(1, 9), block_size=st.integers(1, 3), events=st.booleans())
    def setup(self, behavior, caching, num_blocks, block_size, events):
        self.m = KVCacheManager(num_blocks, block_size, behavior=behavior, enable_caching=caching,
                                enable_kv_cache_events=events)
        self.reqs, self.next_id, self.num_refused = {}, 0, 0

    @rule(prompt=st.sampled_from(PROMPTS), tail=st.lists(st.integers(0, 3), max_size=4))
    def add(self, prompt, tail):
        rid = f"r{self.next_id}"; self.next_id += 1
        self.reqs[rid] = Request(rid, prompt + tail)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data(), budget=st.integers(1, 4), lookahead=st.integers(0, 2))
    def schedule(self, data, budget, lookahead):
        r = self.reqs[data.draw(st.sampled_from(sorted(self.reqs)))]
        hits, num_hit = self.m.get_computed_blocks(r) if r.num_computed_tokens == 0 else ([], 0)
        n = min(budget, r.num_tokens - r.num_computed_tokens - num_hit)
        if n == 0: r.append_output_token_ids([1]); return
        before = manager_state(self.m, self.reqs.values())
        if self.m.allocate_slots(r, n, num_hit, hits, num_lookahead_tokens=lookahead) is None:
            assert manager_state(self.m, self.reqs.values()) == before
        else: r.num_computed_tokens += num_hit + n

    @precondition(lambda self: self.reqs)
    @rule(data=st.data(), finish=st.booleans())
    def free(self, data, finish):
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        self.m.free(self.reqs[rid]); self.reqs[rid].num_computed_tokens = 0
        if finish: del self.reqs[rid]

    @rule()
    def reset(self):
        self.m.reset_prefix_cache()

    @rule(data=st.data())
    def bad_call(self, data):
        calls = bad_manager_calls(self.m, self.reqs)
        call = calls[data.draw(st.integers(0, len(calls) - 1))]
        refused(call, lambda: manager_state(self.m, self.reqs.values()))
        self.num_refused += 1

    @invariant()
    def every_bad_call_refused(self):
        "Not one drawn call but all of them, each from the same state."
        if not hasattr(self, "m"): return
        for call in bad_manager_calls(self.m, self.reqs):
            refused(call, lambda: manager_state(self.m, self.reqs.values()))


TestRefusalMachine = RefusalMachine.TestCase


# ---------------------------------------------------------------- issue 32: pools too large to build

def _huge_pools():
    from kvref.core.hybrid import FullAttentionSpec, HybridKVCacheManager, SlidingWindowSpec
    from kvref.oracle.releases import ReleaseTraceReplayer, profile_for_version
    from kvref.oracle.replay import replay
    specs = [SlidingWindowSpec(4, 8), FullAttentionSpec(4)]
    return {
        "KVCacheManager(10**12, 16)": lambda: KVCacheManager(10**12, 16),
        "BlockPool(10**9)": lambda: BlockPool(10**9),
        "HybridKVCacheManager(specs, 10**12)": lambda: HybridKVCacheManager(specs, 10**12),
        "from_config(num_blocks=10**30)": lambda: HybridKVCacheManager.from_config(
            {"op": "config", "num_blocks": 10**30, "groups": [{"kind": "full", "block_size": 4}]}),
        "a trace asking 10**12 blocks": lambda: list(replay([{"op": "config", "num_blocks": 10**12, "block_size": 4}])),
        "a release trace asking 10**12 blocks": lambda: ReleaseTraceReplayer(profile_for_version("0.19.1")).apply(
            {"op": "config", "num_blocks": 10**12, "block_size": 4}),
    }


@pytest.mark.parametrize("name", list(_huge_pools()))
def test_a_pool_too_large_to_build_is_refused_by_its_named_limit(name):
    "These ran out of memory or time (issue 32): every pool is built up front, so the pool refuses above MAX_NUM_BLOCKS."
    from kvref.core.block_pool import MAX_NUM_BLOCKS
    with pytest.raises(ValueError, match=f"is above MAX_NUM_BLOCKS={MAX_NUM_BLOCKS}"): _huge_pools()[name]()


def test_the_largest_pool_is_built():
    from kvref.core.block_pool import MAX_NUM_BLOCKS
    assert BlockPool(MAX_NUM_BLOCKS).get_num_free_blocks() == MAX_NUM_BLOCKS - 1
