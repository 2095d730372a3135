"""Triton kernels against the float64 oracle over a reduced grid, on CPU through TRITON_INTERPRET=1.

Inputs are fresh random numbers every run (the seed is in each failure message); the grid covers block sizes 1, 16
and 32, head sizes 64 and 128, GQA ratios 1, 4 and 8, float32 and float16, with batches mixing prefill chunks,
cached prefixes and decodes. Every cache slot no sequence uses holds NaN, so a stray read fails the finiteness
check. bfloat16 runs on a smaller grid here (the interpreter computes it correctly: it widens to float32) and on the
full grid on a GPU.
"""
import pytest
import torch

from kvref.kernels import random_paged_batch, triton_available
from test_kernels_support import check, decode_inputs, gpu, mixed_shape, needs_triton, on_device, seed_for

pytestmark = needs_triton
if triton_available():
    from kvref.kernels.triton_attention import paged_decode_attention, unified_attention


GRID = [(bs, hs, g, dt) for bs in (1, 16, 32) for hs in (64, 128) for g in (1, 4, 8)
        for dt in (torch.float32, torch.float16)]


@pytest.mark.parametrize("block_size, head_size, group, dtype", GRID)
def test_unified_attention_mixed_batch(block_size, head_size, group, dtype):
    case = ("unified", block_size, head_size, group, dtype)
    seqs = mixed_shape(block_size)
    batch = on_device(random_paged_batch([n for n, _ in seqs], [q for _, q in seqs], 2 * group, 2, head_size,
                                         block_size, dtype, seed_for(*case)))
    check(unified_attention(**batch), batch, case)


@pytest.mark.parametrize("block_size, head_size, group, dtype", GRID)
def test_paged_decode_split_and_unsplit(block_size, head_size, group, dtype):
    case = ("decode", block_size, head_size, group, dtype)
    lens = [1, block_size, block_size + 1, 2 * block_size + 3, 100]
    batch = on_device(random_paged_batch(lens, [1] * len(lens), 2 * group, 2, head_size, block_size, dtype, seed_for(*case)))
    # float32 takes the split path (100 positions in 4 splits of 32: longer than one split; the length-1 sequence
    # leaves 3 splits empty), float16 the direct one; test_window_and_softcap runs both paths in both dtypes
    splits = 4 if dtype == torch.float32 else 1
    check(paged_decode_attention(**decode_inputs(batch), num_kv_splits=splits), batch, case + (splits,))


@pytest.mark.parametrize("sliding_window, softcap", [(1, None), (7, None), (None, 30.0), (16, 5.0), (33, 50.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
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
    for block_size in (1, 16, 32):
        for group in (1, 4, 8):
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
