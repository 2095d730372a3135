"""Block pool: eviction, duplicates, touch, the two free orders, reset and KV events."""
import pytest
from hypothesis import given, strategies as st

from kvref.core.block_pool import AllBlocksCleared, BlockHashToBlockMap, BlockPool, BlockRemoved, BlockStored
from kvref.core.free_queue import KVCacheBlock, block_ids


def queue(pool):
    return block_ids(pool.free_block_queue.get_all_free_blocks())


def test_null_block_is_reserved_and_never_freed():
    pool = BlockPool(4)
    assert pool.null_block is pool.blocks[0] and pool.null_block.is_null
    assert queue(pool) == [1, 2, 3] and pool.get_num_free_blocks() == 3
    pool.touch([pool.null_block])          # placeholder entries in a table are touched...
    pool.free_blocks([pool.null_block])    # ...and freed without ever entering the queue
    assert queue(pool) == [1, 2, 3]
    assert pool.get_usage() == 0.0
    assert all(not b.is_null for b in BlockPool(4, null_block=False).blocks)


def test_get_new_blocks_evicts_lazily_from_the_head():
    pool = BlockPool(5, enable_kv_cache_events=True)
    a = pool.get_new_blocks(2)
    pool.cache_full_blocks(a, [b"h1", b"h2"], 0, 2, block_size=2, token_ids=[1, 2, 3, 4])
    pool.free_blocks(reversed(a))
    assert queue(pool) == [3, 4, 2, 1]
    assert pool.get_cached_block(b"h1") is a[0]   # still cached while free
    got = pool.get_new_blocks(3)                 # 3, 4, then evicts 2 (hash h2)
    assert block_ids(got) == [3, 4, 2] and all(b.ref_cnt == 1 for b in got)
    assert pool.get_cached_block(b"h2") is None and a[1].block_hash is None
    assert pool.get_cached_block(b"h1") is a[0]
    events = pool.take_events()
    assert events == [BlockStored([b"h1", b"h2"], None, [1, 2, 3, 4], 2, None), BlockRemoved([b"h2"])]


def test_duplicates_lookup_earliest_and_survive_eviction_of_one():
    pool = BlockPool(4)
    x, y = pool.get_new_blocks(1), pool.get_new_blocks(1)
    pool.cache_full_blocks(x, [b"h"], 0, 1, block_size=4)
    pool.cache_full_blocks(y, [b"h"], 0, 1, block_size=4)
    assert list(pool.cached_block_hash_to_block[b"h"]) == [1, 2]
    assert pool.get_cached_block(b"h") is x[0]
    pool.free_blocks(x)
    pool.get_new_blocks(2)                      # 3 then 1: x is evicted
    assert pool.get_cached_block(b"h") is y[0]
    assert list(pool.cached_block_hash_to_block[b"h"]) == [2]


def test_touch_takes_free_hits_out_of_the_queue_only_once():
    pool = BlockPool(4)
    a = pool.get_new_blocks(2)
    pool.cache_full_blocks(a, [b"p", b"q"], 0, 2, block_size=1)
    pool.free_blocks(reversed(a))
    pool.touch(a)
    assert queue(pool) == [3] and [b.ref_cnt for b in a] == [1, 1]
    pool.touch(a)                               # held blocks: count only
    assert queue(pool) == [3] and [b.ref_cnt for b in a] == [2, 2]


@given(st.lists(st.booleans(), min_size=1, max_size=8), st.booleans())
def test_free_orders(hashed, unhashed_first):
    "Walk order kept; vLLM 0.33 puts hashless blocks at the head, the design doc puts everything at the tail."
    pool = BlockPool(len(hashed) + 2, null_block=True)
    table = pool.get_new_blocks(len(hashed))
    for i, (block, h) in enumerate(zip(table, hashed)):
        if h: pool.cache_full_blocks([block], [bytes([i])], 0, 1, block_size=1)
    rest = queue(pool)
    walk = list(reversed(table))
    pool.free_blocks(walk, unhashed_first=unhashed_first)
    if unhashed_first:
        head = [b.block_id for b in walk if b.block_hash is None]
        tail = [b.block_id for b in walk if b.block_hash is not None]
        assert queue(pool) == head + rest + tail
    else:
        assert queue(pool) == rest + block_ids(walk)


def test_shared_block_returns_only_when_last_holder_frees():
    pool = BlockPool(3)
    (b,) = pool.get_new_blocks(1)
    pool.touch([b])
    pool.free_blocks([b])
    assert b.ref_cnt == 1 and queue(pool) == [2]
    pool.free_blocks([b])
    assert b.ref_cnt == 0 and queue(pool) == [2, 1]
    with pytest.raises(ValueError, match="block 1 is freed but not held"):
        pool.free_blocks([b])


def test_reset_prefix_cache_refused_while_held_then_clears_everything():
    for null in (True, False):
        pool = BlockPool(4, null_block=null, enable_kv_cache_events=True)
        a = pool.get_new_blocks(2)
        pool.cache_full_blocks(a, [b"1", b"2"], 0, 2, block_size=1, lora_name="L")
        order = queue(pool)
        assert pool.reset_prefix_cache() is False and pool.get_cached_block(b"1") is a[0]
        pool.free_blocks(reversed(a))
        order = queue(pool)
        assert pool.reset_prefix_cache() is True
        assert queue(pool) == order and pool.cached_block_hash_to_block == {}
        assert all(b.block_hash is None for b in pool.blocks)
        ev = pool.take_events()
        assert ev[0].lora_name == "L" and ev[-1] == AllBlocksCleared()


def test_events_off_by_default_and_parent_hash_chains():
    pool = BlockPool(6)
    pool.cache_full_blocks(pool.get_new_blocks(1), [b"a"], 0, 1, block_size=1)
    assert pool.take_events() == []
    epool = BlockPool(6, enable_kv_cache_events=True)
    table = epool.get_new_blocks(3)
    epool.cache_full_blocks(table, [b"a", b"b", b"c"], 0, 1, block_size=2, token_ids=[5, 6, 7, 8, 9, 10])
    epool.cache_full_blocks(table, [b"a", b"b", b"c"], 1, 3, block_size=2, token_ids=[5, 6, 7, 8, 9, 10])
    e1, e2 = epool.take_events()
    assert (e1.parent_block_hash, e1.token_ids) == (None, [5, 6])
    assert (e2.block_hashes, e2.parent_block_hash, e2.token_ids) == ([b"b", b"c"], b"a", [7, 8, 9, 10])


def test_bad_input():
    with pytest.raises(ValueError, match=r"num_blocks must be an int >= 1, got 0"):
        BlockPool(0)
    assert BlockPool(1).get_num_free_blocks() == 0      # vLLM accepts one block: the null block, nothing to give
    with pytest.raises(TypeError, match="got 2.5"):  # the wrong kind of value
        BlockPool(2.5)
    pool = BlockPool(3)
    with pytest.raises(ValueError, match="cannot get 3 free blocks from the pool: only 2 are free"):
        pool.get_new_blocks(3)
    a = pool.get_new_blocks(1)
    pool.cache_full_blocks(a, [b"x"], 0, 1, block_size=1)
    with pytest.raises(ValueError, match="block 1 is already cached"):
        pool.cache_full_blocks(a, [b"y"], 0, 1, block_size=1)
    assert queue(pool) == [2] and pool.get_cached_block(b"x") is a[0]


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3), st.integers(0, 5)), max_size=60))
def test_cache_map_equals_a_dict_of_dicts(ops):
    "The compact map (a block, or a dict for duplicates) reads exactly like the plain dict of dicts."
    blocks, compact, plain = [KVCacheBlock(i) for i in range(6)], BlockHashToBlockMap(), {}
    for insert, h, i in ops:
        key = bytes([h])
        if insert and i not in plain.get(key, {}):
            if i % 2: compact.insert(key, blocks[i])
            else: compact.insert_all([key], [blocks[i]])
            plain.setdefault(key, {})[i] = blocks[i]
        elif not insert and i in plain.get(key, {}):
            compact.pop(key, i)
            del plain[key][i]
            if not plain[key]: del plain[key]
        assert compact == plain and len(compact) == len(plain) and list(compact) == list(plain)
        for key, holders in plain.items():
            assert list(compact[key].items()) == list(holders.items())   # earliest first
            assert compact.get_one_block(key) is next(iter(holders.values()))
    assert compact.get_one_block(b"never") is None and b"never" not in compact


@given(st.lists(st.lists(st.integers(0, 4), max_size=6), max_size=8))
def test_insert_all_equals_inserting_one_by_one(batches):
    "insert_all (one dict.update when every hash is new) leaves the map as inserting each block in order does."
    blocks, one_by_one, at_once = [KVCacheBlock(i) for i in range(64)], BlockHashToBlockMap(), BlockHashToBlockMap()
    next_block = 0
    for hashes in batches:
        keys, run = [bytes([h]) for h in hashes], blocks[next_block:next_block + len(hashes)]
        next_block += len(hashes)
        for key, block in zip(keys, run): one_by_one.insert(key, block)
        at_once.insert_all(keys, run)
        assert at_once == one_by_one and [list(at_once[k]) for k in at_once] == [list(one_by_one[k]) for k in one_by_one]
