"""Mamba groups mixed with attention groups under random configurations and workloads: the hybrid state machine's
pool invariants and refusal rules, with Mamba groups, step boundaries and a bound on the states a request holds."""
import math

from hypothesis import settings, strategies as st
from hypothesis.stateful import initialize, invariant, rule

import test_hybrid_props as hybrid_props
from kvref.hybrid import FullAttentionSpec, HybridKVCacheManager, SlidingWindowSpec
from kvref.mamba import MambaManager, MambaSpec


@st.composite
def mamba_configs(draw):
    "1 to 3 Mamba groups (Mamba2-like with checkpoints or Mamba-1-like) plus full / sliding attention, one block size."
    bs = draw(st.sampled_from([2, 4, 8]))
    alignment = draw(st.sampled_from([None, 1, bs]))
    specs = [MambaSpec(bs, alignment)] * draw(st.integers(1, 3))
    specs += [draw(st.sampled_from([FullAttentionSpec(bs), SlidingWindowSpec(bs, 3 * bs)]))]
    specs += draw(st.lists(st.just(FullAttentionSpec(bs)), max_size=1))
    order = draw(st.permutations(range(len(specs))))
    return [specs[i] for i in order], draw(st.integers(2, 40)), draw(st.sampled_from([None, 0, bs, 2 * bs]))


class MambaMachine(hybrid_props.HybridMachine):
    "The hybrid machine on configurations with Mamba groups, with scheduler steps."

    @initialize(config=mamba_configs(), gate=st.booleans())
    def setup(self, config, gate):
        specs, num_blocks, retention = config
        self.specs, self.gate = specs, gate
        self.manager = HybridKVCacheManager(specs, num_blocks, retention_interval=retention)
        self.requests, self.running, self.n, self.last_step = {}, set(), 0, {}

    @rule()
    def new_step(self):
        self.manager.new_step_starts()
        for m in self.manager.coordinator.single_type_managers:
            if isinstance(m, MambaManager): assert not m.cached_blocks_this_step

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
