"""Hybrid KV cache groups under random configurations and workloads (hypothesis state machine), and the errors for
bad configurations and bad calls."""
import math

import pytest
from hypothesis import assume, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvref.core.free_queue import block_ids
from kvref.core.hybrid import (ChunkedLocalAttentionSpec, FullAttentionSpec, HybridKVCacheManager, HybridRequest,
                          SlidingWindowSpec, cdiv, spec_from_group)


@st.composite
def hybrid_configs(draw):
    "A random group mix: 1 to 4 groups of full / sliding / chunked attention, block sizes 2 to 8, a tiny pool."
    kinds = draw(st.lists(st.sampled_from(["full", "sliding", "chunked"]), min_size=1, max_size=4))
    sizes = [draw(st.sampled_from([2, 4, 8])) for _ in kinds]
    lcm = math.lcm(*sizes)
    specs = []
    for kind, bs in zip(kinds, sizes):
        if kind == "full": specs.append(FullAttentionSpec(bs))
        elif kind == "sliding": specs.append(SlidingWindowSpec(bs, draw(st.integers(1, 40))))
        else: specs.append(ChunkedLocalAttentionSpec(lcm if len(kinds) > 1 else bs, draw(st.integers(1, 40))))
    has_window = any(isinstance(s, SlidingWindowSpec) for s in specs)
    lcm = math.lcm(*(s.block_size for s in specs))
    retention = draw(st.sampled_from([None, 0, lcm, 2 * lcm] if has_window else [None, 0]))
    return specs, draw(st.integers(2, 40)), retention, draw(st.sampled_from([None, 8, 32]))


class HybridMachine(RuleBasedStateMachine):
    "Random schedules, appends, preemptions and frees on a random hybrid configuration."

    @initialize(config=hybrid_configs(), gate=st.booleans())
    def setup(self, config, gate):
        specs, num_blocks, retention, in_flight = config
        self.specs, self.gate = specs, gate
        self.manager = HybridKVCacheManager(specs, num_blocks, retention_interval=retention, max_in_flight_tokens=in_flight)
        self.requests, self.running, self.n = {}, set(), 0
        self.last_step = {}  # request id -> (total computed before the step, new tokens) of its last allocation

    @rule(prefix=st.integers(0, 3), length=st.integers(1, 40))
    def add(self, prefix, length):
        "Prompts share prefixes drawn from four stems, so lookups hit."
        rid = f"r{self.n}"; self.n += 1
        self.requests[rid] = HybridRequest(rid, [prefix * 7 + i % 5 for i in range(length)])

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), budget=st.integers(1, 24))
    def schedule(self, data, budget):
        rid = data.draw(st.sampled_from(sorted(self.requests)))
        request, manager = self.requests[rid], self.manager
        waiting = rid not in self.running
        hits, num_hit = None, 0
        if waiting: hits, num_hit, request.shared_prefix_boundary = manager.get_computed_blocks(request)
        assert num_hit <= request.num_tokens - 1 and num_hit % manager.coordinator.alignment_tokens == 0
        num_new = min(request.num_tokens - request.num_computed_tokens - num_hit, budget)
        assume(num_new > 0)
        before = self.snapshot()
        total = request.num_computed_tokens + num_hit
        result = manager.allocate_slots(request, num_new, num_hit, hits, waiting and self.gate)
        if result is None: self.check_refusal_changed_nothing_but_skipped(before, rid, waiting)
        else:
            request.num_computed_tokens += num_hit + num_new
            self.running.add(rid); self.last_step[rid] = (total, num_new)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), token=st.integers(0, 40))
    def append(self, data, token):
        rid = data.draw(st.sampled_from(sorted(self.running)))
        request = self.requests[rid]
        if request.num_computed_tokens == request.num_tokens: request.append_output_token_ids(token)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def preempt(self, data):
        rid = data.draw(st.sampled_from(sorted(self.running)))
        self.manager.free(self.requests[rid]); self.requests[rid].num_computed_tokens = 0
        self.running.discard(rid); self.last_step.pop(rid, None)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def free(self, data):
        rid = data.draw(st.sampled_from(sorted(self.requests)))
        self.manager.free(self.requests.pop(rid)); self.running.discard(rid); self.last_step.pop(rid, None)

    def snapshot(self):
        pool = self.manager.block_pool
        return ([list(m.req_to_blocks.get(r, ())) for m in self.manager.coordinator.single_type_managers for r in sorted(self.requests)],
                self.manager.get_free_queue_ids(), {k: block_ids(v.values()) for k, v in pool.cached_block_hash_to_block.items()})

    def check_refusal_changed_nothing_but_skipped(self, before, rid, waiting):
        "A refusal changes nothing, except (vLLM's recorded behaviour) a running request's out-of-window blocks are freed."
        after = self.snapshot()
        if waiting: assert after == before; return
        assert after[2] == before[2], "a refusal never changes the cache map"
        for old, new in zip(before[0], after[0]):
            assert len(old) == len(new)
            assert all(o is n or n.is_null for o, n in zip(old, new)), "only skipped positions may change (to null)"
        freed = [o.block_id for tables in zip(before[0], after[0]) for o, n in zip(*tables) if o is not n]
        assert set(after[1]) == set(before[1]) | {b for b in freed if self.manager.block_pool.blocks[b].ref_cnt == 0}

    @invariant()
    def pool_is_consistent(self):
        if not hasattr(self, "manager"): return
        pool, managers = self.manager.block_pool, self.manager.coordinator.single_type_managers
        held = {}
        for m in managers:
            for table in m.req_to_blocks.values():
                for b in table:
                    if not b.is_null: held[b.block_id] = held.get(b.block_id, 0) + 1
        free = self.manager.get_free_queue_ids()
        assert len(free) == len(set(free)) == pool.get_num_free_blocks() and 0 not in free
        assert set(free) | set(held) == set(range(1, pool.num_blocks)) and not set(free) & set(held)
        for b, count in held.items(): assert pool.blocks[b].ref_cnt == count, f"block {b}"
        further = pool.cached_block_hashes_by_block  # a block's keys besides its own (sub-block hits: a prompt tail's)
        for key, holders in pool.cached_block_hash_to_block.items():
            for b in holders.values(): assert (b.block_hash == key or key in further.get(b.block_id, ())) and not b.is_null
        for block_id, keys in further.items():
            assert keys and pool.blocks[block_id].block_hash not in (None, *keys), f"block {block_id}: further keys need its own"
            for key in keys: assert block_id in pool.cached_block_hash_to_block[key], f"block {block_id}: a further key not in the map"

    @invariant()
    def skipped_positions_hold_the_null_block_and_windows_bound_the_rest(self):
        if not hasattr(self, "manager"): return
        for rid, (total, num_new) in self.last_step.items():
            for m in self.manager.coordinator.single_type_managers:
                table, bs = m.req_to_blocks.get(rid, []), m.block_size
                num_skipped = min(m.get_num_skipped_tokens(total) // bs, len(table))
                assert all(b.is_null for b in table[:num_skipped]), "skipped positions hold the null block"
                real = sum(not b.is_null for b in table)
                if isinstance(m.spec, SlidingWindowSpec):
                    assert real <= cdiv(m.spec.sliding_window - 1 + num_new, bs) + 1
                elif isinstance(m.spec, ChunkedLocalAttentionSpec):
                    assert real <= cdiv(m.spec.attention_chunk_size + num_new, bs) + 1


HybridMachine.TestCase.settings = settings(HybridMachine.TestCase.settings, stateful_step_count=25, max_examples=max(200, HybridMachine.TestCase.settings.max_examples))
TestHybridMachine = HybridMachine.TestCase


# Bad configurations: a clear error naming the field.
@pytest.mark.parametrize("group, message", [
    ({"kind": "linear", "block_size": 4}, "groups[0].kind must be one of"),
    ({"kind": "sliding_window", "block_size": 4, "sliding_window": 0}, "groups[0].sliding_window must be an int >= 1, got 0"),
    ({"kind": "sliding_window", "block_size": 4}, "groups[0].sliding_window must be an int >= 1, got None"),
    ({"kind": "chunked_local", "block_size": 4, "attention_chunk_size": -3}, "groups[0].attention_chunk_size must be an int >= 1"),
    ({"kind": "full", "block_size": True}, "groups[0].block_size must be an int >= 1, got True"),
    ({"kind": "full", "block_size": 4, "window": 3}, "groups[0] has unknown field 'window'"),
])
def test_bad_group_names_the_field(group, message):
    with pytest.raises(ValueError, match=None) as e: spec_from_group(group, 0)
    assert message in str(e.value)


def test_block_sizes_whose_lcm_exceeds_the_model_length():
    with pytest.raises(ValueError, match=r"lcm 24 \(the scheduler block size\) but max_model_len is 16"):
        HybridKVCacheManager([SlidingWindowSpec(8, 4), FullAttentionSpec(3)], 10, max_model_len=16, prefix_match_unit=1)


@pytest.mark.parametrize("kwargs, message", [
    ({"retention_interval": 6}, "retention_interval=6 must be a multiple of the scheduler block size 4"),
    ({"retention_interval": -1}, "retention_interval must be an int >= 0"),
    ({"num_blocks": 1}, "num_blocks must be an int >= 2"),
    ({"max_in_flight_tokens": 0}, "max_in_flight_tokens must be an int >= 1"),
    ({"enable_caching": 1}, "enable_caching must be a bool"),
])
def test_bad_manager_arguments(kwargs, message):
    args = {"num_blocks": 10, **kwargs}
    with pytest.raises((ValueError, TypeError)) as e:
        HybridKVCacheManager([SlidingWindowSpec(4, 8), FullAttentionSpec(4)], args.pop("num_blocks"), **args)
    assert message in str(e.value)


def test_retention_on_a_model_without_windows_is_refused():
    with pytest.raises(ValueError, match="only affects sliding-window and Mamba groups"):
        HybridKVCacheManager([FullAttentionSpec(4), ChunkedLocalAttentionSpec(4, 8)], 10, retention_interval=8)


def test_bad_allocate_slots_calls_change_nothing():
    manager = HybridKVCacheManager([SlidingWindowSpec(4, 8), FullAttentionSpec(4)], 10)
    request = HybridRequest("a", list(range(10)))
    before = manager.get_free_queue_ids()
    for args, message in [((0,), "num_new_tokens must be an int >= 1"), ((11,), "11 tokens to compute but it has only 10"),
                          ((2, 0, [[]]), "one list per group (2), got 1"), ((True,), "num_new_tokens must be an int >= 1")]:
        with pytest.raises((ValueError, TypeError)) as e: manager.allocate_slots(request, *args)
        assert message in str(e.value)
    assert manager.get_free_queue_ids() == before and manager.get_block_ids("a") == [[], []]
