"""The CPU offload tier's refusals and invariants (chapter 06d): bad settings are named and change nothing; the pool's
policies keep their books."""
from dataclasses import replace

import pytest
from hypothesis import given, strategies as st

from kvref.core.kv_cache_manager import KVCacheManager, Request
from kvref.kv_offload import (ARCCachePolicy, ChunkStatus, CPUOffloadingManager, LRUCachePolicy, OffloadConfig,
                           OffloadingConnector, ReqContext)
from kvref.core.scheduler import Scheduler


@pytest.mark.parametrize("settings, error, words", [
    (dict(cpu_chunks=-1), ValueError, "cpu_chunks"), (dict(cpu_chunks=True), TypeError, "cpu_chunks"),
    (dict(cpu_chunks=4, eviction_policy="fifo"), ValueError, "eviction_policy"),
    (dict(cpu_chunks=4, block_size=0), ValueError, "block_size"),
    (dict(cpu_chunks=4, offload_prompt_only=1), TypeError, "offload_prompt_only"),
    (dict(cpu_chunks=4, worker="fast"), ValueError, "worker"),
    (dict(cpu_chunks=4, store_threshold=-2), ValueError, "store_threshold")])
def test_bad_settings_are_named(settings, error, words):
    with pytest.raises(error, match=words): OffloadConfig(**settings)


def test_workload_settings_use_vllm_names_and_refuse_unknown_ones():
    assert OffloadConfig.of({"cpu_chunks": 2, "policy": "arc", "record_events": False}).eviction_policy == "arc"
    with pytest.raises(ValueError, match="unknown offload setting 'cpu_bytes'"): OffloadConfig.of({"cpu_chunks": 2, "cpu_bytes": 9})
    with pytest.raises(TypeError, match="dict"): OffloadConfig.of([("cpu_chunks", 2)])


def test_chunk_must_be_a_multiple_of_the_gpu_block():
    with pytest.raises(ValueError, match="multiple of the GPU block size 4"): OffloadingConnector(OffloadConfig(4, block_size=6), KVCacheManager(8, 4))


def test_scheduler_refuses_what_it_cannot_take():
    with pytest.raises(ValueError, match="record_trace=False"): Scheduler(KVCacheManager(8, 4), offload=OffloadConfig(4))
    with pytest.raises(TypeError, match="OffloadConfig"): Scheduler(KVCacheManager(8, 4), record_trace=False, offload={"cpu_chunks": 4})
    s = Scheduler(KVCacheManager(8, 4), record_trace=False, offload=OffloadConfig(4))
    with pytest.raises(TypeError, match="reset_connector"): s.reset_prefix_cache(reset_connector="yes")
    assert s.connector.manager.policy.chunks == {} and not getattr(s.connector_prefix_cache_stats, "reset", False)


def test_allocate_slots_refuses_bad_load_arguments_and_changes_nothing():
    kv, r = KVCacheManager(8, 4), Request("a", list(range(1, 9)))
    with pytest.raises(ValueError, match="reserved_blocks"): kv.allocate_slots(r, 8, reserved_blocks=-1)
    with pytest.raises(TypeError, match="delay_cache_blocks"): kv.allocate_slots(r, 8, delay_cache_blocks=1)
    assert kv.num_free_blocks == 7 and "a" not in kv.req_to_blocks


def test_delayed_blocks_are_not_cached_and_reserved_blocks_are_left_free():
    kv, r = KVCacheManager(8, 4), Request("a", list(range(1, 9)))
    assert kv.allocate_slots(r, 8, reserved_blocks=6) is None  # 7 free, 6 reserved: 2 needed do not fit
    assert kv.allocate_slots(r, 8, delay_cache_blocks=True) is not None
    assert kv.get_computed_blocks(Request("b", list(range(1, 10))))[1] == 0


keys = st.lists(st.binary(min_size=1, max_size=2), min_size=1, max_size=8, unique=True)


@given(keys, st.integers(1, 6), st.sampled_from(["lru", "arc"]))
def test_a_failed_store_changes_nothing_and_the_books_balance(offered, capacity, policy):
    m = CPUOffloadingManager(capacity, policy)
    ctx = ReqContext("r", positions={k: 4 * (i + 1) for i, k in enumerate(offered)})
    result = m.prepare_store(offered, ctx)
    if result is None:
        assert m.policy.chunks == {} and m.num_write_pending == 0
        return
    stored, evicted = result
    assert len(stored) == min(len(offered), capacity) or evicted == [] and m.num_write_pending == len(stored)
    m.complete_store(stored, ctx)
    assert m.num_evictable == len(m.policy.chunks) == len(stored) <= capacity


def arc_with(t1, t2, target=0.0):
    arc = ARCCachePolicy(4)
    for key in t1: arc.insert(key, ChunkStatus(0, ref_cnt=0), ReqContext("r"))
    for key in t2: arc.insert(key, ChunkStatus(0, ref_cnt=0), ReqContext("r")); arc.t2[key] = arc.t1.pop(key)
    arc.target_t1_size = target
    return arc


def test_arc_evicts_from_t1_while_it_is_at_least_its_target():
    assert [k for k, _ in arc_with([b"a", b"b"], [b"c", b"d"], target=2.0).evict(1, set())] == [b"a"]  # |T1| = target
    assert [k for k, _ in arc_with([b"a", b"b"], [b"c", b"d"], target=3.0).evict(1, set())] == [b"c"]  # |T1| < target


def test_arc_ghost_hits_move_the_target():
    arc = arc_with([b"a", b"b"], [b"c", b"d"])
    arc.evict(1, set())  # a -> B1
    arc.on_store_miss([b"a"], ReqContext("s"))
    assert arc.target_t1_size == 1 and list(arc.b1) == [b"a"]
    arc.evict(1, set()); arc.evict(1, set())  # |T1| = 1 >= 1: b -> B1; then T1 empty: c from T2 -> B2
    arc.on_store_miss([b"c"], ReqContext("s"))
    assert arc.target_t1_size == 0 and list(arc.b2) == [b"c"]


def test_lru_evicts_a_requests_tail_first_and_refuses_without_change():
    lru, ctx = LRUCachePolicy(4), ReqContext("r", positions={b"h": 4, b"t": 8})
    for key in (b"h", b"t"): lru.insert(key, ChunkStatus(0, ref_cnt=0), ctx)
    assert lru.evict(3, set()) is None and lru.order() == [b"t", b"h"]
    assert [k for k, _ in lru.evict(1, set())] == [b"t"]
