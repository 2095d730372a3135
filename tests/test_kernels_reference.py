"""The float64 oracle of `kvref.kernels.reference` against deliberately naive models, plus its input checks.

Nothing here imports Triton: these tests hold the oracle itself to account.
"""
import math
import re
import subprocess
import sys

import pytest
import torch
from hypothesis import given, strategies as st

from kvref.kernels import (PAD_SLOT_ID, assert_attention_close, block_table_svg, compute_slot_mapping, dense_attention,
                           gather_kv, kv_cache_shape, page_kv, paged_attention_ref, random_paged_batch,
                           reshape_and_cache_ref, split_kv_cache)


def naive_attention(query, keys, values, query_pos, scale, sliding_window=None, softcap=None):
    """One query vector over a dense history, one head, with Python loops over positions (float64)."""
    scores = []
    for j in range(len(keys)):
        if j > query_pos or (sliding_window is not None and query_pos - j >= sliding_window):
            continue
        s = scale * float(query.double() @ keys[j].double())
        if softcap:
            s = softcap * math.tanh(s / softcap)
        scores.append((j, s))
    top = max(s for _, s in scores)
    weights = [(j, math.exp(s - top)) for j, s in scores]
    total = sum(w for _, w in weights)
    return sum(w * values[j].double() for j, w in weights) / total


def naive_batch_attention(batch, scale=None, sliding_window=None, softcap=None):
    q, kc, vc = batch["query"], batch["key_cache"], batch["value_cache"]
    starts, lens = batch["query_start_loc"].tolist(), batch["seq_lens"].tolist()
    block_size, num_kv_heads, head_size = kc.shape[1:]
    group = q.shape[1] // num_kv_heads
    scale = 1 / math.sqrt(head_size) if scale is None else scale
    out = torch.zeros(q.shape, dtype=torch.float64)
    for s, seq_len in enumerate(lens):
        table = batch["block_table"][s].tolist()
        keys = [kc[table[p // block_size], p % block_size] for p in range(seq_len)]
        values = [vc[table[p // block_size], p % block_size] for p in range(seq_len)]
        q_len = starts[s + 1] - starts[s]
        for i in range(q_len):
            for h in range(q.shape[1]):
                out[starts[s] + i, h] = naive_attention(q[starts[s] + i, h], [k[h // group] for k in keys],
                                                        [v[h // group] for v in values], seq_len - q_len + i,
                                                        scale, sliding_window, softcap)
    return out


batches = st.lists(st.tuples(st.integers(1, 20), st.integers(0, 20)), min_size=1, max_size=3)


@given(batches, st.sampled_from([1, 3, 4]), st.sampled_from([1, 2]), st.sampled_from([None, 1, 3, 8]),
       st.sampled_from([None, 0.0, 2.5]), st.integers(0, 2**31 - 1))
def test_reference_matches_naive_model(seqs, block_size, group, sliding_window, softcap, seed):
    query_lens = [min(q, n) or 1 for n, q in seqs]
    batch = random_paged_batch([n for n, _ in seqs], query_lens, 2 * group, 2, 4, block_size,
                               dtype=torch.float64, seed=seed)
    expected = naive_batch_attention(batch, sliding_window=sliding_window, softcap=softcap)
    actual = paged_attention_ref(**batch, sliding_window=sliding_window, softcap=softcap)
    torch.testing.assert_close(actual, expected, atol=1e-12, rtol=1e-12)


@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=4), st.sampled_from([1, 4, 16]),
       st.integers(0, 6))
def test_slot_mapping_addresses_each_new_position(seqs, block_size, padding):
    seq_lens = [max(n, q) for n, q in seqs]
    query_lens = [q for _, q in seqs]
    batch = random_paged_batch(seq_lens, query_lens, 1, 1, 2, block_size, seed=len(seqs))
    slots = compute_slot_mapping(batch["block_table"], batch["query_start_loc"], batch["seq_lens"], block_size,
                                 sum(query_lens) + padding)
    expected = []
    for s, (n, q) in enumerate(zip(seq_lens, query_lens)):
        for pos in range(n - q, n):
            expected.append(int(batch["block_table"][s, pos // block_size]) * block_size + pos % block_size)
    assert slots.tolist() == expected + [PAD_SLOT_ID] * padding
    assert slots.dtype == torch.int64


@given(st.integers(1, 12), st.sampled_from([1, 2, 4]), st.integers(0, 2**31 - 1), st.data())
def test_reshape_and_cache_ref_writes_named_slots_only(num_tokens, block_size, seed, data):
    num_slots = 16 * block_size
    g = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(num_slots, generator=g)[:num_tokens]
    pads = data.draw(st.lists(st.booleans(), min_size=num_tokens, max_size=num_tokens))
    slot_mapping = torch.where(torch.tensor(pads), PAD_SLOT_ID, chosen)
    key = torch.randn(num_tokens + 2, 3, 5, generator=g)  # two CUDA-graph padding rows beyond slot_mapping
    value = torch.randn(num_tokens + 2, 3, 5, generator=g)
    key_cache, value_cache = split_kv_cache(torch.randn(kv_cache_shape(16, block_size, 3, 5, "triton"), generator=g), "triton")
    before_k, before_v = key_cache.clone(), value_cache.clone()
    reshape_and_cache_ref(key, value, key_cache, value_cache, slot_mapping)
    expected_k, expected_v = before_k.clone(), before_v.clone()
    for token, slot in enumerate(slot_mapping.tolist()):
        if slot != PAD_SLOT_ID:
            expected_k[slot // block_size, slot % block_size] = key[token]
            expected_v[slot // block_size, slot % block_size] = value[token]
    assert torch.equal(key_cache, expected_k) and torch.equal(value_cache, expected_v)


def test_layouts_are_views_of_one_tensor():
    for layout in ("flash", "triton"):
        kv = torch.zeros(kv_cache_shape(5, 4, 2, 8, layout))
        k, v = split_kv_cache(kv, layout)
        assert k.shape == v.shape == (5, 4, 2, 8)
        k[3, 1, 0, 2] = 7.0
        v[3, 1, 0, 2] = -7.0
        assert kv.sum() == 0 and (kv == 7).sum() == 1
    assert kv_cache_shape(5, 4, 2, 8, "flash") == (2, 5, 4, 2, 8)
    assert kv_cache_shape(5, 4, 2, 8, "triton") == (5, 2, 4, 2, 8)
    with pytest.raises(ValueError, match="layout must be one of 'flash', 'triton', got 'paged'"):
        kv_cache_shape(5, 4, 2, 8, "paged")
    with pytest.raises(TypeError, match="layout must be one of"):
        split_kv_cache(torch.zeros(2, 5, 4, 2, 8), None)
    with pytest.raises(ValueError, match="a 'triton' KV cache has shape"):
        split_kv_cache(torch.zeros(2, 5, 4, 2, 8), "triton")


def test_paging_is_invisible_to_the_oracle():
    g = torch.Generator().manual_seed(3)
    keys, values = torch.randn(2, 37, 2, 8, generator=g, dtype=torch.float64).unbind(0)
    query = torch.randn(5, 4, 8, generator=g, dtype=torch.float64)
    qsl, lens = torch.tensor([0, 5]), torch.tensor([37])
    dense = paged_attention_ref(query, page_kv(keys, 64, [0], 1), page_kv(values, 64, [0], 1), qsl, lens, torch.tensor([[0]]))
    order = torch.randperm(40, generator=g).tolist()
    paged = paged_attention_ref(query, page_kv(keys, 1, order, 40, float("nan")), page_kv(values, 1, order, 40, float("nan")),
                                qsl, lens, torch.tensor([order]))
    torch.testing.assert_close(paged, dense, atol=1e-13, rtol=1e-13)


def _good():
    return random_paged_batch([10, 3], [4, 1], 4, 2, 8, 4, seed=0)


@pytest.mark.parametrize("change, error, match", [
    (lambda b: b.update(block_table=b["block_table"].add(50)), ValueError, "block_table entry .* is outside the cache's"),
    (lambda b: b.update(block_table=b["block_table"].sub(100)), ValueError, "outside the cache's"),
    (lambda b: b.update(seq_lens=torch.tensor([3, 3], dtype=torch.int32)), ValueError, "seq_len 3 is shorter than its query length 4"),
    (lambda b: b.update(seq_lens=torch.tensor([10], dtype=torch.int32)), ValueError, "query_start_loc has 3 entries but seq_lens has 1"),
    (lambda b: b.update(seq_lens=torch.tensor([10, 99], dtype=torch.int32)), ValueError, "exceeds block_table capacity"),
    (lambda b: b.update(query_start_loc=torch.tensor([0, 4, 6], dtype=torch.int32)), ValueError, "from 0 to num_tokens=5"),
    (lambda b: b.update(query_start_loc=torch.tensor([0, 6, 5], dtype=torch.int32)), ValueError, "must not decrease"),
    (lambda b: b.update(query=b["query"][:, :3]), ValueError, "not a multiple of num_kv_heads 2"),
    (lambda b: b.update(query=b["query"][..., :4]), ValueError, "query head_size 4 != cache head_size 8"),
    (lambda b: b.update(query=b["query"].transpose(1, 2).contiguous().transpose(1, 2)), ValueError, "contiguous in head_size"),
    (lambda b: b.update(key_cache=b["key_cache"].half(), value_cache=b["value_cache"].half()), TypeError, "query is torch.float32 but the cache is torch.float16"),
    (lambda b: b.update(key_cache=b["key_cache"].to(torch.int8), value_cache=b["value_cache"].to(torch.int8)), TypeError, "not supported"),
    (lambda b: b.update(value_cache=b["value_cache"][:, :2]), ValueError, "differ in shape"),
    (lambda b: b.update(seq_lens=b["seq_lens"].float()), TypeError, "seq_lens must be int32 or int64"),
    (lambda b: b.update(block_table=b["block_table"].t().contiguous().t()), ValueError, "block_table must be contiguous"),
    (lambda b: b.update(query=b["query"][None]), ValueError, "query must be \\(num_tokens"),
    (lambda b: b.update(key_cache=b["key_cache"][0]), ValueError, "key_cache must be \\(num_blocks"),
])
def test_bad_inputs_are_named(change, error, match):
    batch = _good()
    change(batch)
    with pytest.raises(error, match=match):
        paged_attention_ref(**batch)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(scale=0.0), ValueError, "scale must be a positive finite number"),
    (dict(sliding_window=0), ValueError, "sliding_window must be an int >= 1"),
    (dict(softcap=-1.0), ValueError, "softcap must be None or a finite number >= 0"),
    (dict(sliding_window=True), TypeError, "sliding_window must be an int >= 1 and <= 2147483647, got True"),
    (dict(scale=True), TypeError, "scale must be a positive finite number, got True"),
    (dict(softcap=True), TypeError, "softcap must be None or a finite number >= 0, got True"),
    (dict(scale=float("nan")), ValueError, "scale must be a positive finite number, got nan"),
    (dict(softcap="3"), TypeError, "softcap must be None or a finite number >= 0, got '3'"),
])
def test_bad_options_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        paged_attention_ref(**_good(), **kwargs)


def test_cache_write_errors():
    k = torch.zeros(4, 2, 8)
    kc, vc = split_kv_cache(torch.zeros(kv_cache_shape(3, 4, 2, 8)))
    with pytest.raises(ValueError, match="slot 12 is outside the cache's 3 blocks x 4 slots"):
        reshape_and_cache_ref(k, k, kc, vc, torch.tensor([0, 12]))
    with pytest.raises(ValueError, match="slot -2 is outside"):
        reshape_and_cache_ref(k, k, kc, vc, torch.tensor([0, -2]))
    with pytest.raises(ValueError, match="names a slot twice"):
        reshape_and_cache_ref(k, k, kc, vc, torch.tensor([5, 5]))
    with pytest.raises(ValueError, match="slot_mapping names 5 tokens but key has only 4"):
        reshape_and_cache_ref(k, k, kc, vc, torch.arange(5))
    with pytest.raises(ValueError, match="key must be \\(num_tokens, 2, 8\\)"):
        reshape_and_cache_ref(torch.zeros(4, 1, 8), k, kc, vc, torch.arange(4))
    with pytest.raises(TypeError, match="slot_mapping must be int32 or int64"):
        reshape_and_cache_ref(k, k, kc, vc, torch.arange(4.0))


def test_gather_kv_follows_the_block_table():
    cache = torch.arange(6 * 2 * 1 * 1.0).view(6, 2, 1, 1)  # slot s holds s
    assert gather_kv(cache, torch.tensor([4, 0, 5]), 5).flatten().tolist() == [8, 9, 0, 1, 10]


def test_tolerance_assertion_fails_when_it_should():
    expected = torch.rand(3, 2, 4, dtype=torch.float64)
    assert_attention_close(expected.float(), expected)
    with pytest.raises(AssertionError, match="beyond torch.float32 tolerance"):
        assert_attention_close(expected.float() + 1e-4, expected)
    with pytest.raises(AssertionError):
        assert_attention_close(expected.float().fill_(float("nan")), expected)


def test_package_imports_without_triton():
    code = ("import sys\n"
            "sys.modules['triton'] = None  # import triton now raises ImportError, as if not installed\n"
            "import kvref, kvref.kernels as K\n"
            "b = K.random_paged_batch([3], [3], 2, 1, 4, 2)\n"
            "assert K.paged_attention_ref(**b).shape == (3, 2, 4)\n"
            "try:\n"
            "    K.unified_attention\n"
            "except ImportError as e:\n"
            "    print('ImportError:', e)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "triton" not in result.stderr
    assert "ImportError: kvref.kernels.unified_attention needs Triton" in result.stdout, result.stdout


def test_block_table_picture_names_every_entry_and_block():
    "The chapter's picture: one `table[j] = b` label per block the sequence uses, every cache block drawn, text >= 11 px."
    svg = block_table_svg([3, 1, 0], seq_len=3, block_size=2, num_blocks=4)
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert "table[0] = 3" in svg and "table[1] = 1" in svg and "table[2]" not in svg  # entry 2 lies past seq_len
    assert all(f"block {b}" in svg for b in range(4))
    sizes = [float(x) for x in re.findall(r"font-size: ?([\d.]+)px", svg)] or [float(x) for x in re.findall(r"font: [^;]*?([\d.]+)px", svg)]
    assert sizes and min(sizes) >= 11
    assert block_table_svg([3, 1], 3, 2, 4) == block_table_svg([3, 1], 3, 2, 4)  # deterministic


def test_paged_attention_is_dense_attention_over_the_gathered_blocks():
    "The chapter's opening claim, on a random batch: each sequence's rows equal `dense_attention` over `gather_kv`."
    batch = random_paged_batch([7, 12], [3, 1], 4, 2, 8, 4, dtype=torch.float64, seed=5)
    out = paged_attention_ref(**batch)
    starts = batch["query_start_loc"].tolist()
    for s, seq_len in enumerate(batch["seq_lens"].tolist()):
        q = batch["query"][starts[s]:starts[s + 1]].transpose(0, 1)
        k, v = (gather_kv(batch[c], batch["block_table"][s], seq_len).repeat_interleave(2, 1).transpose(0, 1)
                for c in ("key_cache", "value_cache"))
        dense = dense_attention(q, k, v, torch.arange(seq_len - q.shape[1], seq_len), 1 / 8 ** 0.5).transpose(0, 1)
        torch.testing.assert_close(out[starts[s]:starts[s + 1]], dense, rtol=0, atol=1e-12)
