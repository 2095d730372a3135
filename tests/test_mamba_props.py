"""Mamba groups mixed with attention groups under random configurations and workloads: the hybrid state machine's
pool invariants and refusal rules, with Mamba groups, sub-block hits (copy-on-write), step boundaries and a bound on
the states a request holds."""
import math

from hypothesis import assume, given, settings, strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

import test_hybrid_props as hybrid_props
from kvref.core.hybrid import FullAttentionSpec, HybridKVCacheManager, SlidingWindowSpec
from kvref.core.mamba import MambaManager, MambaSpec


@st.composite
def mamba_configs(draw):
    "1 to 3 Mamba groups (Mamba2-like with checkpoints or Mamba-1-like) plus full / sliding attention, one block size."
    bs = draw(st.sampled_from([2, 4, 8]))
    alignment = draw(st.sampled_from([None, 1, bs]))
    specs = [MambaSpec(bs, alignment)] * draw(st.integers(1, 3))
    specs += [draw(st.sampled_from([FullAttentionSpec(bs)] * 3 + [SlidingWindowSpec(bs, 3 * bs)]))]
    specs += draw(st.lists(st.just(FullAttentionSpec(bs)), max_size=1))
    order = draw(st.permutations(range(len(specs))))
    unit = draw(st.sampled_from([None, 1, 2, 2]))  # below the block: sub-block hits with copy-on-write
    return [specs[i] for i in order], draw(st.integers(2, 60)), draw(st.sampled_from([None, 0, bs, 2 * bs])), unit


class _Pick:
    "Stands in for `st.data()` where the hybrid machine's schedule rule draws a request id: this one."
    def __init__(self, request_id): self.request_id = request_id
    def draw(self, strategy): return self.request_id


class MambaMachine(hybrid_props.HybridMachine):
    "The hybrid machine on configurations with Mamba groups, with scheduler steps."

    @initialize(config=mamba_configs(), gate=st.booleans())
    def setup(self, config, gate):
        specs, num_blocks, retention, unit = config
        self.specs, self.gate = specs, gate
        self.manager = HybridKVCacheManager(specs, num_blocks, retention_interval=retention, prefix_match_unit=unit)
        self.requests, self.running, self.n, self.last_step = {}, set(), 0, {}

    @rule()
    def new_step(self):
        "The step ends: its copies ran, both ends are released; then a new step starts."
        copies = self.manager.take_kv_cache_block_copies()
        self.manager.block_pool.free_blocks([block for pair in copies for block in pair], unhashed_first=True)
        self.manager.new_step_starts()
        for m in self.manager.coordinator.single_type_managers:
            if isinstance(m, MambaManager): assert not m.cached_blocks_this_step

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def compute_to_replay_boundary(self, data):
        "vLLM's Mamba split ends a prefill chunk on the replay boundary, where a partial tail gets cached."
        rid = data.draw(st.sampled_from(sorted(self.running)))
        request = self.requests[rid]
        end = request.reachable_boundaries(self.manager.coordinator.alignment_tokens)[0]
        assume(end > request.num_computed_tokens)
        self.schedule(_Pick(rid), end - request.num_computed_tokens)

    @invariant()
    def pool_is_consistent(self):
        "The hybrid machine's pool invariant; each copy-on-write pair holds one reference per end until the step ends."
        if not hasattr(self, "manager"): return
        managers = self.manager.coordinator.single_type_managers
        for m in managers: m.req_to_blocks[" copies"] = [block for pair in m.pending_copies for block in pair]
        try: super().pool_is_consistent()
        finally:
            for m in managers: del m.req_to_blocks[" copies"]

    @invariant()
    def skipped_positions_hold_the_null_block_and_windows_bound_the_rest(self):
        "The hybrid machine's check, from a request's second step on: before the first token Mamba skips `0 - 1`."
        if not hasattr(self, "manager"): return
        every_step = self.last_step
        self.last_step = {rid: step for rid, step in every_step.items() if step[0] > 0}
        try: super().skipped_positions_hold_the_null_block_and_windows_bound_the_rest()
        finally: self.last_step = every_step

    @invariant()
    def a_request_holds_at_most_three_states(self):
        "The previous step's running state, a checkpoint and the running state: never more per Mamba group."
        if not hasattr(self, "manager"): return
        for m in self.manager.coordinator.single_type_managers:
            if isinstance(m, MambaManager):
                for table in m.req_to_blocks.values(): assert sum(not b.is_null for b in table) <= 3


MambaMachine.TestCase.settings = settings(MambaMachine.TestCase.settings, stateful_step_count=25,
                                          max_examples=max(200, MambaMachine.TestCase.settings.max_examples))
TestMambaMachine = MambaMachine.TestCase


def check_invariants(machine):
    machine.pool_is_consistent(); machine.skipped_positions_hold_the_null_block_and_windows_bound_the_rest()
    machine.a_request_holds_at_most_three_states()


@settings(max_examples=200)
@given(bs=st.sampled_from([4, 8]), unit=st.sampled_from([1, 2]), length=st.integers(3, 30), extra=st.integers(1, 10),
       groups=st.integers(1, 3), alignment=st.sampled_from([None, 1]), num_blocks=st.integers(6, 40))
def test_sub_block_hits_and_snapshots_keep_the_pool_consistent(bs, unit, length, extra, groups, alignment, num_blocks):
    "A prefill stops on its replay boundary inside a block; a longer resend hits it there; the first request goes on."
    machine = MambaMachine()
    machine.setup(config=([MambaSpec(bs, alignment)] * groups + [FullAttentionSpec(bs)], num_blocks, 0, unit), gate=False)
    machine.add(0, length); machine.add(0, length + extra)
    boundary = (length - 1) // unit * unit
    assume(boundary % bs)
    machine.schedule(_Pick("r0"), boundary); check_invariants(machine)
    machine.new_step(); check_invariants(machine)
    machine.schedule(_Pick("r1"), extra + length); check_invariants(machine)
    machine.schedule(_Pick("r0"), 1); check_invariants(machine)
    machine.new_step(); check_invariants(machine)
    for rid in ("r0", "r1"): machine.free(_Pick(rid)); check_invariants(machine)
    assert machine.manager.num_free_blocks == num_blocks - 1
