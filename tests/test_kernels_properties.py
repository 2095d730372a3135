"""Properties of the Triton kernels (paging and block ids are invisible, NaN never read, both cache layouts, exact
cache writes) and their errors before launch; on CPU through TRITON_INTERPRET=1.
"""
import pytest
import torch
from hypothesis import given, strategies as st

from kvref.kernels import (PAD_SLOT_ID, compute_slot_mapping, kv_cache_shape, page_kv, random_paged_batch,
                           reshape_and_cache_ref, split_kv_cache, triton_available)
from test_kernels_support import DEVICE, check, decode_inputs, needs_triton, on_device, seed_for

pytestmark = needs_triton
if triton_available():
    from kvref.kernels.triton_attention import paged_decode_attention, reshape_and_cache, unified_attention


@pytest.mark.parametrize("block_size", [1, 16])
def test_blocks_outside_the_window_are_never_read(block_size):
    """vLLM frees blocks that fell out of every token's window and points the table at a null block; kvref's kernels
    must not read them. Point them at a NaN block and the output must not change."""
    window = 9
    seqs = [(70, 6), (40, 1), (33, 33)]
    batch = on_device(random_paged_batch([n for n, _ in seqs], [q for _, q in seqs], 4, 2, 64, block_size,
                                         seed=seed_for("window-null", block_size), spare_blocks=1))
    nulled = batch["block_table"].clone()
    used = {int(batch["block_table"][s, b]) for s, (n, _) in enumerate(seqs) for b in range(-(-n // block_size))}
    spare = min(set(range(batch["key_cache"].shape[0])) - used)  # the one block no sequence uses: our "null block"
    batch["key_cache"][spare] = float("nan")
    batch["value_cache"][spare] = float("nan")
    for s, (n, q) in enumerate(seqs):
        first_visible = n - q - window + 1  # the earliest position any of this step's tokens can see
        nulled[s, :max(first_visible, 0) // block_size] = spare
    assert (nulled != batch["block_table"]).any()
    expected_unified = unified_attention(**batch, sliding_window=window)
    got = unified_attention(**{**batch, "block_table": nulled}, sliding_window=window)
    assert torch.isfinite(got).all() and torch.equal(got, expected_unified)
    decode_query = batch["query"][batch["query_start_loc"][1:].long() - 1]  # last token of each sequence
    ref_in = {**decode_inputs(batch), "query": decode_query}
    for splits in (1, 4):
        want = paged_decode_attention(**ref_in, sliding_window=window, num_kv_splits=splits)
        got = paged_decode_attention(**{**ref_in, "block_table": nulled}, sliding_window=window, num_kv_splits=splits)
        assert torch.isfinite(got).all() and torch.equal(got, want)


def _dense_paged_pair(seq_lens, query_lens, seed, dtype=torch.float32):
    """The same histories paged twice: block size 16 in one shuffled order, block size 1 in another."""
    g = torch.Generator().manual_seed(seed)
    tables, caches = {}, {}
    dense = [torch.randn(2, n, 2, 64, generator=g).to(dtype) for n in seq_lens]
    for block_size in (16, 1):
        width = max(-(-n // block_size) for n in seq_lens)
        num_blocks = len(seq_lens) * width + 3
        order = torch.randperm(num_blocks, generator=g).tolist()
        table = torch.tensor([order[s * width:(s + 1) * width] for s in range(len(seq_lens))], dtype=torch.int32)
        k = torch.full((num_blocks, block_size, 2, 64), float("nan"), dtype=dtype)
        v = k.clone()
        for s, (n, kv) in enumerate(zip(seq_lens, dense)):
            ids = table[s].tolist()
            mask = torch.isnan(page_kv(kv[0], block_size, ids, num_blocks, float("nan")))
            k = torch.where(mask, k, page_kv(kv[0], block_size, ids, num_blocks, float("nan")))
            v = torch.where(mask, v, page_kv(kv[1], block_size, ids, num_blocks, float("nan")))
        tables[block_size], caches[block_size] = table, (k, v)
    query = torch.randn(sum(query_lens), 8, 64, generator=g).to(dtype)
    qsl = torch.tensor([0] + query_lens).cumsum(0).to(torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return [on_device(dict(query=query, key_cache=caches[b][0], value_cache=caches[b][1], query_start_loc=qsl,
                           seq_lens=lens, block_table=tables[b])) for b in (16, 1)]


def test_block_size_1_and_16_give_identical_outputs():
    """The tile loop walks positions, not blocks, so paging changes addresses and nothing else: bitwise equal."""
    by_16, by_1 = _dense_paged_pair([37, 16, 1, 64], [5, 16, 1, 1], seed_for("paging"))
    assert torch.equal(unified_attention(**by_16, sliding_window=20), unified_attention(**by_1, sliding_window=20))
    d16, d1 = _dense_paged_pair([37, 16, 1, 64], [1, 1, 1, 1], seed_for("paging-decode"))
    for splits in (1, 2):
        assert torch.equal(paged_decode_attention(**decode_inputs(d16), num_kv_splits=splits),
                           paged_decode_attention(**decode_inputs(d1), num_kv_splits=splits))


def _move_blocks(batch, seed):
    """The same batch with every physical block moved to a new id, and the block table rewritten to match."""
    perm = torch.randperm(batch["key_cache"].shape[0], generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    return {**batch,
            "key_cache": torch.empty_like(batch["key_cache"]).index_copy_(0, perm, batch["key_cache"]),
            "value_cache": torch.empty_like(batch["value_cache"]).index_copy_(0, perm, batch["value_cache"]),
            "block_table": perm[batch["block_table"].long()].to(torch.int32)}


def test_permuting_physical_blocks_changes_nothing():
    batch = on_device(random_paged_batch([50, 17, 33], [50, 1, 4], 8, 2, 64, 16, seed=seed_for("permute")))
    assert torch.equal(unified_attention(**batch), unified_attention(**_move_blocks(batch, seed_for("perm"))))
    decode = on_device(random_paged_batch([50, 17, 33], [1, 1, 1], 8, 2, 64, 16, seed=seed_for("permute-decode")))
    moved = _move_blocks(decode, seed_for("perm-decode"))
    assert torch.equal(paged_decode_attention(**decode_inputs(decode), num_kv_splits=2),
                       paged_decode_attention(**decode_inputs(moved), num_kv_splits=2))


@pytest.mark.parametrize("layout", ["flash", "triton"])
def test_both_cache_layouts(layout):
    """Write a batch with reshape_and_cache into a strided view of either layout, then attend through the view."""
    batch = random_paged_batch([45, 20, 1], [45, 3, 1], 8, 2, 64, 16, seed=seed_for("layout"))
    num_blocks = batch["key_cache"].shape[0]
    kv = torch.full(kv_cache_shape(num_blocks, 16, 2, 64, layout), float("nan")).to(DEVICE)
    key_cache, value_cache = split_kv_cache(kv, layout)
    assert not key_cache.is_contiguous() or layout == "flash"
    lens = batch["seq_lens"].tolist()
    qsl = torch.tensor([0] + lens).cumsum(0).to(torch.int32)  # write whole histories, as a prefill would
    slots = compute_slot_mapping(batch["block_table"], qsl, batch["seq_lens"], 16).to(DEVICE)
    keys = torch.cat([batch["key_cache"][batch["block_table"][s, torch.arange(n) // 16].long(), torch.arange(n) % 16] for s, n in enumerate(lens)])
    values = torch.cat([batch["value_cache"][batch["block_table"][s, torch.arange(n) // 16].long(), torch.arange(n) % 16] for s, n in enumerate(lens)])
    reshape_and_cache(keys.to(DEVICE), values.to(DEVICE), key_cache, value_cache, slots)
    viewed = on_device({**batch, "key_cache": key_cache, "value_cache": value_cache})
    check(unified_attention(**viewed), on_device(batch), ("layout", layout))
    dense = on_device(batch)
    assert torch.equal(unified_attention(**viewed), unified_attention(**dense))


def test_query_may_be_a_strided_view():
    """vLLM's query is a slice of a fused qkv projection: the token stride is wider than heads x head_size."""
    batch = on_device(random_paged_batch([30, 9], [30, 1], 8, 2, 64, 16, seed=seed_for("strided")))
    qkv = torch.randn(batch["query"].shape[0], 12, 64, device=DEVICE)
    qkv[:, :8] = batch["query"]
    strided = {**batch, "query": qkv[:, :8]}
    assert not strided["query"].is_contiguous()
    assert torch.equal(unified_attention(**strided), unified_attention(**batch))


def test_decode_kernel_agrees_with_unified_kernel():
    batch = on_device(random_paged_batch([1, 31, 32, 33, 90], [1] * 5, 16, 2, 128, 32, seed=seed_for("agree")))
    torch.testing.assert_close(paged_decode_attention(**decode_inputs(batch), num_kv_splits=2), unified_attention(**batch),
                               atol=1e-5, rtol=1e-5)


@given(st.integers(1, 10), st.sampled_from([1, 4, 16]), st.sampled_from([torch.float32, torch.float16]),
       st.sampled_from(["flash", "triton"]), st.integers(0, 2**31 - 1), st.data())
def test_reshape_and_cache_writes_exactly_the_named_slots(num_tokens, block_size, dtype, layout, seed, data):
    g = torch.Generator().manual_seed(seed)
    num_blocks = 12
    chosen = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens]
    pads = torch.tensor(data.draw(st.lists(st.booleans(), min_size=num_tokens, max_size=num_tokens)))
    slot_mapping = torch.where(pads, PAD_SLOT_ID, chosen).to(DEVICE)
    extra_rows = data.draw(st.integers(0, 3))  # CUDA-graph padding rows in key beyond slot_mapping
    key = torch.randn(num_tokens + extra_rows, 2, 64, generator=g).to(dtype).to(DEVICE)
    value = torch.randn(num_tokens + extra_rows, 2, 64, generator=g).to(dtype).to(DEVICE)
    kv = torch.randn(kv_cache_shape(num_blocks, block_size, 2, 64, layout), generator=g).to(dtype).to(DEVICE)
    expected_kv = kv.clone()
    reshape_and_cache_ref(key, value, *split_kv_cache(expected_kv, layout), slot_mapping)
    before = kv.clone()
    reshape_and_cache(key, value, *split_kv_cache(kv, layout), slot_mapping)
    assert torch.equal(kv, expected_kv)
    key_changed, value_changed = ((after != was).flatten(2).any(2).nonzero().tolist()
                                  for after, was in zip(split_kv_cache(kv, layout), split_kv_cache(before, layout)))
    written = {s for s in slot_mapping.tolist() if s != PAD_SLOT_ID}
    assert {b * block_size + o for b, o in key_changed} <= written
    assert {b * block_size + o for b, o in value_changed} <= written


@pytest.mark.parametrize("call, error, match", [
    (lambda b: unified_attention(**b, tile_size=8), ValueError, "tile_size must be a power of two >= 16"),
    (lambda b: unified_attention(**b, block_m=8), ValueError, "block_m must be a power of two >= 16"),
    (lambda b: unified_attention(**b, out=torch.empty(3, 8, 32)), ValueError, "out must be"),
    (lambda b: unified_attention(**{**b, "block_table": b["block_table"] + 1000}), ValueError, "outside the cache"),
    (lambda b: unified_attention(**b, sliding_window=0), ValueError, "sliding_window must be an int >= 1"),
    (lambda b: paged_decode_attention(**decode_inputs(b)), ValueError, "one query token per sequence"),
    (lambda b: paged_decode_attention(query=b["query"][:2], key_cache=b["key_cache"], value_cache=b["value_cache"],
                                      seq_lens=torch.tensor([0, 3], dtype=torch.int32), block_table=b["block_table"]),
     ValueError, "seq_len 0 is shorter than its query length 1"),
    (lambda b: paged_decode_attention(query=b["query"][:2], key_cache=b["key_cache"], value_cache=b["value_cache"],
                                      seq_lens=b["seq_lens"], block_table=b["block_table"], num_kv_splits=6),
     ValueError, "num_kv_splits must be a power of two"),
    (lambda b: paged_decode_attention(query=b["query"][:2].double(), key_cache=b["key_cache"].double(), value_cache=b["value_cache"].double(),
                                      seq_lens=b["seq_lens"], block_table=b["block_table"]),
     TypeError, "torch.float64 is not supported"),
    (lambda b: reshape_and_cache(b["query"][:, :2], b["query"][:, :2], b["key_cache"], b["value_cache"], torch.tensor([0, 1, 10**6])),
     ValueError, "slot 1000000 is outside the cache"),
])
def test_errors_before_launch(call, error, match):
    batch = random_paged_batch([20, 3], [2, 1], 8, 2, 64, 16, seed=0)
    with pytest.raises(error, match=match):
        call(batch)


def test_empty_batches():
    batch = random_paged_batch([5], [5], 4, 2, 64, 16, seed=0)
    empty = dict(query=batch["query"][:0], key_cache=batch["key_cache"], value_cache=batch["value_cache"],
                 query_start_loc=torch.zeros(1, dtype=torch.int32), seq_lens=torch.zeros(0, dtype=torch.int32),
                 block_table=batch["block_table"][:0])
    assert unified_attention(**empty).shape == (0, 4, 64)
    assert paged_decode_attention(**decode_inputs(empty)).shape == (0, 4, 64)
    reshape_and_cache(batch["query"][:, :2], batch["query"][:, :2], batch["key_cache"], batch["value_cache"],
                      torch.zeros(0, dtype=torch.int64))
