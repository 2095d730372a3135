"""CUDA graphs (issue 12): refused calls change nothing, wrong types get named errors, no blow-up from one number."""
import copy
import re

import pytest
import torch
from hypothesis import given, settings, strategies as st

from kvref.compilation.cudagraph import (
    MAX_DEFAULT_CAPTURE_SIZE, BatchDescriptor, CUDAGraphMode, CUDAGraphWrapper, CudagraphDispatcher, LoRASettings,
    capture_cudagraphs, default_capture_sizes, derive_capture_sizes, min_cg_support, resolve_cudagraph_mode,
    resolve_cudagraph_mode_and_sizes, round_capture_sizes_for_spec_decode, set_forward_context,
)

NONE, FULL, FAP = CUDAGraphMode.NONE, CUDAGraphMode.FULL, CUDAGraphMode.FULL_AND_PIECEWISE


def snapshot(dispatcher):
    return copy.deepcopy(vars(dispatcher))


def test_a_refused_initialize_leaves_a_working_dispatcher_working():
    d = CudagraphDispatcher([1, 2, 3, 4, 8], 8)
    d.initialize_cudagraph_keys(FAP, 1)
    before, decision = snapshot(d), d.dispatch(8)
    assert decision[0] is not NONE
    with pytest.raises(ValueError, match="not a multiple of the uniform decode query length 2"):
        d.initialize_cudagraph_keys(FAP, 2)  # size 3 is a decode size but not a multiple of 2
    assert snapshot(d) == before and d.dispatch(8) == decision


def test_padded_size_names_its_limits():
    d = CudagraphDispatcher([1, 2, 4], 4)
    assert [d.padded_size(n) for n in (1, 2, 3, 4)] == [1, 2, 4, 4]
    with pytest.raises(ValueError, match="num_tokens=5 exceeds the largest capture size 4"):
        d.padded_size(5)
    with pytest.raises(ValueError, match="num_tokens must be an int >= 1"):
        d.padded_size(0)
    with pytest.raises(ValueError, match="no capture sizes"):
        CudagraphDispatcher([], 4).padded_size(1)


def test_one_huge_number_costs_nothing_up_front_or_is_refused_by_name():
    limit = f"at most {MAX_DEFAULT_CAPTURE_SIZE}"
    for call in (lambda: default_capture_sizes(10 ** 6),
                 lambda: derive_capture_sizes(256, 10 ** 9, max_capture_size=10 ** 6),
                 lambda: resolve_cudagraph_mode_and_sizes(FAP, min_cg_support([])[0], 256, 10 ** 9, 0, None, 10 ** 6)):
        with pytest.raises(ValueError, match=re.escape(limit)):
            call()
    assert derive_capture_sizes(256, 10 ** 9) == (default_capture_sizes(512), 512)  # the default ceiling is small
    assert len(default_capture_sizes(MAX_DEFAULT_CAPTURE_SIZE)) == 35 + (MAX_DEFAULT_CAPTURE_SIZE - 256) // 16
    huge = LoRASettings(10 ** 12, specialize_active_loras=True)  # counts are powers of two: 41 cases, not 10**12
    assert huge.cases()[:5] == [0, 1, 2, 4, 8] and huge.cases()[-1] == 10 ** 12 + 1 and len(huge.cases()) == 42


@given(st.integers(1, 300), st.booleans(), st.booleans())
def test_lora_cases_equal_the_plain_definition(max_loras, specialize, active):
    top = max_loras + 1
    plain = [n for n in range(1, top + 1) if n & (n - 1) == 0 or n == top] if active else [top]
    assert LoRASettings(max_loras, specialize, active).cases() == ([0] + plain if specialize else [top])


def test_named_errors_for_wrong_types():
    d = CudagraphDispatcher([1, 2, 4], 4, LoRASettings(2))
    d.initialize_cudagraph_keys(FAP)
    for call, exc, msg in [
        (lambda: CudagraphDispatcher(None, 4), TypeError, "capture_sizes must be a list of ints"),
        (lambda: CudagraphDispatcher([1, 2], 4, lora="yes"), TypeError, "lora must be a LoRASettings or None"),
        (lambda: CudagraphDispatcher([1, 2], 4, attention_split="no"), TypeError, "attention_split must be a bool"),
        (lambda: d.dispatch(2, uniform_decode="yes"), TypeError, "uniform_decode must be a bool"),
        (lambda: d.dispatch(2, has_lora=1, num_active_loras=1), TypeError, "has_lora must be a bool"),
        (lambda: d.dispatch(True), TypeError, "num_tokens must be an int >= 1"),
        (lambda: d.initialize_cudagraph_keys(FAP, True), TypeError, "uniform_decode_query_len must be an int"),
        (lambda: LoRASettings(2).effective_count(3), ValueError, "num_active_loras=3 exceeds max_loras=2"),
        (lambda: LoRASettings(2, specialize="no"), TypeError, "specialize must be a bool"),
        (lambda: min_cg_support(None), TypeError, "backends must be a list of attention backend names"),
        (lambda: min_cg_support("FlashInfer"), TypeError, "backends must be a list of attention backend names"),
        (lambda: resolve_cudagraph_mode(FAP, attention_split="no"), TypeError, "attention_split must be a bool"),
        (lambda: derive_capture_sizes(4, 64, capture_sizes=8), TypeError, "cudagraph_capture_sizes must be a list"),
        (lambda: round_capture_sizes_for_spec_decode([1, "2"], 4, 2), TypeError, "each capture size must be an int >= 1"),
        (lambda: round_capture_sizes_for_spec_decode([1, 2], True, 2), TypeError, "max_capture_size"),
        (lambda: CUDAGraphWrapper(123, FULL, "cpu"), TypeError, "runnable must be callable"),
        (lambda: capture_cudagraphs(123, d), TypeError, "dummy_run must be callable"),
        (lambda: capture_cudagraphs(lambda key: None, "d"), TypeError, "dispatcher must be a CudagraphDispatcher"),
        (lambda: set_forward_context(FULL, (4, 4, True)).__enter__(), TypeError, "batch_descriptor must be a BatchDescriptor"),
        (lambda: set_forward_context(NONE, None, capturing="yes").__enter__(), TypeError, "capturing must be a bool"),
    ]:
        with pytest.raises(exc, match=re.escape(msg)):
            call()


modes = st.sampled_from(list(CUDAGraphMode))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=6, unique=True).map(sorted), st.integers(1, 8),
       modes, st.integers(1, 4), modes, st.integers(-1, 4), st.booleans())
def test_every_refused_initialize_leaves_the_dispatcher_unchanged(sizes, max_num_seqs, mode, q, mode2, q2, split):
    d = CudagraphDispatcher(sizes, max_num_seqs, attention_split=split)
    try:
        d.initialize_cudagraph_keys(mode, q)
    except ValueError:
        pass
    before = snapshot(d)
    decisions = [d.dispatch(n) for n in range(1, sizes[-1] + 2)]
    try:
        d.initialize_cudagraph_keys(mode2, q2)
    except ValueError:
        assert snapshot(d) == before and [d.dispatch(n) for n in range(1, sizes[-1] + 2)] == decisions
