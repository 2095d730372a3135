"""The array replay (chapter 06f) in lockstep with the step-by-step scheduler of chapter 06: per step the tokens each
request gets, preemptions, finishes, the free blocks, every block table and the whole free queue; equal counters on
the shipped sample; the array free queue against chapter 02's linked list; planted bugs caught."""
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvref.core.free_queue import FreeKVCacheBlockQueue, KVCacheBlock, block_ids
from kvref.oracle.array_replay import (ArrayBlockPool, ArrayFreeBlockQueue, ArrayReplay, TraceKeys, replay_arrays,
                                       sweep_arrays)
from kvref.oracle.production_traces import MooncakeRequest, read_mooncake, replay_mooncake

SAMPLE = Path(__file__).parent.parent / "golden" / "mooncake" / "synthetic-trace-last300.jsonl"


# ---- the two replays, step by step ----

def reference_steps(reqs, n, **kw) -> list[tuple]:
    "Each step of `replay_mooncake`: (step, [(id, tokens)], preempted, finished, free after schedule, tables, free queue)."
    steps = []
    def observe(s, out):
        steps.append((out.step, list(out.num_scheduled_tokens.items()), out.preempted, out.finished, out.num_free_scheduled,
                      {rid: block_ids(t) for rid, t in s.kv.req_to_blocks.items()}, s.kv.get_free_queue_ids()))
    replay_mooncake(reqs, n, observe=observe, **kw)
    return steps


def array_steps(reqs, n, **kw) -> list[tuple]:
    "The same record of each step of `replay_arrays`."
    steps = []
    def observe(e, scheduled, preempted, finished, free):
        steps.append((e.num_steps, [(r.request_id, k) for r, k in scheduled.items()], [r.request_id for r in preempted],
                      [r.request_id for r in finished], free, {r.request_id: r.table[:r.num_held].tolist() for r in e.running},
                      e.pool.queue.ids()))
    replay_arrays(reqs, n, observe=observe, **kw)
    return steps


def first_difference(reqs, n, **kw):
    "The first step at which the two replays differ (None: they agree at every step and on the counters)."
    plain = {k: v for k, v in kw.items() if k != "fast_forward"}
    a, b = reference_steps(reqs, n, **plain), array_steps(reqs, n, **kw)
    for x, y in zip(a, b):
        if x != y: return x, y
    if len(a) != len(b): return len(a), len(b)
    if replay_mooncake(reqs, n, **plain) != replay_arrays(reqs, n, **kw): return "counters"
    return None


def named(seq, names):
    "Hash ids for a sequence of block contents: one id per distinct prefix, as Mooncake's are."
    return [names.setdefault(tuple(seq[:k + 1]), len(names)) for k in range(len(seq))]


traces = st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=4), st.integers(0, 7), st.integers(0, 40)),
                  min_size=1, max_size=8)


def build(shape, raw: bool) -> list[MooncakeRequest]:
    "Requests from drawn (contents, cut, output) triples: hash block size 8; `raw`: the drawn ids as they are (repeats allowed)."
    reqs, ts, names = [], 0, {}
    for i, (ids, cut, out) in enumerate(shape):
        reqs.append(MooncakeRequest(ts, max(1, len(ids) * 8 - cut), out, ids if raw else named(ids, names), i + 1)); ts += i % 3
    return reqs


@pytest.mark.parametrize("fast_forward", [True, False])
@given(traces, st.sampled_from([1, 2, 4]), st.integers(0, 10), st.integers(1, 24), st.sampled_from([None, 1.0, 3.0]),
       st.integers(1, 4), st.sampled_from([0, 3]), st.booleans(), st.booleans(), st.booleans())
@settings(deadline=None, max_examples=150)
def test_lockstep_with_the_scheduler_on_random_traces(fast_forward, shape, bs, extra, budget, ms, seqs, threshold, chunked,
                                                      gate, raw):
    reqs = build(shape, raw)
    longest = max(r.input_length + max(1, r.output_length) for r in reqs)
    if not chunked: budget = max(budget, longest)  # vLLM: without chunked prefill the budget holds max_model_len
    n = -(-longest // bs) + 1 + extra
    kw = dict(block_size=bs, hash_block_size=8, ms_per_step=ms, max_num_batched_tokens=budget, max_num_seqs=seqs,
              long_prefill_token_threshold=threshold, enable_chunked_prefill=chunked, scheduler_reserve_full_isl=gate)
    assert first_difference(reqs, n, fast_forward=fast_forward, **kw) is None


@pytest.fixture(scope="module")
def sample():
    reqs = list(read_mooncake(SAMPLE))
    return reqs, TraceKeys(reqs, 16, 512)


@pytest.mark.parametrize("ms", [None, 10])
@pytest.mark.parametrize("num_blocks", [12_500, 50_000, 256_000])
def test_the_sample_gives_the_reference_counters(sample, num_blocks, ms):
    reqs, keys = sample
    assert replay_arrays(reqs, num_blocks, ms_per_step=ms, keys=keys) == replay_mooncake(reqs, num_blocks, ms_per_step=ms)


def test_the_sample_in_lockstep_at_a_small_pool():
    reqs = list(read_mooncake(SAMPLE))[:40]
    assert first_difference(reqs, 4_000, ms_per_step=10) is None


def test_sweep_arrays_equals_sweep_with_settings():
    from kvref.oracle.production_traces import sweep
    reqs = list(read_mooncake(SAMPLE))[:30]
    kw = dict(max_num_batched_tokens=2048, long_prefill_token_threshold=512, max_num_seqs=8)
    assert sweep_arrays(reqs, [4_000, 20_000], jobs=2, **kw) == sweep(reqs, [4_000, 20_000], jobs=1, **kw)


# ---- planted bugs: each makes the lockstep fail on a fixed case ----

def _free_in_table_order(self, r):
    self.pool.free(r.table[:r.num_held], r.distinct); r.table, r.num_held, r.num_cached = None, 0, 0

def _all_to_tail(self, blocks, distinct=True, num_own=None):
    self.ref[blocks] -= 1
    zero = blocks[self.ref[blocks] == 0]
    if len(zero): self.queue.append_n(zero)

def _decode_only_ignoring_the_head(self):
    running = self.running
    return bool(running) and all(r.num_tokens - r.num_computed_tokens == 1 and r.num_output for r in running)

PLANTED = {"free in table order": (ArrayReplay, "free_request", _free_in_table_order),
           "unhashed blocks not to the head": (ArrayBlockPool, "free", _all_to_tail),
           "the waiting head not asked": (ArrayReplay, "decode_only", _decode_only_ignoring_the_head)}


def _shared_prefix_trace() -> list[MooncakeRequest]:
    "Conversations sharing prefixes, short outputs, arrivals spread out: prefills overlap decodes and waiting heads."
    names, reqs = {}, []
    for i in range(24):
        seq = [i % 3, (i // 3) % 2, i]
        reqs.append(MooncakeRequest(2 * i, 8 * len(seq) - (i % 5), 3 + i % 7, named(seq, names), i + 1))
    return reqs


@pytest.mark.parametrize("bug", PLANTED)
def test_a_planted_bug_is_caught(bug, monkeypatch):
    cls, name, wrong = PLANTED[bug]
    monkeypatch.setattr(cls, name, wrong)
    cases = [dict(block_size=2, hash_block_size=8, max_num_batched_tokens=b, ms_per_step=1.0) for b in (4, 8, 16)]
    assert any(first_difference(_shared_prefix_trace(), n, **kw) is not None for kw in cases for n in (18, 22, 30, 45))


def test_the_fixed_case_agrees_without_bugs():
    cases = [dict(block_size=2, hash_block_size=8, max_num_batched_tokens=b, ms_per_step=1.0) for b in (4, 8, 16)]
    assert all(first_difference(_shared_prefix_trace(), n, **kw) is None for kw in cases for n in (18, 22, 30, 45))


# ---- the array free queue against chapter 02's linked list ----

class FreeQueues(RuleBasedStateMachine):
    "The same moves on both queues; the queues read the same after each, through compactions."
    def __init__(self):
        super().__init__()
        self.blocks = [KVCacheBlock(i) for i in range(6)]
        self.linked, self.array, self.taken = FreeKVCacheBlockQueue(self.blocks), ArrayFreeBlockQueue(6), []
        self.array.log = self.array.log[:30]  # a short log: a compaction every few moves

    @precondition(lambda self: self.linked.num_free_blocks)
    @rule(data=st.data())
    def take(self, data):
        n = data.draw(st.integers(1, self.linked.num_free_blocks))
        got = block_ids(self.linked.popleft_n(n))
        assert self.array.popleft_n(n).tolist() == got
        self.taken += got

    @precondition(lambda self: self.taken)
    @rule(data=st.data(), head=st.booleans())
    def give_back(self, data, head):
        ids = data.draw(st.lists(st.sampled_from(self.taken), min_size=1, unique=True))
        for b in ids: self.taken.remove(b)
        (self.linked.prepend_n if head else self.linked.append_n)([self.blocks[b] for b in ids])
        (self.array.prepend_n if head else self.array.append_n)(np.array(ids))

    @precondition(lambda self: self.linked.num_free_blocks)
    @rule(data=st.data())
    def remove(self, data):
        b = data.draw(st.sampled_from(block_ids(self.linked.get_all_free_blocks())))
        self.linked.remove(self.blocks[b]); self.array.remove(np.array([b])); self.taken.append(b)

    @invariant()
    def same(self):
        assert self.array.ids() == block_ids(self.linked.get_all_free_blocks())
        assert self.array.num_free == self.linked.num_free_blocks
        q = self.array  # the log's bookkeeping: holes counted between head and tail, nothing but holes past the tail
        assert q.holes == int((q.log[q.lo:q.hi] < 0).sum()) and (q.log[q.hi:] < 0).all()


TestFreeQueues = FreeQueues.TestCase
TestFreeQueues.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


# ---- refusals ----

def test_settings_it_does_not_model_are_refused_by_name(sample):
    reqs, keys = sample
    with pytest.raises(ValueError, match="async_scheduling=False only"): replay_arrays(reqs, 12_500, async_scheduling=True)
    with pytest.raises(ValueError, match="unknown scheduler setting 'budget'"): replay_arrays(reqs, 12_500, budget=3)
    with pytest.raises(TypeError, match="keys must be a TraceKeys"): replay_arrays(reqs, 12_500, keys=[1])
    with pytest.raises(ValueError, match="keys were built for 300 requests"): replay_arrays(reqs[:10], 12_500, keys=keys)
    with pytest.raises(ValueError, match="ms_per_step"): replay_arrays(reqs, 12_500, ms_per_step=0)
    with pytest.raises(ValueError, match="blocks must be a non-empty list"): sweep_arrays(reqs, [])


# ---- kvref sweep --engine ----

def test_kvref_sweep_prints_the_same_table_with_either_engine(capsys):
    from kvref.cli import main
    tables = {}
    for engine in ("auto", "arrays", "objects"):
        assert main(["sweep", str(SAMPLE), "--blocks", "12500,50000", "--jobs", "1", "--format", "csv", "--engine", engine]) == 0
        tables[engine] = capsys.readouterr().out
    assert tables["auto"] == tables["arrays"] == tables["objects"] and tables["auto"].count("\n") == 3


def test_an_empty_prompt_is_refused_by_both_replays_before_anything_runs():
    reqs = [MooncakeRequest(0, 0, 3, [], 1), MooncakeRequest(0, 20, 2, [5, 6], 2)]
    for replay_fn in (replay_mooncake, replay_arrays):
        with pytest.raises(ValueError, match="line 1: field 'input_length' is 0"): replay_fn(reqs, 64, 4, hash_block_size=16)
