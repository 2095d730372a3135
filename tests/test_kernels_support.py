"""Helpers shared by the kernel test files (tests/test_kernels_grid.py, tests/test_kernels_properties.py); no tests here.

Triton must already be configured: tests/conftest.py sets TRITON_INTERPRET=1 before anything imports it.
"""
import os
import zlib

import pytest
import torch

from kvref.kernels import assert_attention_close, paged_attention_ref, triton_available

RUN_SEED = int.from_bytes(os.urandom(4), "little")  # fresh inputs every run; each failure message names it
ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"
needs_triton = pytest.mark.skipif(not triton_available(), reason="the kernels need Triton")
gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device with compiled (not interpreted) Triton")


def seed_for(*case) -> int:
    return (RUN_SEED + zlib.crc32(repr(case).encode())) % 2**31


def on_device(batch):
    return {k: v.to(DEVICE) for k, v in batch.items()}


def decode_inputs(batch):
    return {k: v for k, v in batch.items() if k != "query_start_loc"}


def check(actual, batch, case, **options):
    expected = paged_attention_ref(**batch, **options)
    assert torch.isfinite(actual).all(), f"non-finite output (NaN from an unused slot?) for {case}, seed {RUN_SEED}"
    try:
        assert_attention_close(actual, expected)
    except AssertionError as e:
        raise AssertionError(f"{case}, run seed {RUN_SEED}: {e}") from None


def mixed_shape(block_size):
    """(seq_len, query_len) pairs: decode of length 1, decode on a block boundary, a fresh prefill across a boundary,
    a prefill chunk on a cached prefix, a long decode."""
    prefill = max(block_size + 1, 19)
    return [(1, 1), (block_size, 1), (prefill, prefill), (3 * block_size + 5, 7), (100, 1)]
