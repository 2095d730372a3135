"""Bad inputs to the logits-processor and sampling-params APIs: each is refused by name, and a refused call changes
nothing (batch slots, builder record, processor state, params).

Each row of `CASES` is a reproducer from the outside checks of issue 12 or from fuzzing every public entry point with
wrong types, sizes and misuse sequences; before the fix each one crashed (AttributeError, IndexError, KeyError,
OverflowError), was silently accepted, or changed state before refusing.
"""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from kvref.sample.logits_processors import (
    AdapterLogitsProcessor, BatchUpdate, BatchUpdateBuilder, LogitBiasLogitsProcessor, LogitsProcessorConfig,
    LogitsProcessors, MinPLogitsProcessor, MinTokensLogitsProcessor, MoveDirectionality, PersistentBatch,
    apply_top_k_top_p, build_logitsprocs, load_logitsprocs_by_fqcns, load_logitsprocs_plugins, process_dict_updates,
    sample_logits, validate_logits_processors_parameters,
)
from kvref.sample.sampling_params import SamplingParams

CPU = torch.device("cpu")
CFG = LogitsProcessorConfig(4)
VOCAB = 8
U, S = MoveDirectionality.UNIDIRECTIONAL, MoveDirectionality.SWAP
BUSY = SamplingParams(min_p=0.2, logit_bias={1: 1.0}, min_tokens=2, stop_token_ids=[3])


def snapshot(obj):
    """A comparable deep copy of an object's state: tensors and arrays as lists, objects as their fields."""
    if isinstance(obj, torch.Tensor):
        return ("tensor", str(obj.dtype), tuple(obj.shape), obj.tolist())
    if isinstance(obj, np.ndarray):
        return ("array", obj.tolist())
    if isinstance(obj, dict):
        return {k: snapshot(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(snapshot(v) for v in obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if isinstance(obj, (int, float, str, bool, type(None), MoveDirectionality, torch.device)):
        return obj
    if hasattr(obj, "__dict__"):
        return (type(obj).__name__, snapshot(vars(obj)))
    return repr(type(obj))


def batch() -> PersistentBatch:
    """Two live requests (slot 0 uses every built-in), vocabulary known."""
    b = PersistentBatch(4, build_logitsprocs(CFG, CPU, False, False), vocab_size=VOCAB)
    b.add_request("a", BUSY, [0], [])
    b.add_request("b", SamplingParams(), [0], [])
    b.refresh()
    return b


def procs() -> list:
    """The three built-ins, each tracking the same two requests."""
    ps = [MinPLogitsProcessor(CFG, CPU, False), LogitBiasLogitsProcessor(CFG, CPU, False),
          MinTokensLogitsProcessor(CFG, CPU, False)]
    for p in ps:
        p.update_state(BatchUpdate(2, [], [(0, BUSY, None, []), (1, SamplingParams(), None, [])], []))
    return ps


def minp(): return procs()[0]
def bias(): return procs()[1]
def mintok(): return procs()[2]
def builder():
    b = BatchUpdateBuilder()
    b.removed_append(1)
    return b


def add(slot, params=None, out=None):
    return (slot, params if params is not None else SamplingParams(min_p=0.5), None, [] if out is None else out)


class Bad2(AdapterLogitsProcessor):
    """Gives slot requests with top_k == 3 a callable of the wrong arity."""
    def is_argmax_invariant(self): return False
    def new_req_logits_processor(self, params):
        if params.top_k == 1: return lambda out, row: row
        if params.top_k == 3: return lambda row: row
        return None


def adapter():
    a = Bad2(CFG, CPU, False)
    a.update_state(BatchUpdate(1, [], [add(0, SamplingParams(top_k=1))], []))
    return a


def no_object(): return None


def batch_mid_step() -> PersistentBatch:
    """A batch in the middle of a step: one removal already consumed by an add."""
    b = batch()
    b.remove_request("a")
    b.add_request("c", SamplingParams(), None, [])
    return b


def state_unless_min_p(params, *_):
    """A `new_state` callback that refuses requests with min_p."""
    if params.min_p: raise ValueError("no state for min_p")
    return 7


# (id, make the object, the call, exception, message)
CASES = [
    # MinP's dense per-slot array: slot -1 wrote the last slot, a slot past max_num_seqs raised IndexError.
    ("minp added slot -1", minp, lambda p: p.update_state(BatchUpdate(1, [], [add(-1)], [])), ValueError, "slot -1 is outside the batch"),
    ("minp added slot = max_num_seqs", minp, lambda p: p.update_state(BatchUpdate(1, [], [add(4)], [])), ValueError, r"slot 4 is outside the batch \(max_num_seqs=4\)"),
    ("minp good slot then bad slot", minp, lambda p: p.update_state(BatchUpdate(2, [], [add(1), add(9)], [])), ValueError, "added\\[1\\]: slot 9"),
    ("minp removed slot 9", minp, lambda p: p.update_state(BatchUpdate(2, [9], [], [])), ValueError, r"removed\[0\]: slot 9"),
    ("minp moved to slot 9", minp, lambda p: p.update_state(BatchUpdate(2, [], [], [(0, 9, U)])), ValueError, r"moved\[0\]: slot 9"),
    ("minp moved bad direction", minp, lambda p: p.update_state(BatchUpdate(2, [], [], [(0, 1, "swap")])), TypeError, "MoveDirectionality"),
    ("minp moved pair", minp, lambda p: p.update_state(BatchUpdate(2, [], [], [(0, 1)])), ValueError, r"moved\[0\] must be \(from, to, MoveDirectionality\)"),
    ("minp batch_size past capacity", minp, lambda p: p.update_state(BatchUpdate(9, [], [], [])), ValueError, "batch_size 9"),
    ("minp batch_size str", minp, lambda p: p.update_state(BatchUpdate("2", [], [], [])), TypeError, "batch_size must be an int"),
    ("minp batch_size bool", minp, lambda p: p.update_state(BatchUpdate(True, [], [], [])), TypeError, "batch_size must be an int"),
    ("minp update not a BatchUpdate", minp, lambda p: p.update_state(5), TypeError, "must be a BatchUpdate or None"),
    ("minp added params None", minp, lambda p: p.update_state(BatchUpdate(2, [], [(1, None, None, [])], [])), TypeError, "SamplingParams"),
    ("minp added triple", minp, lambda p: p.update_state(BatchUpdate(2, [], [(1, SamplingParams(), None)], [])), ValueError, r"added\[0\] must be \(index, params"),
    ("minp added float slot", minp, lambda p: p.update_state(BatchUpdate(2, [], [add(1.0)], [])), TypeError, "slot must be an int"),
    ("minp removed not a list", minp, lambda p: p.update_state(BatchUpdate(2, None, [], [])), TypeError, "removed must be a list"),
    ("minp index -1", minp, lambda p: p.get_min_p_by_index(-1), ValueError, "slot -1 is outside the batch"),
    ("minp index 4", minp, lambda p: p.get_min_p_by_index(4), ValueError, "slot 4 is outside the batch"),
    ("minp index str", minp, lambda p: p.get_min_p_by_index("0"), TypeError, "slot must be an int"),
    ("minp apply numpy", minp, lambda p: p.apply(np.zeros((2, VOCAB))), TypeError, "logits must be a torch.Tensor"),
    ("minp apply wrong rows", minp, lambda p: p.apply(torch.zeros(3, VOCAB)), ValueError, "logits have 3 rows but the batch has 2"),
    ("minp apply 1-D", minp, lambda p: p.apply(torch.zeros(VOCAB)), ValueError, "2-D"),
    ("minp apply int logits", minp, lambda p: p.apply(torch.zeros(2, VOCAB, dtype=torch.int64)), TypeError, "floating"),
    ("minp init config None", no_object, lambda _: MinPLogitsProcessor(None, CPU, False), TypeError, "config must be a LogitsProcessorConfig"),
    ("minp init pin str", no_object, lambda _: MinPLogitsProcessor(CFG, CPU, "no"), TypeError, "is_pin_memory must be a bool"),
    ("minp init device int", no_object, lambda _: MinPLogitsProcessor(CFG, 0, False), TypeError, "device must be a torch.device"),
    # LogitBias and MinTokens: a token id past the row raised IndexError inside the indexed add.
    ("bias apply narrow vocab", bias, lambda p: p.apply(torch.zeros(2, 1)), ValueError, "token id 1 is outside the 1 logits columns"),
    ("bias apply too few rows", bias, lambda p: p.apply(torch.zeros(0, VOCAB)), ValueError, "slot 0"),
    ("bias apply dict", bias, lambda p: p.apply({}), TypeError, "logits must be a torch.Tensor"),
    ("bias added params str", bias, lambda p: p.update_state(BatchUpdate(2, [], [(1, "x", None, [])], [])), TypeError, "SamplingParams"),
    ("bias output not a list", bias, lambda p: p.update_state(BatchUpdate(2, [], [(1, SamplingParams(), None, None)], [])), TypeError, "output_token_ids must be a list"),
    ("mintok apply narrow vocab", mintok, lambda p: p.apply(torch.zeros(2, 2)), ValueError, "token id 3 is outside the 2 logits columns"),
    ("mintok apply None", mintok, lambda p: p.apply(None), TypeError, "logits must be a torch.Tensor"),
    ("mintok spec rows != drafts", mintok, lambda p: p.apply_with_spec_decode(torch.zeros(3, VOCAB), [1, 1]), ValueError, "3 rows but num_draft_tokens sums to 2"),
    ("mintok spec short drafts", mintok, lambda p: p.apply_with_spec_decode(torch.zeros(0, VOCAB), []), ValueError, "0 entries but slot 0"),
    ("mintok spec negative drafts", mintok, lambda p: p.apply_with_spec_decode(torch.zeros(2, VOCAB), [-1, 3]), ValueError, r"num_draft_tokens\[0\] must be an int >= 0"),
    ("mintok spec bool drafts", mintok, lambda p: p.apply_with_spec_decode(torch.zeros(2, VOCAB), [True, 1]), TypeError, r"num_draft_tokens\[0\] must be an int >= 0, got True"),
    ("mintok spec numpy logits", mintok, lambda p: p.apply_with_spec_decode(np.zeros((2, VOCAB)), [1, 1]), TypeError, "logits must be a torch.Tensor"),
    ("mintok spec narrow vocab", mintok, lambda p: p.apply_with_spec_decode(torch.zeros(2, 2), [1, 1]), ValueError, "token id 3"),
    # The adapter: a bad callable for the second request must not leave the first one's state half-applied.
    ("adapter bad arity second", adapter, lambda a: a.update_state(BatchUpdate(2, [], [add(0, SamplingParams()), add(1, SamplingParams(top_k=3))], [])), TypeError, "takes 1 parameters"),
    # process_dict_updates: every callback runs before the dict changes.
    ("dict updates not a dict", no_object, lambda _: process_dict_updates([], BatchUpdate(1, [], [], []), lambda *a: None), TypeError, "req_entries must be a dict"),
    ("dict updates callback not callable", lambda: {0: 1}, lambda d: process_dict_updates(d, BatchUpdate(1, [], [add(0)], []), 5), TypeError, "new_state must be callable"),
    ("dict updates raises on second", lambda: {0: 1}, lambda d: process_dict_updates(d, BatchUpdate(2, [], [add(0, SamplingParams()), add(1)], []), state_unless_min_p), ValueError, "no state for min_p"),
    ("dict updates not an update", lambda: {0: 1}, lambda d: process_dict_updates(d, "x", lambda *a: None), TypeError, "must be a BatchUpdate or None"),
    # The persistent batch.
    ("batch capacity str", no_object, lambda _: PersistentBatch("4"), TypeError, "max_num_reqs must be an int"),
    ("batch capacity bool", no_object, lambda _: PersistentBatch(True), TypeError, "max_num_reqs must be an int"),
    ("batch capacity 0", no_object, lambda _: PersistentBatch(0), ValueError, "max_num_reqs must be an int >= 1"),
    ("batch capacity -1", no_object, lambda _: PersistentBatch(-1), ValueError, "max_num_reqs must be an int >= 1"),
    ("batch procs a list", no_object, lambda _: PersistentBatch(4, []), TypeError, "logitsprocs must be a LogitsProcessors"),
    ("batch vocab 0", no_object, lambda _: PersistentBatch(4, vocab_size=0), ValueError, "vocab_size must be an int >= 1"),
    ("remove unknown", batch, lambda b: b.remove_request("zz"), ValueError, "request 'zz' is not in the batch"),
    ("remove int id", batch, lambda b: b.remove_request(4), TypeError, "req_id must be a str"),
    ("remove after an add in the step", batch_mid_step, lambda b: b.remove_request("b"), RuntimeError, "after the removed slots were read"),
    ("add bias past vocab", batch, lambda b: b.add_request("c", SamplingParams(logit_bias={VOCAB: 1.0}), None, []), ValueError, r"logit_bias token ids \[8\] are outside the vocabulary"),
    ("add stop past vocab", batch, lambda b: b.add_request("c", SamplingParams(stop_token_ids=[9]), None, []), ValueError, r"stop_token_ids \[9\] are outside the vocabulary"),
    ("add int id", batch, lambda b: b.add_request(7, SamplingParams(), None, []), TypeError, "req_id must be a str"),
    ("add params None", batch, lambda b: b.add_request("c", None, None, []), TypeError, "params must be a SamplingParams"),
    ("add output tuple", batch, lambda b: b.add_request("c", SamplingParams(), None, ()), TypeError, "output_token_ids must be a list"),
    ("add prompt str", batch, lambda b: b.add_request("c", SamplingParams(), "abc", []), TypeError, "prompt_token_ids must be a list"),
    ("add duplicate", batch, lambda b: b.add_request("a", SamplingParams(), None, []), ValueError, "already in the batch"),
    ("swap str slot", batch, lambda b: b.swap_states("0", 1), TypeError, "slot must be an int"),
    ("swap bool slot", batch, lambda b: b.swap_states(True, 1), TypeError, "slot must be an int"),
    ("swap dead slot", batch, lambda b: b.swap_states(0, 3), ValueError, "slot 3 is not a live slot"),
    # The builder.
    ("builder removed -1", builder, lambda b: b.removed_append(-1), ValueError, "slot must be an int >= 0"),
    ("builder removed str", builder, lambda b: b.removed_append("1"), TypeError, "slot must be an int"),
    ("builder add slot None", builder, lambda b: b.add_request(None, SamplingParams(), None, []), TypeError, "slot must be an int"),
    ("builder move bad direction", builder, lambda b: b.move(0, 1, "swap"), TypeError, "MoveDirectionality"),
    ("builder move negative", builder, lambda b: b.move(0, -1, S), ValueError, "slot must be an int >= 0"),
    ("builder batch_size -1", builder, lambda b: b.get_and_reset(-1), ValueError, "batch_size must be an int >= 0"),
    ("builder batch_size bool", builder, lambda b: b.get_and_reset(True), TypeError, "batch_size must be an int"),
    # Building and loading.
    ("processors of ints", no_object, lambda _: LogitsProcessors([5]), TypeError, "must be LogitsProcessor instances"),
    ("build config None", no_object, lambda _: build_logitsprocs(None, CPU, False, False), TypeError, "config must be a LogitsProcessorConfig"),
    ("build pooling str", no_object, lambda _: build_logitsprocs(CFG, CPU, False, "no"), TypeError, "is_pooling_model must be a bool"),
    ("build custom str", no_object, lambda _: build_logitsprocs(CFG, CPU, False, False, "kvref:X"), TypeError, "must be a list"),
    ("fqcns str", no_object, lambda _: load_logitsprocs_by_fqcns("kvref.sample.logits_processors:MinPLogitsProcessor"), TypeError, "must be a list"),
    ("plugins group int", no_object, lambda _: load_logitsprocs_plugins(5), TypeError, "group must be a str"),
    ("validate params None", no_object, lambda _: validate_logits_processors_parameters([MinPLogitsProcessor], None), TypeError, "sampling_params must be a SamplingParams"),
    # The sampler: a wrong-length temperature returned one sample per temperature, not per row.
    ("sample temperature too long", batch, lambda b: sample_logits(torch.zeros(2, VOCAB), b.logitsprocs, torch.ones(3)), ValueError, r"temperature must have shape \[2\]"),
    ("sample temperature float", batch, lambda b: sample_logits(torch.zeros(2, VOCAB), b.logitsprocs, 1.0), TypeError, "temperature must be a torch.Tensor"),
    ("sample temperature nan", batch, lambda b: sample_logits(torch.zeros(2, VOCAB), b.logitsprocs, torch.tensor([1.0, math.nan])), ValueError, "temperature must be >= 0"),
    ("sample temperature negative", batch, lambda b: sample_logits(torch.zeros(2, VOCAB), b.logitsprocs, torch.tensor([1.0, -1.0])), ValueError, "temperature must be >= 0"),
    ("sample top_k wrong length", batch, lambda b: sample_logits(torch.zeros(2, VOCAB), b.logitsprocs, torch.ones(2), torch.ones(1)), ValueError, r"top_k must have shape \[2\]"),
    ("sample top_p wrong length", batch, lambda b: sample_logits(torch.zeros(2, VOCAB), b.logitsprocs, torch.ones(2), None, torch.ones(3)), ValueError, r"top_p must have shape \[2\]"),
    ("sample logits numpy", batch, lambda b: sample_logits(np.zeros((2, VOCAB)), b.logitsprocs, torch.ones(2)), TypeError, "logits must be a torch.Tensor"),
    ("sample logits 1-D", batch, lambda b: sample_logits(torch.zeros(2), b.logitsprocs, torch.ones(2)), ValueError, "2-D"),
    ("sample empty vocab", batch, lambda b: sample_logits(torch.zeros(2, 0), b.logitsprocs, torch.ones(2)), ValueError, "at least one column"),
    ("sample procs None", no_object, lambda _: sample_logits(torch.zeros(1, VOCAB), None, torch.ones(1)), TypeError, "logitsprocs must be a LogitsProcessors"),
    ("sample force not callable", batch, lambda b: sample_logits(torch.zeros(2, VOCAB), b.logitsprocs, torch.ones(2), force="x"), TypeError, "force must be callable"),
    ("sample force wrong shape", batch, lambda b: sample_logits(torch.zeros(2, VOCAB), b.logitsprocs, torch.ones(2), force=lambda x: x[:1]), ValueError, "force must return"),
    ("sample generator int", batch, lambda b: sample_logits(torch.zeros(2, VOCAB), b.logitsprocs, torch.ones(2), generator=5), TypeError, "generator must be a torch.Generator"),
    ("top-k 1-D logits", no_object, lambda _: apply_top_k_top_p(torch.zeros(4), torch.tensor([1]), None), ValueError, "2-D"),
    ("top-k wrong length", no_object, lambda _: apply_top_k_top_p(torch.zeros(1, 4), torch.tensor([1, 2]), None), ValueError, r"top_k must have shape \[1\]"),
    ("top-k int", no_object, lambda _: apply_top_k_top_p(torch.zeros(1, 4), 1, None), TypeError, "top_k must be a torch.Tensor"),
    # SamplingParams: huge numbers overflowed, a lone int or a str passed for a list, EOS handling half-applied.
    ("params huge temperature", no_object, lambda _: SamplingParams(temperature=10**400), ValueError, "temperature must be a finite number"),
    ("params huge bias", no_object, lambda _: SamplingParams(logit_bias={1: 10**400}), ValueError, r"logit_bias\[1\] must be finite"),
    ("params bias id past int32", no_object, lambda _: SamplingParams(logit_bias={2**40: 1.0}), ValueError, "logit_bias token id must be < 2\\*\\*31"),
    ("params stop id past int32", no_object, lambda _: SamplingParams(stop_token_ids=[2**31]), ValueError, "stop_token_ids must be < 2\\*\\*31"),
    ("params stop int", no_object, lambda _: SamplingParams(stop_token_ids=5), TypeError, "stop_token_ids must be ints"),
    ("params stop str", no_object, lambda _: SamplingParams(stop_token_ids="ab"), TypeError, "stop_token_ids must be ints"),
    ("params ignore_eos int", no_object, lambda _: SamplingParams(ignore_eos=1), TypeError, "ignore_eos must be a bool"),
    ("eos config None", lambda: SamplingParams(stop_token_ids=[1]), lambda sp: sp.update_from_generation_config(None), TypeError, "generation_config must be a dict"),
    ("eos str", lambda: SamplingParams(stop_token_ids=[1]), lambda sp: sp.update_from_generation_config({"eos_token_id": "x"}, 2), TypeError, "eos_token_id"),
    ("eos list with str", lambda: SamplingParams(stop_token_ids=[1]), lambda sp: sp.update_from_generation_config({"eos_token_id": [4, "x"]}, 2), TypeError, "eos_token_id"),
    ("eos negative", lambda: SamplingParams(stop_token_ids=[1]), lambda sp: sp.update_from_generation_config({"eos_token_id": -1}, 2), ValueError, "eos_token_id"),
    ("model eos bool", lambda: SamplingParams(stop_token_ids=[1]), lambda sp: sp.update_from_generation_config({}, True), TypeError, "model_eos_token_id"),
    ("model eos negative", lambda: SamplingParams(stop_token_ids=[1]), lambda sp: sp.update_from_generation_config({"eos_token_id": 4}, -1), ValueError, "model_eos_token_id"),
]


@pytest.mark.parametrize("make, call, exc, match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_by_name_and_nothing_changes(make, call, exc, match):
    obj = make()
    before = snapshot(obj)
    with pytest.raises(exc, match=match):
        call(obj)
    assert snapshot(obj) == before


def test_vocab_checked_at_the_door_and_at_apply():
    """`validate_for_vocab` runs where the vocabulary is known: `PersistentBatch(vocab_size=...)` and `apply`."""
    b = PersistentBatch(2, build_logitsprocs(LogitsProcessorConfig(2), CPU, False, False))
    b.add_request("a", SamplingParams(logit_bias={9: 1.0}), None, [])  # vocabulary unknown here: accepted
    b.refresh()
    with pytest.raises(ValueError, match="token id 9 is outside the 8 logits columns"):
        sample_logits(torch.zeros(1, 8), b.logitsprocs, torch.zeros(1))
    assert sample_logits(torch.zeros(1, 10), b.logitsprocs, torch.zeros(1)).tolist() == [9]


# ---------------------------------------------------------------------------------------------------------------
# Property: any sequence of calls, good or bad; every refusal is a named error and leaves everything as it was.
# ---------------------------------------------------------------------------------------------------------------
JUNK = st.sampled_from([None, True, -1, 2**40, 1.5, "x", [], (), {}, np.int64(1), torch.zeros(2)])
REQ_IDS = st.sampled_from(["a", "b", "c", "d"])
PARAMS = st.builds(SamplingParams, min_p=st.sampled_from([0.0, 0.3]), min_tokens=st.integers(0, 2),
                   stop_token_ids=st.lists(st.integers(0, VOCAB), max_size=2),
                   logit_bias=st.none() | st.dictionaries(st.integers(0, VOCAB), st.just(1.0), max_size=2))


def maybe_one_bad(*good):
    """Good arguments, or (one time in four) the same with one of them replaced by junk."""
    def spoil(t):
        args, i, junk = t
        return args if i >= len(args) else args[:i] + (junk,) + args[i + 1:]
    return st.tuples(st.tuples(*good), st.integers(0, 4 * len(good) - 1), JUNK).map(spoil)


OP_ARGS = {
    "add_request": maybe_one_bad(REQ_IDS, PARAMS, st.none(), st.builds(list)),
    "remove_request": maybe_one_bad(REQ_IDS),
    "swap_states": maybe_one_bad(st.integers(-1, 3), st.integers(-1, 3)),
    "refresh": st.just(()),
    "apply": st.tuples(st.sampled_from([(1, VOCAB), (2, VOCAB), (3, VOCAB), (2, 2), (2,)])),
}
# adds and removes three times as likely as the rest, so a step often holds several of each
OPS = st.sampled_from(["add_request", "remove_request"] * 3 + ["swap_states", "refresh", "apply"]).flatmap(
    lambda name: st.tuples(st.just(name), OP_ARGS[name]))


@settings(max_examples=200)
@given(st.lists(OPS, min_size=5, max_size=40))
def test_a_refused_call_changes_nothing(ops):
    b = PersistentBatch(3, build_logitsprocs(LogitsProcessorConfig(3), CPU, False, False), vocab_size=VOCAB)
    for name, args in ops:
        before = snapshot(b)
        try:
            if name == "apply":
                for p in b.logitsprocs.all:
                    p.apply(torch.zeros(*args[0]))
            else:
                getattr(b, name)(*args)
        except (TypeError, ValueError, RuntimeError):
            assert snapshot(b) == before, (name, args)
