"""Triton kernels against the float64 oracle over a covering grid, on CPU through TRITON_INTERPRET=1.

Inputs are fresh random numbers every run (the seed is in each failure message); batches mix prefill chunks, cached
prefixes and decodes, and every cache slot no sequence uses holds NaN, so a stray read fails the finiteness check.

The fast grid is a *covering design*, not the full product: every block size (1, 12, 16, 32: 12 is not a power of
two, so `pos // block_size` and `pos % block_size` cannot be shifts and masks), head size (64, 128), GQA ratio (1, 4,
8), dtype (float32, float16) and, for decode, split count (1, 2, 4) appears, and so does every *pair* of values of
any two of those factors (12 cases per kernel where the product has 48 or 144). The pairs are where kernel bugs
live: a block-table index wrong only for some block sizes shows in any case with that block size, a head mapping
wrong only for some ratios in any case with that ratio, a split bug that needs float16 rounding in the
(splits, float16) cases. The full product runs with `KVREF_SLOW=1` (`@pytest.mark.slow`) and on a GPU.
bfloat16 runs on a small grid here (the interpreter widens it to float32) and on the full grid on a GPU.
"""
import itertools

import pytest
import torch

from kvref.kernels import random_paged_batch, triton_available
from test_kernels_support import check, decode_inputs, gpu, mixed_shape, needs_triton, on_device, seed_for

pytestmark = needs_triton
if triton_available():
    from kvref.kernels.triton_attention import paged_decode_attention, unified_attention

F32, F16 = torch.float32, torch.float16
BLOCK_SIZES, HEAD_SIZES, GROUPS, DTYPES, SPLITS = (1, 12, 16, 32), (64, 128), (1, 4, 8), (F32, F16), (1, 2, 4)

# (block_size, head_size, group, dtype): every block size x group once; head size and dtype placed so that each
# pair of values of any two factors appears at least once (checked by test_the_fast_grid_covers_every_pair)
UNIFIED_FAST = [(1, 64, 1, F32), (1, 128, 4, F16), (1, 64, 8, F16),
                (12, 128, 1, F16), (12, 64, 4, F32), (12, 128, 8, F32),
                (16, 64, 1, F16), (16, 128, 4, F32), (16, 64, 8, F32),
                (32, 128, 1, F32), (32, 64, 4, F16), (32, 128, 8, F16)]
# decode adds the split count, placed (by a small search) so that each pair with splits appears too
DECODE_FAST = [case + (splits,) for case, splits in zip(UNIFIED_FAST, [1, 2, 4, 1, 2, 4, 2, 4, 1, 4, 1, 2])]


def _grid(fast, cases):
    """All `cases`: those in `fast` as they are, every other one marked slow."""
    return [case if case in fast else pytest.param(*case, marks=pytest.mark.slow) for case in cases]


def _pairs(cases):
    return {(i, a, j, b) for case in cases for (i, a), (j, b) in itertools.combinations(enumerate(case), 2)}


@pytest.mark.parametrize("fast, factors", [(UNIFIED_FAST, (BLOCK_SIZES, HEAD_SIZES, GROUPS, DTYPES)),
                                           (DECODE_FAST, (BLOCK_SIZES, HEAD_SIZES, GROUPS, DTYPES, SPLITS))])
def test_the_fast_grid_covers_every_pair(fast, factors):
    assert _pairs(fast) == _pairs(itertools.product(*factors))


@pytest.mark.parametrize("block_size, head_size, group, dtype", _grid(UNIFIED_FAST, itertools.product(BLOCK_SIZES, HEAD_SIZES, GROUPS, DTYPES)))
def test_unified_attention_mixed_batch(block_size, head_size, group, dtype):
    case = ("unified", block_size, head_size, group, dtype)
    seqs = mixed_shape(block_size)
    batch = on_device(random_paged_batch([n for n, _ in seqs], [q for _, q in seqs], 2 * group, 2, head_size,
                                         block_size, dtype, seed_for(*case)))
    check(unified_attention(**batch), batch, case)


@pytest.mark.parametrize("block_size, head_size, group, dtype, splits",
                         _grid(DECODE_FAST, itertools.product(BLOCK_SIZES, HEAD_SIZES, GROUPS, DTYPES, SPLITS)))
def test_paged_decode_split_and_unsplit(block_size, head_size, group, dtype, splits):
    """Lengths on and around block boundaries; with 4 splits the length-1 sequence leaves 3 splits empty and the
    100-position one spans several."""
    case = ("decode", block_size, head_size, group, dtype, splits)
    lens = [1, block_size, block_size + 1, 2 * block_size + 3, 100]
    batch = on_device(random_paged_batch(lens, [1] * len(lens), 2 * group, 2, head_size, block_size, dtype, seed_for(*case)))
    check(paged_decode_attention(**decode_inputs(batch), num_kv_splits=splits), batch, case)


# each window / soft-cap option once in the fast run, the dtypes alternating so that each dtype meets a window alone,
# a soft-cap alone and both; the other dtype of each option runs with KVREF_SLOW=1
WINDOW_SOFTCAP = [(1, None, F16), (7, None, F32), (None, 30.0, F16), (16, 5.0, F32), (33, 50.0, F16)]


@pytest.mark.parametrize("sliding_window, softcap, dtype",
                         _grid(WINDOW_SOFTCAP, [(w, c, d) for w, c, _ in WINDOW_SOFTCAP for d in DTYPES]))
def test_window_and_softcap(sliding_window, softcap, dtype):
    case = ("window/softcap", sliding_window, softcap, dtype)
    seqs = mixed_shape(16)
    batch = on_device(random_paged_batch([n for n, _ in seqs], [q for _, q in seqs], 8, 2, 64, 16, dtype, seed_for(*case)))
    options = dict(sliding_window=sliding_window, softcap=softcap)
    check(unified_attention(**batch, **options), batch, case, **options)
    decode = on_device(random_paged_batch([1, 16, 17, 100], [1] * 4, 8, 2, 64, 16, dtype, seed_for(*case, "decode")))
    for splits in (1, 2):
        check(paged_decode_attention(**decode_inputs(decode), num_kv_splits=splits, **options), decode, case + (splits,), **options)


@pytest.mark.parametrize("kernel", ["unified", "decode"])
def test_bfloat16_on_a_small_grid(kernel):
    for block_size, group in ((16, 4), (1, 1), (32, 8)):
        case = ("bf16", kernel, block_size, group)
        lens = [1, block_size + 1, 60]
        qlens = [1, min(block_size + 1, 7), 1] if kernel == "unified" else [1, 1, 1]
        batch = on_device(random_paged_batch(lens, qlens, 2 * group, 2, 64, block_size, torch.bfloat16, seed_for(*case)))
        out = unified_attention(**batch) if kernel == "unified" else paged_decode_attention(**decode_inputs(batch), num_kv_splits=2)
        check(out, batch, case)


@pytest.mark.parametrize("group, head_size", [(3, 80), (6, 96)])
def test_odd_group_and_head_sizes(group, head_size):
    """Query heads per KV head and head sizes that are not powers of two: rows and channels are padded and masked."""
    case = ("odd", group, head_size)
    seqs = mixed_shape(16)
    batch = on_device(random_paged_batch([n for n, _ in seqs], [q for _, q in seqs], 2 * group, 2, head_size, 16,
                                         seed=seed_for(*case)))
    check(unified_attention(**batch), batch, case)
    decode = on_device(random_paged_batch([1, 17, 100], [1, 1, 1], 2 * group, 2, head_size, 16, seed=seed_for(*case, "d")))
    check(paged_decode_attention(**decode_inputs(decode), num_kv_splits=2), decode, case)


# ---- GPU only: the full grid with bfloat16 and head size 256, default splits, and validate=False paths ----

@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_size", [64, 128, 256])
def test_gpu_full_grid(dtype, head_size):
    for block_size in BLOCK_SIZES:
        for group in GROUPS:
            case = ("gpu", dtype, head_size, block_size, group)
            seqs = mixed_shape(block_size) + [(1000, 1), (700, 300)]
            batch = on_device(random_paged_batch([n for n, _ in seqs], [q for _, q in seqs], 2 * group, 2, head_size,
                                                 block_size, dtype, seed_for(*case)))
            check(unified_attention(**batch), batch, case)
            check(unified_attention(**batch, sliding_window=128, softcap=30.0), batch, case, sliding_window=128, softcap=30.0)
            lens = [1, block_size + 1, 4096, 333]
            decode = on_device(random_paged_batch(lens, [1] * 4, 2 * group, 2, head_size, block_size, dtype, seed_for(*case, "d")))
            check(paged_decode_attention(**decode_inputs(decode)), decode, case)
            check(paged_decode_attention(**decode_inputs(decode), validate=False, num_kv_splits=8), decode, case)
