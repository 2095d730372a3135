"""Logits processors over a persistent batch, checked against a naive per-request reference.

The reference below knows nothing about slots, moves or batch updates: each request's logits row is computed from
that request's own params and its own output length. A hypothesis state machine drives a `PersistentBatch` through
the real update protocol (removals, then additions into the smallest holes, then condense, then swaps) and requires
bit-identical rows every step.
"""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvref.sample.logits_processors import (
    AdapterLogitsProcessor, BatchUpdate, BatchUpdateBuilder, LogitBiasLogitsProcessor, LogitsProcessorConfig,
    LogitsProcessors, MinPLogitsProcessor, MinTokensLogitsProcessor, MoveDirectionality, PersistentBatch,
    build_logitsprocs, process_dict_updates, sample_logits,
)
from kvref.sample.sampling_params import SamplingParams

VOCAB = 24
CPU = torch.device("cpu")


# ---------------------------------------------------------------------------------------------------------------
# The naive reference: one request, one row, no batch state.
# ---------------------------------------------------------------------------------------------------------------
def banned_by_adapter(params: SamplingParams, output_ids: list[int]) -> list[int]:
    """The test adapter's rule: requests with top_k == 1 may not repeat a token they already emitted."""
    return sorted(set(output_ids)) if params.top_k == 1 else []


class NoRepeat(AdapterLogitsProcessor):
    def is_argmax_invariant(self):
        return False

    def new_req_logits_processor(self, params):
        if params.top_k != 1:
            return None

        def ban(output_ids, row):
            if output_ids:
                row[sorted(set(output_ids))] = -math.inf
            return row
        return ban


def reference_row(logits_row: torch.Tensor, params: SamplingParams, output_ids: list[int]) -> torch.Tensor:
    """What one request's row must become: MinTokens, then LogitBias, then the adapter, then MinP."""
    row = logits_row.clone()
    if params.min_tokens and len(output_ids) < params.min_tokens:
        for t in params.all_stop_token_ids:
            row[t] = -math.inf
    for t, b in (params.logit_bias or {}).items():
        row[t] = row[t] + torch.tensor(b, dtype=torch.float32)
    for t in banned_by_adapter(params, output_ids):
        row[t] = -math.inf
    if params.min_p:
        probs = torch.softmax(row.unsqueeze(0), dim=-1)[0]
        threshold = probs.max() * torch.tensor(params.min_p, dtype=torch.float32)
        row = row.masked_fill(probs < threshold, -math.inf)
    return row


def apply_all(procs: LogitsProcessors, logits: torch.Tensor) -> torch.Tensor:
    for p in procs.non_argmax_invariant:
        logits = p.apply(logits)
    for p in procs.argmax_invariant:
        logits = p.apply(logits)
    return logits


token = st.integers(0, VOCAB - 1)
params_st = st.builds(
    SamplingParams,
    min_p=st.one_of(st.just(0.0), st.floats(0.05, 0.9)),
    min_tokens=st.integers(0, 3),
    max_tokens=st.just(32),
    stop_token_ids=st.lists(token, max_size=3),
    logit_bias=st.one_of(st.none(), st.dictionaries(token, st.floats(-5, 5, width=32), max_size=3)),
    top_k=st.sampled_from([0, 0, 1]),
)


# ---------------------------------------------------------------------------------------------------------------
# The state machine.
# ---------------------------------------------------------------------------------------------------------------
class PersistentBatchMachine(RuleBasedStateMachine):
    MAX = 6

    def __init__(self):
        super().__init__()
        config = LogitsProcessorConfig(max_num_seqs=self.MAX)
        self.procs = build_logitsprocs(config, CPU, False, False, [NoRepeat])
        self.batch = PersistentBatch(self.MAX, self.procs)
        self.reqs: dict[str, tuple[SamplingParams, list[int]]] = {}  # the reference's own view, by request id
        self.next_id = 0
        self.gen = torch.Generator().manual_seed(1234)
        self.added = False
        self.dirty = False  # removals/additions not yet handed to the processors (mid-step)

    def minp(self) -> MinPLogitsProcessor:
        return next(p for p in self.procs.all if isinstance(p, MinPLogitsProcessor))

    @precondition(lambda self: self.reqs and not self.added)
    @rule(data=st.data())
    def finish(self, data):
        """A request finishes or is preempted; removals come before any addition in a step."""
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        self.dirty = True
        self.batch.remove_request(rid)
        del self.reqs[rid]

    @precondition(lambda self: self.batch.num_reqs < self.MAX)
    @rule(params=params_st, prior_output=st.lists(token, max_size=4))
    def arrive(self, params, prior_output):
        """A new request (or a resumed one that already has output) takes the smallest free slot."""
        rid = f"r{self.next_id}"
        self.next_id += 1
        out = list(prior_output)
        params.update_from_generation_config({}, model_eos_token_id=VOCAB - 1)
        self.batch.add_request(rid, params, [0, 1], out)
        self.reqs[rid] = (params, out)
        self.added = self.dirty = True

    @rule(swaps=st.lists(st.tuples(st.integers(0, MAX - 1), st.integers(0, MAX - 1)), max_size=2))
    def step(self, swaps):
        """Condense, reorder, hand one BatchUpdate to every processor, check every row, emit one token each."""
        self.batch.condense()
        n = self.batch.num_reqs
        for i, j in swaps:
            if i < n and j < n and i != j:
                self.batch.swap_states(i, j)
        self.batch.refresh()
        self.added = self.dirty = False
        self.check_rows()
        for rid, (_, out) in self.reqs.items():
            out.append(int(torch.randint(0, VOCAB, (1,), generator=self.gen)))

    def check_rows(self):
        n = self.batch.num_reqs
        assert self.batch.req_ids[:n] == [r for r in self.batch.req_ids[:n] if r is not None]
        logits = torch.randn(n, VOCAB, generator=self.gen) * 3
        got = apply_all(self.procs, logits.clone())
        for i, rid in enumerate(self.batch.req_ids[:n]):
            params, out = self.reqs[rid]
            want = reference_row(logits[i], params, out)
            assert torch.equal(got[i], want), (i, rid, params, out, got[i], want)

    @invariant()
    def minp_count_matches_live_prefix(self):
        if self.dirty:
            return
        p, n = self.minp(), self.batch.num_reqs
        assert p.min_p_count == int((p.min_p_cpu[:n] != 0).sum())
        assert not p.min_p_cpu[n:].any(), "stale min_p past the live prefix"

    @invariant()
    def no_state_for_freed_slots(self):
        if self.dirty:
            return
        n = self.batch.num_reqs
        by_slot = {i: self.reqs[rid] for i, rid in enumerate(self.batch.req_ids[:n])}
        for p in self.procs.all:
            if isinstance(p, LogitBiasLogitsProcessor):
                assert set(p.biases) <= set(range(n))
                assert p.biases == {i: dict(ps.logit_bias) for i, (ps, _) in by_slot.items() if ps.logit_bias}
            if isinstance(p, MinTokensLogitsProcessor):
                assert set(p.min_toks) <= set(range(n))
                for i, (m, out, _) in p.min_toks.items():
                    assert out is by_slot[i][1] and m == by_slot[i][0].min_tokens
            if isinstance(p, NoRepeat):
                assert set(p.req_info) == {i for i, (ps, _) in by_slot.items() if ps.top_k == 1}


TestPersistentBatch = PersistentBatchMachine.TestCase
TestPersistentBatch.settings = settings(stateful_step_count=30)


class _Pick:
    "Stands in for hypothesis' `data` in a replayed rule: `draw` returns the request id chosen by hand."
    def __init__(self, rid): self.rid = rid
    def draw(self, _strategy): return self.rid


def test_condense_twice_in_a_step_is_a_no_op():
    """Regression (found by a random hypothesis seed): the machine's `step` follows vLLM's model runner (condense,
    reorder, then refresh, which condenses again). A step that moves a request and also leaves tail holes used to
    make the second condense count its last slot as `num_reqs + len(removed) - 1`, one past the trimmed list:
    IndexError. Slots: r4 r2 r3 r5 r6; r2, r3, r6 finish; r5 moves 3 -> 1; holes 4 and 2 stay in `removed`."""
    m = PersistentBatchMachine()
    plain = dict(min_p=0.0, min_tokens=0, max_tokens=32, stop_token_ids=[], logit_bias=None, top_k=0)
    arrive = lambda: m.arrive(SamplingParams(**plain), [])
    finish = lambda rid: m.finish(_Pick(rid))
    arrive(); m.step([]); finish("r0"); m.step([])
    arrive(); arrive(); arrive(); m.step([])
    finish("r1"); arrive(); arrive(); arrive(); m.step([])
    for rid in ("r2", "r3", "r6"): finish(rid)
    m.batch.condense()
    assert m.batch.req_ids == ["r4", "r5"] and m.batch.batch_update_builder.removed == [4, 2]
    m.step([])  # condenses again inside `refresh`, then checks every row against the reference
    assert m.batch.req_ids == ["r4", "r5"] and m.batch.req_id_to_index == {"r4": 0, "r5": 1}
    m.minp_count_matches_live_prefix(); m.no_state_for_freed_slots()


# ---------------------------------------------------------------------------------------------------------------
# The builder's protocol.
# ---------------------------------------------------------------------------------------------------------------
@given(st.lists(st.integers(0, 50), unique=True, max_size=12))
def test_pop_removed_yields_smallest_first(slots):
    b = BatchUpdateBuilder()
    for s in slots:
        b.removed_append(s)
    popped = [b.pop_removed() for _ in slots]
    assert popped == sorted(slots)
    assert b.pop_removed() is None


def test_removed_append_after_read_raises():
    b = BatchUpdateBuilder()
    b.removed_append(3)
    assert b.peek_removed() == 3
    with pytest.raises(RuntimeError, match="after the removed slots were read"):
        b.removed_append(1)
    b.get_and_reset(0)
    b.removed_append(1)  # a new step may register removals again


def test_get_and_reset_and_batch_changed():
    b = BatchUpdateBuilder()
    assert not b.batch_changed and b.get_and_reset(0) is None
    b.removed_append(2)
    b.add_request(2, SamplingParams(), None, [])  # pooling-style: no pop, still a change
    assert b.batch_changed
    u = b.get_and_reset(3)
    assert (u.batch_size, list(u.removed), len(u.added)) == (3, [2], 1)
    assert not b.batch_changed and b.get_and_reset(3) is None
    b.removed_append(0)
    assert b.reset() is True and b.reset() is False
    with pytest.raises(Exception):
        u.batch_size = 4  # frozen


def test_update_state_without_changes_rebuilds_nothing():
    """The O(1) target: with no batch change, MinP and LogitBias keep their tensors (the same objects)."""
    config = LogitsProcessorConfig(max_num_seqs=8)
    procs = build_logitsprocs(config, CPU, False, False)
    batch = PersistentBatch(8, procs)
    batch.add_request("a", SamplingParams(min_p=0.2, logit_bias={1: 1.0}), None, [])
    batch.refresh()
    minp = next(p for p in procs.all if isinstance(p, MinPLogitsProcessor))
    bias = next(p for p in procs.all if isinstance(p, LogitBiasLogitsProcessor))
    before = (minp.min_p, bias.bias_tensor, bias.logits_slice)
    assert batch.refresh() is None
    assert (minp.min_p, bias.bias_tensor, bias.logits_slice) == before


# ---------------------------------------------------------------------------------------------------------------
# Speculative decoding.
# ---------------------------------------------------------------------------------------------------------------
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 8), st.integers(0, 4)), min_size=1, max_size=5))
def test_spec_decode_masks_row_i_iff_short(reqs):
    """Row i of a request is masked iff len(output) + i < min_tokens."""
    mt = MinTokensLogitsProcessor(LogitsProcessorConfig(8), CPU, False)
    added = [(slot, SamplingParams(min_tokens=m, max_tokens=32, stop_token_ids=[3, 5]), None, [0] * out_len)
             for slot, (out_len, m, _) in enumerate(reqs)]
    mt.update_state(BatchUpdate(len(reqs), [], added, []))
    drafts = [d for _, _, d in reqs]
    got = mt.apply_with_spec_decode(torch.zeros(sum(drafts), VOCAB), drafts)
    row = 0
    for out_len, m, d in reqs:
        for i in range(d):
            want = out_len + i < m
            assert bool(got[row, 3].isinf()) == want and bool(got[row, 5].isinf()) == want
            assert not got[row, [t for t in range(VOCAB) if t not in (3, 5)]].isinf().any()
            row += 1


def test_bonus_token_pass_masks_more_than_non_speculative():
    """The one place vLLM 0.33 masks more: the bonus row after d accepted drafts when len < min_tokens <= len + d."""
    out_len, min_tokens, d = 3, 5, 2
    params = SamplingParams(min_tokens=min_tokens, stop_token_ids=[7])
    mt = MinTokensLogitsProcessor(LogitsProcessorConfig(4), CPU, False)
    mt.update_state(BatchUpdate(1, [], [(0, params, None, [1] * out_len)], []))
    bonus_masked = bool(mt.apply(torch.zeros(1, VOCAB))[0, 7].isinf())
    # Non-speculative decoding at the bonus token's position (output length 5) masks nothing:
    plain = MinTokensLogitsProcessor(LogitsProcessorConfig(4), CPU, False)
    plain.update_state(BatchUpdate(1, [], [(0, params, None, [1] * (out_len + d))], []))
    plain_masked = bool(plain.apply(torch.zeros(1, VOCAB))[0, 7].isinf())
    assert (bonus_masked, plain_masked) == (True, False)
    # ... and everywhere else the two agree: draft rows follow the non-speculative rule exactly.
    for k in range(0, out_len + d + 2):
        for dd in range(0, 4):
            spec = MinTokensLogitsProcessor(LogitsProcessorConfig(4), CPU, False)
            spec.update_state(BatchUpdate(1, [], [(0, params, None, [1] * k)], []))
            rows = spec.apply_with_spec_decode(torch.zeros(dd, VOCAB), [dd])[:, 7].isinf().tolist()
            assert rows == [k + i < min_tokens for i in range(dd)]
            bonus = bool(spec.apply(torch.zeros(1, VOCAB))[0, 7].isinf())
            assert bonus == (k < min_tokens)  # vLLM 0.33: decided by the committed length alone
            assert bonus >= (k + dd < min_tokens)  # never masks less than non-speculative decoding


# ---------------------------------------------------------------------------------------------------------------
# process_dict_updates against a naive dict model.
# ---------------------------------------------------------------------------------------------------------------
@given(st.dictionaries(st.integers(0, 7), st.integers(1, 99), max_size=8),
       st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7), st.booleans()), max_size=4))
def test_process_dict_updates_moves(entries, moves):
    moved = [(a, b, MoveDirectionality.SWAP if swap else MoveDirectionality.UNIDIRECTIONAL) for a, b, swap in moves]
    want = dict(entries)
    for a, b, swap in moves:
        va, vb = want.pop(a, None), want.pop(b, None)
        if va is not None:
            want[b] = va
        if swap and vb is not None:
            want[a] = vb
    got = dict(entries)
    changed = process_dict_updates(got, BatchUpdate(8, [], [], moved), lambda *_: None)
    assert got == want
    assert changed == any((a in entries) or (b in entries) for a, b, _ in moves)


# ---------------------------------------------------------------------------------------------------------------
# GPU: the pinned CPU buffer + device twin path must give the same rows as the CPU-only path.
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_double_buffer_matches_cpu():
    gen = torch.Generator().manual_seed(7)
    config = LogitsProcessorConfig(max_num_seqs=16)
    cuda = torch.device("cuda")
    batches = [PersistentBatch(16, build_logitsprocs(config, dev, dev.type == "cuda", False)) for dev in (CPU, cuda)]
    rng = __import__("random").Random(3)
    live, next_id = [], 0
    for step in range(40):
        for rid in rng.sample(live, min(len(live), rng.randrange(3))):
            live.remove(rid)
            for b in batches:
                b.remove_request(rid)
        for _ in range(rng.randrange(4)):
            if len(live) >= 16:
                break
            params = SamplingParams(min_p=rng.choice([0.0, 0.1, 0.3]), min_tokens=rng.randrange(3), stop_token_ids=[1],
                                    logit_bias={rng.randrange(VOCAB): 2.0} if rng.random() < 0.5 else None)
            rid = f"r{next_id}"
            next_id += 1
            live.append(rid)
            out = []
            for b in batches:
                b.add_request(rid, params, None, out)
        for b in batches:
            b.refresh()
        logits = torch.randn(batches[0].num_reqs, VOCAB, generator=gen)
        want = apply_all(batches[0].logitsprocs, logits.clone())
        got = apply_all(batches[1].logitsprocs, logits.clone().to(cuda)).cpu()
        assert torch.equal(want.isinf(), got.isinf())
        assert torch.allclose(want.nan_to_num(0, 0, 0), got.nan_to_num(0, 0, 0))
        for rid in live:
            batches[0].output_token_ids[batches[0].req_id_to_index[rid]].append(0)


# ---------------------------------------------------------------------------------------------------------------
# The sampler order.
# ---------------------------------------------------------------------------------------------------------------
@given(st.lists(st.floats(-20, 20, width=32), min_size=2, max_size=VOCAB, unique=True), st.floats(0.0, 1.0))
def test_minp_is_argmax_invariant(values, min_p):
    p = MinPLogitsProcessor(LogitsProcessorConfig(2), CPU, False)
    p.update_state(BatchUpdate(1, [], [(0, SamplingParams(min_p=min_p), None, [])], []))
    x = torch.tensor([values])
    assert int(p.apply(x.clone()).argmax()) == int(x.argmax())


def batch_of(*params):
    b = PersistentBatch(8, build_logitsprocs(LogitsProcessorConfig(8), CPU, False, False))
    for i, ps in enumerate(params):
        b.add_request(f"r{i}", ps, None, [])
    b.refresh()
    return b


def test_minp_runs_after_temperature():
    """min_p=0.5 on logits [2, 1]: at T=1 token 1 has ratio e^-1 < 0.5 (dropped); at T=4 e^-0.25 > 0.5 (kept)."""
    b = batch_of(SamplingParams(min_p=0.5, temperature=1.0))
    logits = torch.full((1, VOCAB), -math.inf)
    logits[0, :2] = torch.tensor([2.0, 1.0])
    def draws(t):
        return {int(sample_logits(logits.clone(), b.logitsprocs, torch.tensor([t]),
                                  generator=torch.Generator().manual_seed(s))) for s in range(200)}
    assert draws(1.0) == {0}
    assert draws(4.0) == {0, 1}


def test_bias_and_forcing_run_before_the_argmax():
    b = batch_of(SamplingParams(temperature=0.0, logit_bias={5: 10.0}), SamplingParams(temperature=0.0))
    logits = torch.zeros(2, VOCAB)
    logits[:, 0] = 5.0
    assert sample_logits(logits.clone(), b.logitsprocs, torch.tensor([0.0, 0.0])).tolist() == [5, 0]
    def force(x):
        x[1, 9] = 1e9
        return x
    assert sample_logits(logits.clone(), b.logitsprocs, torch.tensor([0.0, 1.0]), force=force).tolist() == [5, 9]


def test_min_tokens_blocks_greedy_eos():
    ps = SamplingParams(temperature=0.0, min_tokens=2)
    ps.update_from_generation_config({}, model_eos_token_id=3)
    b = batch_of(ps)
    logits = torch.zeros(1, VOCAB)
    logits[0, 3] = 9.0
    picks = []
    for _ in range(3):
        picks.append(int(sample_logits(logits.clone(), b.logitsprocs, torch.tensor([0.0]))))
        b.output_token_ids[0].append(picks[-1])
        b.refresh()
    assert picks[:2] != [3, 3] and picks[2] == 3 and 3 not in picks[:2]
