"""SamplingParams: every field the logits processors read is validated with an error that names the field."""
import math
import re

import pytest
from hypothesis import given, strategies as st

from kvref.sample.sampling_params import SamplingParams


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_min_p_range(v):
    if 0.0 <= v <= 1.0:
        assert SamplingParams(min_p=v, temperature=1.0).min_p == v
    else:
        with pytest.raises(ValueError, match=r"min_p must be in \[0, 1\]"):
            SamplingParams(min_p=v)


@given(st.integers(-5, 40), st.one_of(st.none(), st.integers(-2, 40)))
def test_min_and_max_tokens(min_tokens, max_tokens):
    ok = min_tokens >= 0 and (max_tokens is None or (max_tokens >= 1 and min_tokens <= max_tokens))
    if ok:
        sp = SamplingParams(min_tokens=min_tokens, max_tokens=max_tokens)
        assert (sp.min_tokens, sp.max_tokens) == (min_tokens, max_tokens)
    else:
        with pytest.raises(ValueError, match="min_tokens|max_tokens"):
            SamplingParams(min_tokens=min_tokens, max_tokens=max_tokens)


@given(st.dictionaries(st.integers(0, 200), st.floats(allow_nan=True, allow_infinity=True), max_size=4),
       st.integers(1, 150))
def test_logit_bias_values_and_vocab(bias, vocab):
    if not all(math.isfinite(b) for b in bias.values()):
        with pytest.raises(ValueError, match=r"logit_bias\[\d+\] must be finite"):
            SamplingParams(logit_bias=bias)
        return
    sp = SamplingParams(logit_bias=bias)
    outside = sorted(t for t in bias if t >= vocab)
    if outside:
        want = f"logit_bias token ids {outside} are outside the vocabulary (vocab_size={vocab})"
        with pytest.raises(ValueError, match=re.escape(want)):
            sp.validate_for_vocab(vocab)
    else:
        assert sp.validate_for_vocab(vocab) is sp


@given(st.lists(st.integers(0, 200), max_size=4), st.integers(1, 150))
def test_stop_token_ids_vocab(stops, vocab):
    sp = SamplingParams(stop_token_ids=stops)
    assert sp.all_stop_token_ids == set(stops)
    if any(t >= vocab for t in stops):
        with pytest.raises(ValueError, match="stop_token_ids .* outside the vocabulary"):
            sp.validate_for_vocab(vocab)
    else:
        sp.validate_for_vocab(vocab)


@pytest.mark.parametrize("kwargs, exc, msg", [
    (dict(min_tokens=True), TypeError, "min_tokens must be an int"),
    (dict(top_k=1.5), TypeError, "top_k must be an int"),
    (dict(min_p="0.1"), TypeError, "min_p must be a number"),
    (dict(logit_bias={"5": 1.0}), TypeError, "logit_bias keys must be int token ids"),
    (dict(logit_bias={5: None}), TypeError, r"logit_bias\[5\] must be a number"),
    (dict(logit_bias=[(5, 1.0)]), TypeError, "logit_bias must be a dict"),
    (dict(logit_bias={-1: 1.0}), ValueError, "logit_bias token id must be >= 0"),
    (dict(stop_token_ids=[-3]), ValueError, "stop_token_ids must be >= 0"),
    (dict(stop_token_ids=[1.0]), TypeError, "stop_token_ids must be ints"),
    (dict(temperature=-0.1), ValueError, "temperature must be a finite number >= 0"),
    (dict(temperature=math.nan), ValueError, "temperature"),
    (dict(top_p=1.5), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_k=-2), ValueError, "top_k must be 0 or -1"),
    (dict(thinking_token_budget=True), TypeError, "thinking_token_budget must be an int or None"),
    (dict(thinking_token_budget=1.0), TypeError, "thinking_token_budget must be an int or None"),
    (dict(thinking_token_budget=-2), ValueError, "thinking_token_budget must be >= -1"),
])
def test_bad_fields_name_themselves(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        SamplingParams(**kwargs)


def test_validate_for_vocab_rejects_bad_vocab_size():
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="vocab_size must be a positive int"):
            SamplingParams().validate_for_vocab(bad)


def test_thinking_budget_accepts_unlimited_spellings():
    assert SamplingParams(thinking_token_budget=None).thinking_token_budget is None
    assert SamplingParams(thinking_token_budget=-1).thinking_token_budget == -1
    assert SamplingParams(thinking_token_budget=0).thinking_token_budget == 0


def test_greedy_turns_filters_off_and_top_k_minus_one_means_off():
    sp = SamplingParams(temperature=0.0, top_p=0.5, top_k=3, min_p=0.2)
    assert (sp.sampling_type, sp.top_p, sp.top_k, sp.min_p) == ("greedy", 1.0, 0, 0.0)
    assert SamplingParams(top_k=-1).top_k == 0


def test_generation_config_eos():
    sp = SamplingParams(stop_token_ids=[9])
    sp.update_from_generation_config({"eos_token_id": 4}, model_eos_token_id=2)
    assert sp.all_stop_token_ids == {2, 4, 9}
    assert sp.stop_token_ids == [4, 9]
    ignore = SamplingParams(ignore_eos=True)
    ignore.update_from_generation_config({"eos_token_id": [2, 4]}, model_eos_token_id=2)
    assert ignore.all_stop_token_ids == {2, 4} and ignore.stop_token_ids == []
    plain = SamplingParams()
    plain.update_from_generation_config({}, model_eos_token_id=2)
    assert plain.all_stop_token_ids == {2} and plain.stop_token_ids == []
