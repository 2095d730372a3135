"""Mamba groups (align mode): every recorded vLLM 0.33 Mamba trace decision by decision, the same-step refusal,
sub-block hits with copy-on-write, and the errors for bad Mamba configurations."""
import json
from pathlib import Path

import pytest

from kvref.core.hybrid import FullAttentionSpec, HybridKVCacheManager, HybridRequest, SlidingWindowSpec, spec_from_group
from kvref.oracle.hybrid_replay import HybridTraceReplayer
from kvref.core.mamba import MambaSpec

MAMBA = Path(__file__).resolve().parent.parent / "golden" / "hybrid" / "mamba"
TRACES = ["hybrid-nemotron-h-9-0", "hybrid-qwen3-next-9-1", "hybrid-jamba-9-2"]


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_golden_mamba_traces_are_present():
    assert {p.name for p in MAMBA.glob("*.jsonl")} == {f"{n}{ext}" for n in TRACES for ext in (".jsonl", ".vllm.jsonl")}


@pytest.mark.parametrize("name", TRACES)
def test_every_vllm_mamba_decision_reproduced(name):
    ops, want = read(MAMBA / f"{name}.jsonl"), read(MAMBA / f"{name}.vllm.jsonl")
    replayer = HybridTraceReplayer()
    for i, (op, w) in enumerate(zip(ops, want, strict=True)):
        got = replayer.apply(op)
        assert got == w, f"op {i}: {op}"
        assert list(got) == list(w), "keys in the recorded order"


def qwen_like():
    "One Gated DeltaNet group and full attention, block 8, hash unit 2: sub-block hits on."
    return HybridKVCacheManager([MambaSpec(8, 8), FullAttentionSpec(8)], 16, prefix_match_unit=2)


def test_partial_hash_hits_only_with_a_mamba_block_larger_than_the_hash_unit():
    assert qwen_like().coordinator.alignment_tokens == 2
    assert HybridKVCacheManager([MambaSpec(8), FullAttentionSpec(8)], 16).coordinator.alignment_tokens == 8
    sliding = HybridKVCacheManager([MambaSpec(8), SlidingWindowSpec(8, 16), FullAttentionSpec(8)], 16, prefix_match_unit=2)
    assert not sliding.coordinator.partial_hash_hits, "a sliding group with a larger block turns sub-block hits off"


def test_sub_block_hit_copies_and_the_step_releases_both_ends():
    manager = qwen_like()
    a, b = HybridRequest("a", list(range(13))), HybridRequest("b", list(range(13)) + [50, 51, 52])
    manager.allocate_slots(a, 12); a.num_computed_tokens = 12
    hits, num_hit, _ = manager.get_computed_blocks(b)
    assert num_hit == 12
    assert manager.allocate_slots(b, 4, num_hit, hits) is None, "the Mamba tail was cached in this step"
    manager.new_step_starts()
    hits, num_hit, _ = manager.get_computed_blocks(b)
    assert manager.coordinator.get_num_blocks_to_allocate("b", 16, hits, 12) == 2, "one copy per group"
    manager.allocate_slots(b, 4, num_hit, hits)
    assert manager.get_block_ids("b") == [[0, 4], [2, 5]]
    copies = manager.take_kv_cache_block_copies()
    assert [(s.block_id, d.block_id) for s, d in copies] == [(1, 4), (3, 5)]
    assert [manager.block_pool.blocks[i].ref_cnt for i in (1, 3, 4, 5)] == [2, 2, 2, 2]
    manager.block_pool.free_blocks([x for pair in copies for x in pair], unhashed_first=True)
    assert [manager.block_pool.blocks[i].ref_cnt for i in (1, 3, 4, 5)] == [1, 1, 1, 1]
    assert manager.take_kv_cache_block_copies() == []


def test_snapshot_moves_the_key_to_the_copy():
    manager = qwen_like()
    a = HybridRequest("a", list(range(13)))
    manager.allocate_slots(a, 12); a.num_computed_tokens = 12
    key = manager.block_pool.blocks[1].block_hash
    manager.new_step_starts()
    assert manager.coordinator.get_num_blocks_to_allocate("a", 13, [[], []], 12) == 1
    manager.allocate_slots(a, 1)
    assert manager.block_pool.blocks[1].block_hash is None and manager.block_pool.blocks[4].block_hash == key
    assert manager.get_block_ids("a")[0] == [0, 1]


def test_same_step_hit_is_refused_and_changes_nothing_then_admitted_next_step():
    manager = HybridKVCacheManager([MambaSpec(4, 1), FullAttentionSpec(4)], 24, retention_interval=None)
    manager.allocate_slots(HybridRequest("a", list(range(22))), 22)
    b = HybridRequest("b", list(range(22)) + [1, 2, 3])
    hits, num_hit, _ = manager.get_computed_blocks(b)
    assert num_hit == 20
    before = (manager.get_free_queue_ids(), manager.get_block_ids("a"))
    assert manager.allocate_slots(b, 5, num_hit, hits) is None
    assert (manager.get_free_queue_ids(), manager.get_block_ids("a"), manager.get_block_ids("b")) == (*before, [[], []])
    manager.new_step_starts()
    hits, num_hit, _ = manager.get_computed_blocks(b)
    assert manager.allocate_slots(b, 5, num_hit, hits) is not None
    assert manager.get_block_ids("b")[0] == [0, 0, 0, 0, 1, 9, 10]


def test_preempted_request_starts_over():
    "free forgets the Mamba bookkeeping: a recomputed request takes a first allocation's blocks again."
    manager = HybridKVCacheManager([MambaSpec(4, 1), FullAttentionSpec(4)], 30, retention_interval=0)
    a = HybridRequest("a", list(range(30)))
    manager.allocate_slots(a, 16); manager.free(a)
    mamba = manager.coordinator.single_type_managers[0]
    assert "a" not in mamba.allocated_block_reqs and "a" not in mamba.last_state_block_idx
    assert manager.allocate_slots(a, 16) is not None
    assert manager.get_block_ids("a")[0] == [0, 0, 0, 1], "under retention 0 only the chunk reaching the prefill end reserves a checkpoint"


@pytest.mark.parametrize("group, message", [
    ({"kind": "mamba", "block_size": 8, "mamba_cache_mode": "none"}, "groups[0].mamba_cache_mode must be 'align'"),
    ({"kind": "mamba", "block_size": 8, "mamba_cache_mode": "all"}, "groups[0].mamba_cache_mode must be 'align'"),
    ({"kind": "mamba", "block_size": 0}, "groups[0].block_size must be an int >= 1, got 0"),
    ({"kind": "mamba", "block_size": 8, "checkpoint_alignment": 0}, "groups[0].checkpoint_alignment must be an int >= 1"),
    ({"kind": "mamba", "block_size": 8, "checkpoint_alignment": True}, "groups[0].checkpoint_alignment must be an int >= 1, got True"),
    ({"kind": "mamba", "block_size": 8, "sliding_window": 4}, "groups[0] has unknown field 'sliding_window'"),
])
def test_bad_mamba_group_names_the_field(group, message):
    with pytest.raises(ValueError) as e: spec_from_group(group, 0)
    assert message in str(e.value)


def test_mamba_group_without_align_mode_in_a_trace():
    with pytest.raises(ValueError, match=r"groups\[2\]\.mamba_cache_mode must be 'align'"):
        HybridTraceReplayer().apply({"op": "config", "num_blocks": 8, "groups": [
            {"kind": "full", "block_size": 4}, {"kind": "mamba", "block_size": 4, "mamba_cache_mode": None},
            {"kind": "mamba", "block_size": 4, "mamba_cache_mode": "none"}]})


def full_block_with_a_tail_key():
    "`a` (13 tokens) computes its prompt in two steps, then fills full attention's block 1 with three decoded tokens."
    manager = HybridKVCacheManager([FullAttentionSpec(8), MambaSpec(8)], 16, prefix_match_unit=2)
    a = HybridRequest("a", list(range(13)))
    for num_new, output in ((12, None), (1, [100, 101, 102]), (3, None)):
        manager.allocate_slots(a, num_new); a.num_computed_tokens += num_new
        if output: a.append_output_token_ids(output)
        manager.block_pool.free_blocks([x for pair in manager.take_kv_cache_block_copies() for x in pair], unhashed_first=True)
        manager.new_step_starts()
    return manager, a


def keys_of(pool, block) -> set:
    "Every key the pool's map holds `block` under."
    return {key for key in pool.cached_block_hash_to_block if block.block_id in pool.cached_block_hash_to_block[key]}


def test_a_full_block_keeps_its_prompt_tail_key_beside_the_full_one():
    "vLLM's cache_partial_block adds the prompt tail's key to a block that filled up (its second key); a later request hits it."
    manager, a = full_block_with_a_tail_key()
    pool, block = manager.block_pool, manager.block_pool.blocks[2]
    assert len(keys_of(pool, block)) == 2 and block.block_hash in keys_of(pool, block)
    b = HybridRequest("b", list(range(13)) + list(range(50, 56)))
    hits, num_hit, _ = manager.get_computed_blocks(b)
    assert num_hit == 12 and [x.block_id for x in hits[0]] == [1, 2]
    manager.allocate_slots(b, b.num_tokens - 12, num_hit, hits)
    assert manager.get_block_ids("b") == [[1, 5, 6], [0, 7, 8]]  # vLLM 0.33's tables (tests/test_hybrid_vs_vllm.py)


def test_evicting_or_resetting_drops_every_key_of_a_block():
    "A reused block leaves no key behind in the map (vLLM's _remove_cached_block_hashes), nor does a reset."
    manager, a = full_block_with_a_tail_key()
    pool, block = manager.block_pool, manager.block_pool.blocks[2]
    manager.free(a)
    pool.get_new_blocks(pool.get_num_free_blocks())  # evicts every cached block, block 2 included
    assert keys_of(pool, block) == set() and len(pool.cached_block_hash_to_block) == 0
    manager, a = full_block_with_a_tail_key()
    manager.free(a)
    assert manager.reset_prefix_cache() and len(manager.block_pool.cached_block_hash_to_block) == 0
    assert manager.block_pool.cached_block_hashes_by_block == {}, "no further key left to drop later"


def test_a_state_keyed_for_more_tokens_gets_a_shorter_key_beside_it():
    "vLLM's cache_partial_block keeps a block's key for more tokens and adds one for fewer beside it."
    manager = qwen_like()
    mamba = manager.coordinator.single_type_managers[0]
    a = HybridRequest("a", list(range(13)))
    manager.allocate_slots(a, 12); a.num_computed_tokens = 12
    (block,) = manager.block_pool.get_new_blocks(1)
    longer = mamba.cache_partial_block(a, block, 8)
    shorter = mamba.cache_partial_block(a, block, 6)
    assert block.block_hash == longer and manager.block_pool.cached_block_hashes_by_block == {block.block_id: {shorter}}
    assert manager.block_pool.get_cached_block(shorter) is block
