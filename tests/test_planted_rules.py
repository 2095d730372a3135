"""Issue 32, planted bugs that no test caught: for each rule, the shortest test that fails when the rule is one off.
Each test names the plant it catches (kvref's own line, changed) and failed with it planted."""
import pytest

from kvref.core.hashing import MultiModalItem
from kvref.core.hybrid import (FullAttentionSpec, HybridBlockPool, HybridKVCacheManager, HybridRequest, SlidingWindowSpec,
                          hash_with_group_id, max_admission_blocks_per_request)
from kvref.distributed.kv_events import KVIndex
from kvref.core.mamba import MambaManager, MambaSpec
from kvref.oracle.releases import profile_for_version, release_block_hashes
from kvref.oracle.router_conformance import op_batches

TRACE = [{"op": "config", "num_blocks": 8, "block_size": 4}, {"op": "add", "id": "a", "prompt": list(range(9))},
         {"op": "schedule", "id": "a"}]


def test_a_sliding_window_hit_holds_the_blocks_of_one_window():
    "Plant: `need = cdiv(W, B)` instead of `cdiv(W - 1, B)` (one block too many when B divides W - 1)."
    m = HybridKVCacheManager([FullAttentionSpec(4), SlidingWindowSpec(4, 9)], 32, retention_interval=None)
    a = HybridRequest("a", list(range(16)))
    m.allocate_slots(a, 16)
    a.num_computed_tokens = 16
    hits, num_hit, _ = m.get_computed_blocks(HybridRequest("b", list(range(16)) + [99]))
    assert (num_hit, [b.is_null for b in hits[1]]) == (16, [True, True, False, False])  # 8 tokens before the 17th: 2 blocks


def test_the_sliding_window_admission_cap_counts_a_window_that_starts_mid_block():
    "Plant: the `+ 1` dropped (vLLM's SlidingWindowSpec.max_admission_blocks_per_request: cdiv(W - 1 + in-flight, B) + 1)."
    assert max_admission_blocks_per_request(SlidingWindowSpec(4, 8), 16, 64) == 7


def test_a_mamba_hit_ends_on_a_scheduler_block_boundary():
    "Plant: `end % alignment_tokens` dropped from MambaManager.find_longest_cache_hit (a state at 12 of 8-token blocks)."
    pool, hashes = HybridBlockPool(8, True), [bytes([i]) * 32 for i in range(4)]
    for i in (1, 2):  # states cached after 8 and 12 tokens (Mamba blocks of 4)
        pool.cached_block_hash_to_block.insert(hash_with_group_id(hashes[i], 0), pool.get_new_blocks(1)[0])
    hits, num_hit = MambaManager.find_longest_cache_hit(hashes, 16, [0], pool, MambaSpec(4), 8)
    assert (num_hit, [b.block_id for b in hits[0]]) == (8, [0, 1])


def test_kv_index_refuses_a_batch_after_a_gap():
    "Plant: `seq < expected` instead of `seq != expected` (a batch from the future accepted, the missing ones lost)."
    payload = next(b.payload for b in op_batches(TRACE) if b.payload is not None)
    with pytest.raises(ValueError, match="sequence gap: expected seq 0"): KVIndex(4).apply("e", 1, payload)


@pytest.mark.parametrize("version, counts", [("0.18.0", True), ("0.19.0", False)])
def test_before_0_19_an_item_ending_at_a_decode_blocks_start_is_in_its_keys(version, counts):
    "Plant: `touches_start = start` for every release (the pre-0.19 boundary of decode-completed blocks lost)."
    profile, tokens, image = profile_for_version(version), list(range(8)), MultiModalItem("img", 2, 2)  # ends at 4
    prefill = release_block_hashes(profile, tokens, 4, "sha256", mm_items=[image], pythonhashseed="0")
    decode = release_block_hashes(profile, tokens, 4, "sha256", mm_items=[image], pythonhashseed="0", num_prompt_tokens=5)
    assert (prefill[0] == decode[0], prefill[1] != decode[1]) == (True, counts)


def test_the_ideal_hit_rate_never_counts_a_prompts_last_token():
    "Plant: `limit = input_length // block_size` (a whole repeated prompt a hit; vLLM always computes its last token)."
    from kvref.oracle.production_traces import MooncakeRequest, ideal_hit_rate
    twice = [MooncakeRequest(0, 32, 1, [7]), MooncakeRequest(1, 32, 1, [7])]
    assert ideal_hit_rate(twice, 16, 16 * 2) == 1 / 4  # 4 blocks queried, 1 hit: the second prompt's first block


def test_a_router_may_name_an_engine_with_no_hit():
    "Plant: engines at 0 kept in the answers compared (a router listing every engine would be told it disagrees)."
    from kvref.oracle.router_conformance import ExampleRouter, check_router

    class EveryEngine(ExampleRouter):
        def longest_prefix(self, *args, **kwargs):
            return {**super().longest_prefix(*args, **kwargs), ("absent", 0): 0}

    assert check_router(EveryEngine, [TRACE]) is None
