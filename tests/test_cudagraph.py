"""Tests of kvref.compilation.cudagraph: vLLM 0.33 golden vectors, a naive dispatcher model, properties, the wrapper contract."""
import json
from pathlib import Path

import pytest
import torch
from hypothesis import assume, given, strategies as st

from kvref.compilation.cudagraph import (
    AttentionCGSupport, BatchDescriptor, CUDAGraphMode, CUDAGraphWrapper, CudagraphDispatcher, LoRASettings,
    RUNTIME_MODES, capture_cudagraphs, default_capture_sizes, derive_capture_sizes, resolve_cudagraph_mode,
    resolve_cudagraph_mode_and_sizes, round_capture_sizes_for_spec_decode, set_forward_context,
)

NONE, PIECEWISE, FULL = CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL
FDO, FAP = CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL_AND_PIECEWISE
GOLDEN = json.loads((Path(__file__).parent.parent / "golden" / "cudagraph" / "vllm-0.33-cudagraph-dispatch.json").read_text())


def triple(key: BatchDescriptor) -> list:
    return [key.num_tokens, key.num_reqs, key.uniform]


def make(mode, sizes, max_num_seqs, q=1, lora=None) -> CudagraphDispatcher:
    d = CudagraphDispatcher(sizes, max_num_seqs, lora)
    d.initialize_cudagraph_keys(mode, q)
    return d


# ---------------------------------------------------------------- golden: vLLM 0.33.0's own decisions

@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"{c['mode']}-q{c['q']}-seqs{c['max_num_seqs']}")
def test_golden_keys_and_decisions(case):
    d = CudagraphDispatcher(case["sizes"], case["max_num_seqs"])
    if "error" in case:
        with pytest.raises(ValueError, match="not a multiple of the uniform decode query length"):
            d.initialize_cudagraph_keys(case["mode"], case["q"])
        return
    d.initialize_cudagraph_keys(case["mode"], case["q"])
    for mode in ("FULL", "PIECEWISE"):
        assert sorted(map(tuple, case["keys"][mode]), key=str) == sorted((tuple(triple(k)) for k in d.cudagraph_keys[CUDAGraphMode[mode]]), key=str)
        assert all(not k.has_lora and k.num_active_loras == 0 for k in d.cudagraph_keys[CUDAGraphMode[mode]])
    for batch in case["batches"]:
        if "error" in batch:
            with pytest.raises(ValueError, match="round the sizes"):
                d.dispatch(batch["num_tokens"], uniform_decode=batch["uniform"])
            continue
        mode, key = d.dispatch(batch["num_tokens"], uniform_decode=batch["uniform"])
        assert (mode.name, triple(key)) == (batch["mode"], batch["desc"]), batch


def test_golden_covers_every_mode_and_both_refusals():
    cases = GOLDEN["cases"]
    assert {c["mode"] for c in cases} == {m.name for m in CUDAGraphMode}
    assert any("error" in c for c in cases) and any("error" in b for c in cases for b in c.get("batches", []))


# ---------------------------------------------------------------- the issue's examples

def decide(d, n, uniform=False):
    mode, key = d.dispatch(n, uniform_decode=uniform)
    return mode.name, tuple(triple(key))


def test_issue_examples():
    sizes = [1, 2, 4, 8]
    full, fap, fdo, pw = (make(m, sizes, 8) for m in ("FULL", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "PIECEWISE"))
    assert decide(full, 3, True) == ("FULL", (4, 4, False))
    assert decide(full, 5) == ("FULL", (8, 8, False))
    assert decide(full, 9) == ("NONE", (9, None, False))
    assert decide(fap, 3, True) == ("FULL", (4, 4, True))
    assert decide(fap, 3) == ("PIECEWISE", (4, None, False))
    assert decide(fap, 8, True) == ("FULL", (8, 8, True))
    assert decide(fdo, 3, True) == ("FULL", (4, 4, True))
    assert decide(fdo, 3) == ("NONE", (3, None, False))
    assert decide(pw, 5) == ("PIECEWISE", (8, None, False))
    assert round_capture_sizes_for_spec_decode(sizes, 8, 3) == ([3, 6], 6)


# ---------------------------------------------------------------- a naive dispatcher, written from the rules

def naive_lora_cases(lora):
    if lora is None: return [0]
    top = lora.max_loras + 1
    counts = [n for n in range(1, top + 1) if n in (1, 2, 4, 8, 16, 32, 64, top)] if lora.specialize_active_loras else [top]
    return ([0] + counts) if lora.specialize else [top]


def naive_keys(mode, sizes, max_num_seqs, q, lora):
    """Keys as (num_tokens, num_reqs, uniform, n_loras), from the rules in prose."""
    cases, full, piecewise = naive_lora_cases(lora), set(), set()
    for size in sizes:
        for n in cases:
            if mode in (PIECEWISE, FAP): piecewise.add((size, None, False, n))
            if mode == FULL: full.add((size, min(size, max_num_seqs), False, n))
            if mode in (FDO, FAP) and q <= size <= q * max_num_seqs:
                if size % q: return "error"
                full.add((size, size // q, True, n))
    return {FULL: full, PIECEWISE: piecewise}


def naive_dispatch(mode, sizes, max_num_seqs, q, lora, n, uniform, n_loras, allowed):
    eager = (NONE, (n, None, False, 0))
    if mode == NONE or not sizes or n > sizes[-1] or allowed <= {NONE}: return eager
    padded = min(s for s in sizes if s >= n)
    if n_loras and lora.specialize_active_loras: n_loras = min(c for c in naive_lora_cases(lora) if c >= n_loras)
    elif n_loras: n_loras = lora.max_loras + 1
    cases = naive_lora_cases(lora)
    decode_routine = mode in (FDO, FAP)
    if FULL in allowed:
        if uniform and decode_routine:
            if padded % q: return "error"
            if padded <= q * max_num_seqs and n_loras in cases: return FULL, (padded, padded // q, True, n_loras)
        elif mode == FULL and n_loras in cases:
            return FULL, (padded, min(padded, max_num_seqs), False, n_loras)
    elif uniform and decode_routine and padded % q:
        return "error"
    if PIECEWISE in allowed and mode in (PIECEWISE, FAP) and n_loras in cases: return PIECEWISE, (padded, None, False, n_loras)
    if NONE not in allowed: return "error"
    return eager


def as4(key):
    return (key.num_tokens, key.num_reqs, key.uniform, key.num_active_loras)


sizes_st = st.lists(st.integers(1, 96), min_size=1, max_size=8, unique=True).map(sorted)
lora_st = st.none() | st.builds(LoRASettings, st.integers(1, 6), st.booleans(), st.booleans())
modes_st = st.sampled_from(list(CUDAGraphMode))


@st.composite
def configs(draw):
    return draw(modes_st), draw(sizes_st), draw(st.integers(1, 16)), draw(st.integers(1, 4)), draw(lora_st)


@st.composite
def batches(draw, max_num_seqs, q, lora, top):
    uniform = draw(st.booleans())
    n = q * draw(st.integers(1, max_num_seqs)) if uniform else draw(st.integers(1, top + 4))
    n_loras = draw(st.integers(0, lora.max_loras)) if lora else 0
    allowed = draw(st.sampled_from([None, {FULL}, {PIECEWISE, NONE}, {FULL, NONE}, set(RUNTIME_MODES)]))
    return n, uniform, n_loras, allowed


@given(configs(), st.data())
def test_dispatcher_matches_naive_model(config, data):
    mode, sizes, max_num_seqs, q, lora = config
    expected_keys = naive_keys(mode, sizes, max_num_seqs, q, lora)
    d = CudagraphDispatcher(sizes, max_num_seqs, lora)
    if expected_keys == "error":
        with pytest.raises(ValueError):
            d.initialize_cudagraph_keys(mode, q)
        return
    d.initialize_cudagraph_keys(mode, q)
    assert {m: {as4(k) for k in keys} for m, keys in d.cudagraph_keys.items()} == expected_keys
    for n, uniform, n_loras, allowed in data.draw(st.lists(batches(max_num_seqs, q, lora, sizes[-1]), min_size=1, max_size=8)):
        expected = naive_dispatch(mode, sizes, max_num_seqs, q, lora, n, uniform, n_loras,
                                  set(RUNTIME_MODES) if allowed is None else allowed)
        call = lambda: d.dispatch(n, uniform, n_loras > 0, n_loras, valid_modes=allowed)
        if expected == "error":
            with pytest.raises(ValueError):
                call()
            continue
        got_mode, key = call()
        assert (got_mode, as4(key)) == expected
        # properties the issue names, checked on kvref's own answer
        if got_mode == NONE:
            assert key == BatchDescriptor(n)
        else:
            assert key in d.cudagraph_keys[got_mode]
            assert key.num_tokens >= n and key.num_tokens == min(s for s in sizes if s >= n)
        if n <= sizes[-1] and (allowed is None or FULL in allowed):  # FULL whenever the exact key exists and FULL is allowed
            padded, u = min(s for s in sizes if s >= n), uniform and mode.separate_routine()
            loras = lora.effective_count(n_loras) if n_loras else 0
            exact = (padded, padded // q if u else min(padded, max_num_seqs), u, loras)
            if exact in {as4(k) for k in d.cudagraph_keys[FULL]}: assert got_mode == FULL


@given(configs())
def test_capture_descs_list_every_key_once_in_order(config):
    mode, sizes, max_num_seqs, q, lora = config
    assume(naive_keys(mode, sizes, max_num_seqs, q, lora) != "error")
    d = make(mode, sizes, max_num_seqs, q, lora)
    descs = d.get_capture_descs()
    assert [m for m, _ in descs] == [m for m in (PIECEWISE, FULL) if d.cudagraph_keys[m]]
    for m, keys in descs:
        assert set(keys) == d.cudagraph_keys[m] and len(keys) == len(set(keys))
        assert [k.num_tokens for k in keys] == sorted((k.num_tokens for k in keys), reverse=True)


# ---------------------------------------------------------------- capture sizes

@given(st.integers(1, 600))
def test_default_ladder(top):
    sizes = default_capture_sizes(top)
    assert sizes == sorted(set(sizes)) and all(s <= top for s in sizes)
    assert all(b - a == (16 if a >= 256 else 8) for a, b in zip(sizes, sizes[1:]) if a >= 8)
    assert sizes[:3] == [s for s in (1, 2, 4) if s <= top]


@given(st.integers(1, 300), st.integers(1, 2048), st.integers(0, 4),
       st.none() | st.lists(st.integers(1, 1024), min_size=1, max_size=10), st.none() | st.integers(1, 1024))
def test_derive_capture_sizes(max_num_seqs, mnbt, k, user_sizes, user_max):
    try:
        sizes, top = derive_capture_sizes(max_num_seqs, mnbt, k, user_sizes, user_max)
    except ValueError as e:
        assert user_sizes is not None and user_max is not None and "disagrees" in str(e)
        kept = [s for s in user_sizes if s <= mnbt]
        assert user_max != (max(kept) if kept else 0)
        return
    assert sizes == sorted(set(sizes)) and all(s <= mnbt for s in sizes)
    assert top == (sizes[-1] if sizes else 0)
    if user_sizes is not None:
        assert sizes == sorted({s for s in user_sizes if s <= mnbt})
    else:
        ceiling = min(user_max if user_max is not None else min(max_num_seqs * (1 + k) * 2, 512), mnbt)
        assert sizes == default_capture_sizes(ceiling)


@given(st.lists(st.integers(1, 200), min_size=1, max_size=10, unique=True).map(sorted), st.integers(1, 6))
def test_rounding_for_spec_decode(sizes, q):
    top = sizes[-1]
    try:
        rounded, new_top = round_capture_sizes_for_spec_decode(sizes, top, q)
    except ValueError:
        assert q > top
        return
    assert all(s % q == 0 and s <= top for s in rounded) and rounded == sorted(set(rounded))
    assert new_top == rounded[-1] <= top
    for s in sizes:  # every size that can be rounded up within the ceiling is
        if -(-s // q) * q <= top: assert -(-s // q) * q in rounded


def test_spec_decode_sizes_only_when_decode_is_full():
    args = dict(max_num_seqs=8, max_num_batched_tokens=8192, num_speculative_tokens=2, capture_sizes=[1, 2, 4, 8])
    assert resolve_cudagraph_mode_and_sizes("FULL_AND_PIECEWISE", AttentionCGSupport.ALWAYS, **args)[1:] == ([3, 6], 6)
    assert resolve_cudagraph_mode_and_sizes("PIECEWISE", AttentionCGSupport.ALWAYS, **args)[1:] == ([1, 2, 4, 8], 8)
    # single-token-decode backend + spec decode: decode half lost, sizes left unrounded
    res, sizes, top = resolve_cudagraph_mode_and_sizes("FULL_AND_PIECEWISE", AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE, **args)
    assert (res.mode, sizes, top) == (PIECEWISE, [1, 2, 4, 8], 8)
    assert resolve_cudagraph_mode_and_sizes("NONE", AttentionCGSupport.ALWAYS, **args)[1:] == ([], 0)


# ---------------------------------------------------------------- mode resolution

resolution_args = st.tuples(modes_st, st.sampled_from(list(AttentionCGSupport)), st.booleans(), st.booleans(), st.integers(1, 4))


@given(resolution_args)
def test_resolution_is_idempotent_and_lands_on_a_runnable_mode(args):
    mode, support, split, compiled, q = args
    assume(compiled or not split)
    try:
        first = resolve_cudagraph_mode(mode, support, None, split, compiled, q)
    except ValueError as e:
        assert support == AttentionCGSupport.NEVER and "choose PIECEWISE" in str(e)
        return
    again = resolve_cudagraph_mode(first.mode, support, None, split, compiled, q)
    assert again.mode == first.mode and again.downgrades == ()
    m = first.mode
    assert not m.requires_piecewise_compilation() or (compiled and split)
    assert m.mixed_mode() != FULL or support == AttentionCGSupport.ALWAYS
    assert m.decode_mode() != FULL or support > AttentionCGSupport.NEVER
    assert m.decode_mode() != FULL or q == 1 or support >= AttentionCGSupport.UNIFORM_BATCH
    steps = [first.requested] + [s.after for s in first.downgrades]
    assert steps[-1] == m and all(s.before == a for s, a in zip(first.downgrades, steps)) and all(s.reason for s in first.downgrades)
    if support == AttentionCGSupport.ALWAYS and compiled and split: assert m == mode  # nothing to give up


# The issue's rules written out by hand (not computed): requested mode -> resolved mode for supports
# ALWAYS, UNIFORM_BATCH, UNIFORM_SINGLE_TOKEN_DECODE, NEVER; "error" where vLLM refuses.
RESOLUTION_BY_HAND = {
    # (attention split, piecewise compilation, uniform decode query length)
    (True, True, 1): {FULL: [FULL, FAP, FAP, "error"], FDO: [FDO, FDO, FDO, PIECEWISE], FAP: [FAP, FAP, FAP, PIECEWISE],
                      PIECEWISE: [PIECEWISE] * 4, NONE: [NONE] * 4},
    (False, True, 1): {FULL: [FULL, FDO, FDO, "error"], FDO: [FDO, FDO, FDO, NONE], FAP: [FULL, FDO, FDO, "error"],
                       PIECEWISE: [NONE] * 4, NONE: [NONE] * 4},
    (False, False, 1): {FULL: [FULL, FDO, FDO, "error"], FDO: [FDO, FDO, FDO, NONE], FAP: [NONE] * 4,
                        PIECEWISE: [NONE] * 4, NONE: [NONE] * 4},
    (True, True, 3): {FULL: [FULL, FAP, PIECEWISE, "error"], FDO: [FDO, FDO, PIECEWISE, PIECEWISE],
                      FAP: [FAP, FAP, PIECEWISE, PIECEWISE], PIECEWISE: [PIECEWISE] * 4, NONE: [NONE] * 4},
    (False, True, 3): {FULL: [FULL, FDO, NONE, "error"], FDO: [FDO, FDO, NONE, NONE], FAP: [FULL, FDO, NONE, "error"],
                       PIECEWISE: [NONE] * 4, NONE: [NONE] * 4},
}


@pytest.mark.parametrize("split, compiled, q", list(RESOLUTION_BY_HAND))
def test_resolution_table_by_hand(split, compiled, q):
    supports = sorted(AttentionCGSupport, reverse=True)
    def resolved(mode, support):
        try: return resolve_cudagraph_mode(mode, support, None, split, compiled, q).mode
        except ValueError: return "error"
    got = {mode: [resolved(mode, s) for s in supports] for mode in RESOLUTION_BY_HAND[split, compiled, q]}
    assert got == RESOLUTION_BY_HAND[split, compiled, q]


def test_resolution_refusals_and_bad_input():
    with pytest.raises(ValueError, match="choose PIECEWISE"):
        resolve_cudagraph_mode("FULL", AttentionCGSupport.NEVER)
    with pytest.raises(ValueError, match="needs piecewise_compilation"):
        resolve_cudagraph_mode("FULL", attention_split=True, piecewise_compilation=False)
    with pytest.raises(ValueError, match="unknown cudagraph_mode 'FULLY'"):
        resolve_cudagraph_mode("FULLY")
    with pytest.raises(TypeError, match="AttentionCGSupport"):
        resolve_cudagraph_mode("FULL", 3)


# ---------------------------------------------------------------- the wrapper and its CPU stand-in

class Toy:
    """Pieces around an attention op that writes into a persistent buffer; the FULL wrapper around it all."""
    def __init__(self, sizes, hidden=3, max_tokens=128):
        g = torch.Generator().manual_seed(7)
        self.w = [torch.randn(hidden, hidden, generator=g) for _ in range(2)]
        self.attn = torch.zeros(max_tokens, hidden)
        self.pieces = [CUDAGraphWrapper(lambda x, i=i: torch.relu(x @ self.w[i]) + 1, "PIECEWISE", "cpu") for i in range(2)]
        self.full = CUDAGraphWrapper(self.forward, "FULL", "cpu")
        self.inputs = torch.zeros(max_tokens, hidden)

    def forward(self, x):
        h = self.pieces[0](x)
        out = self.attn[: h.shape[0]]
        torch.mul(h, h.sum(dim=-1, keepdim=True).sin(), out=out)
        return self.pieces[1](out)

    def dummy_run(self, key):
        return self.full(self.inputs[: key.num_tokens])

    def eager(self, x):
        with set_forward_context(NONE):
            return self.forward(x).clone()


@given(configs(), st.data())
def test_stand_in_replay_equals_eager_for_every_captured_key(config, data):
    mode, sizes, max_num_seqs, q, _ = config
    assume(naive_keys(mode, sizes, max_num_seqs, q, None) != "error")
    d = make(mode, sizes, max_num_seqs, q)
    toy = Toy(sizes)
    captured = capture_cudagraphs(toy.dummy_run, d, num_warmups=1)
    assert captured == sum(len(keys) for _, keys in d.get_capture_descs())
    assert toy.full.capture_count == len(d.cudagraph_keys[FULL])
    assert all(p.capture_count == len(d.cudagraph_keys[PIECEWISE]) for p in toy.pieces)
    for mode_, keys in d.get_capture_descs():
        for key in keys:
            x = torch.randn(key.num_tokens, 3, generator=torch.Generator().manual_seed(data.draw(st.integers(0, 2**16))))
            toy.inputs[: key.num_tokens].copy_(x)
            replays = toy.full.replay_count + sum(p.replay_count for p in toy.pieces)
            with set_forward_context(mode_, key):
                out = toy.full(toy.inputs[: key.num_tokens])
            torch.testing.assert_close(out, toy.eager(x))
            assert toy.full.replay_count + sum(p.replay_count for p in toy.pieces) == replays + (1 if mode_ == FULL else 2)


def test_wrapper_contract_and_errors():
    d = make("FULL_AND_PIECEWISE", [2, 4], 4)
    toy = Toy([2, 4])
    capture_cudagraphs(toy.dummy_run, d)
    key = BatchDescriptor(4, 4, True)
    toy.inputs[:4].copy_(torch.ones(4, 3))
    with set_forward_context(FULL, key):
        first = toy.full(toy.inputs[:4])
        kept = first.clone()
    toy.inputs[:4].copy_(-torch.ones(4, 3))
    with set_forward_context(FULL, key):
        second = toy.full(toy.inputs[:4])
    assert second is first and not torch.equal(first, kept)  # outputs alias one static buffer
    with set_forward_context(FULL, key):
        with pytest.raises(ValueError, match=r"captured with input shapes \[\(4, 3\)\], got \[\(2, 3\)\]"):
            toy.full(toy.inputs[:2])
        with pytest.raises(ValueError, match="copy new values into the captured buffers"):
            toy.full(torch.zeros(4, 3))
    with set_forward_context(FULL, BatchDescriptor(3, 3, True)):
        with pytest.raises(ValueError, match="has no graph for"):
            toy.full(toy.inputs[:3])
    with pytest.raises(RuntimeError, match="no forward context"):
        toy.full(toy.inputs[:4])
    with pytest.raises(ValueError, match="needs a batch descriptor"):
        with set_forward_context(FULL):
            pass
    with pytest.raises(ValueError, match="not FULL_AND_PIECEWISE; dispatch first"):
        with set_forward_context(FAP, key):
            pass
    with pytest.raises(ValueError, match="bound to FULL or PIECEWISE"):
        CUDAGraphWrapper(lambda x: x, NONE)


def test_lora_keys_and_rounding_of_active_adapters():
    lora = LoRASettings(max_loras=6, specialize_active_loras=True)
    assert lora.cases() == [0, 1, 2, 4, 7]
    d = make("FULL_AND_PIECEWISE", [1, 2, 4], 4, lora=lora)
    assert len(d.cudagraph_keys[PIECEWISE]) == 3 * 5 and len(d.cudagraph_keys[FULL]) == 3 * 5
    assert [d.dispatch(2, True, n > 0, n)[1].num_active_loras for n in range(7)] == [0, 1, 2, 4, 4, 7, 7]
    plain = make("PIECEWISE", [1, 2, 4], 4, lora=LoRASettings(max_loras=6))
    assert [plain.dispatch(3, False, n > 0, n)[1].num_active_loras for n in range(3)] == [0, 7, 7]
    # without specialization only LoRA graphs exist: a batch without adapters finds none (as in vLLM)
    unspecialized = make("PIECEWISE", [1, 2, 4], 4, lora=LoRASettings(max_loras=6, specialize=False))
    assert unspecialized.dispatch(3) == (NONE, BatchDescriptor(3))
    assert unspecialized.dispatch(3, has_lora=True, num_active_loras=1) == (PIECEWISE, BatchDescriptor(4, None, False, True, 7))


# ---------------------------------------------------------------- bad input to the dispatcher

def test_dispatcher_bad_input():
    with pytest.raises(ValueError, match="strictly ascending"):
        CudagraphDispatcher([2, 2], 4)
    with pytest.raises(ValueError, match="max_num_seqs must be an int >= 1"):
        CudagraphDispatcher([2], 0)
    d = make("FULL_AND_PIECEWISE", [2, 4], 4, q=2, lora=LoRASettings(2))
    with pytest.raises(ValueError, match="num_tokens must be an int >= 1"):
        d.dispatch(0)
    with pytest.raises(ValueError, match="multiple of 2 tokens, at most 8"):
        d.dispatch(3, uniform_decode=True)
    with pytest.raises(ValueError, match="disagrees with num_active_loras=0"):
        d.dispatch(2, has_lora=True)
    with pytest.raises(ValueError, match="exceeds max_loras=2"):
        d.dispatch(2, has_lora=True, num_active_loras=3)
    with pytest.raises(ValueError, match="runtime modes"):
        d.dispatch(2, valid_modes={FAP})
    with pytest.raises(ValueError, match="leaves no runtime mode"):
        d.dispatch(2, valid_modes=[FULL], invalid_modes=[FULL])
    assert d.dispatch(2, uniform_decode=True, has_lora=True, num_active_loras=1) == (FULL, BatchDescriptor(2, 1, True, True, 3))
    assert d.dispatch(2, has_lora=True, num_active_loras=2) == (PIECEWISE, BatchDescriptor(2, None, False, True, 3))
    with pytest.raises(ValueError, match="attention is not a split point"):
        CudagraphDispatcher([2], 4, attention_split=False).initialize_cudagraph_keys("PIECEWISE")
    assert CudagraphDispatcher([2], 4).dispatch(2) == (NONE, BatchDescriptor(2))  # keys not initialized yet


# ---------------------------------------------------------------- real CUDA graphs

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_cuda_graphs_replay_like_eager():
    d = make("FULL_AND_PIECEWISE", [1, 2, 4, 8], 8)
    hidden, g = 4, torch.Generator().manual_seed(0)
    w = [torch.randn(hidden, hidden, generator=g).cuda() for _ in range(2)]
    attn = torch.zeros(16, hidden, device="cuda")
    pieces = [CUDAGraphWrapper(lambda x, i=i: torch.tanh(x @ w[i]), "PIECEWISE", "cuda") for i in range(2)]

    def forward(x):
        out = attn[: x.shape[0]]
        torch.mul(pieces[0](x), 2.0, out=out)
        return pieces[1](out)

    full, inputs = CUDAGraphWrapper(forward, "FULL", "cuda"), torch.zeros(16, hidden, device="cuda")
    assert capture_cudagraphs(lambda key: full(inputs[: key.num_tokens]), d, num_warmups=2) == 8
    x = torch.randn(3, hidden, device="cuda")
    with set_forward_context(NONE):
        expected = forward(x).clone()
    for uniform in (True, False):
        mode, key = d.dispatch(3, uniform_decode=uniform)
        inputs[:3].copy_(x)
        inputs[3: key.num_tokens].zero_()
        with set_forward_context(mode, key):
            got = full(inputs[: key.num_tokens])[:3]
        torch.cuda.synchronize()
        torch.testing.assert_close(got, expected)
    assert full.replay_count == 1 and sum(p.replay_count for p in pieces) == 2


# ---------------------------------------------------------------- the CLI

def test_cli(capsys):
    from kvref.cli import cudagraph_main
    assert cudagraph_main(["--max-num-seqs", "8", "--capture-sizes", "1,2,4,8", "--backend", "FlashAttention v2", "3u", "3", "9"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "mode: FULL_AND_PIECEWISE", "capture sizes: [1, 2, 4, 8] (max 8)", "keys: PIECEWISE 4, FULL 4",
        "3 uniform -> FULL (4, 4, True)", "3 -> PIECEWISE (4, None, False)", "9 -> NONE (9, None, False)"]
    assert cudagraph_main(["--mode", "FULL", "--num-speculative-tokens", "2", "--max-num-seqs", "4", "6u"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["capture sizes: [3, 6, 9, 18, 24] (max 24)", "keys: PIECEWISE 0, FULL 5",
                                                         "6 uniform -> FULL (6, 4, False)"]
    for argv, message in [(["--mode", "FULL", "--backend", "Nope"], "unknown attention backend 'Nope'"),
                          (["--mode", "FULL", "--backend", "Mamba attention", "--no-attention-split", "--capture-sizes", "1,2,64",
                            "--max-capture-size", "8"], "disagrees"),
                          (["--mode", "WHOLE"], "unknown cudagraph_mode 'WHOLE'"),
                          (["--capture-sizes", "1,a"], "--capture-sizes takes comma-separated integers like 1,2,4,8; got 'a'"),
                          (["--num-speculative-tokens", "-1"], "num_speculative_tokens must be an int >= 0, got -1"),
                          (["--max-num-seqs", "many"], "argument --max-num-seqs: invalid int value: 'many'")]:
        assert cudagraph_main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("kvref cudagraph: error: ") and message in err and err.count("\n") == 1


def test_cli_through_the_console_command():
    import shutil, subprocess, sys
    from kvref.cli import SUBCOMMANDS
    if "cudagraph" not in SUBCOMMANDS:
        pytest.skip("`kvref cudagraph` is not wired into kvref.cli yet")
    exe = Path(sys.executable).with_name("kvref")
    command = [str(exe)] if exe.exists() else [shutil.which("kvref") or "kvref"]
    done = subprocess.run(command + ["cudagraph", "--max-num-seqs", "8", "--capture-sizes", "1,2,4,8", "3u"],
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "3 uniform -> FULL (4, 4, True)"
    bad = subprocess.run(command + ["cudagraph", "--mode", "WHOLE"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
