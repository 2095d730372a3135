"""Regenerate golden/attention/*.npz: fixed-seed paged inputs and the float64 oracle's outputs.

Run from the project root: `.venv/bin/python golden/attention/make_golden.py`. Each case is a pure function of the
arguments listed in CASES (kvref.kernels.random_paged_batch draws from a seeded torch.Generator on CPU); the stored
files, not this script, are the reference: a GPU run and a CPU interpreter run are both checked against them.
"""
import json
from pathlib import Path

import numpy as np
import torch

from kvref.kernels import paged_attention_ref, random_paged_batch

HERE = Path(__file__).parent

# name: (seq_lens, query_lens, num_query_heads, num_kv_heads, head_size, block_size, dtype, seed, sliding_window, softcap)
CASES = {
    "decode_gqa4_bs16_f32": ([1, 16, 17, 100], [1, 1, 1, 1], 8, 2, 64, 16, "float32", 101, None, None),
    "decode_gqa8_bs16_f16_window_softcap": ([1, 16, 33, 90], [1, 1, 1, 1], 16, 2, 64, 16, "float16", 102, 40, 5.0),
    "mixed_gqa1_bs32_f16": ([1, 32, 33, 101, 100], [1, 1, 33, 7, 1], 2, 2, 64, 32, "float16", 103, None, None),
    "mixed_gqa8_bs1_f32_window_softcap": ([1, 19, 37, 45], [1, 19, 6, 1], 8, 1, 64, 1, "float32", 104, 24, 30.0),
    "mixed_gqa4_bs16_bf16_head128": ([1, 17, 40], [1, 17, 3], 4, 1, 128, 16, "bfloat16", 105, None, None),
}


def make(name, seq_lens, query_lens, num_query_heads, num_kv_heads, head_size, block_size, dtype, seed, window, softcap):
    batch = random_paged_batch(seq_lens, query_lens, num_query_heads, num_kv_heads, head_size, block_size,
                               getattr(torch, dtype), seed)
    expected = paged_attention_ref(**batch, sliding_window=window, softcap=softcap)
    # numpy has no bfloat16: store bfloat16 values widened to float32 (exact) and record the dtype in `meta`
    arrays = {k: (v.float() if v.dtype == torch.bfloat16 else v).numpy() for k, v in batch.items()}
    meta = dict(name=name, dtype=dtype, seed=seed, sliding_window=window, softcap=softcap, scale=None,
                decode=all(q == 1 for q in query_lens), generator="kvref.kernels.random_paged_batch")
    np.savez_compressed(HERE / f"{name}.npz", expected=expected.numpy(), meta=np.array(json.dumps(meta)), **arrays)


if __name__ == "__main__":
    for name, args in CASES.items():
        make(name, *args)
        print(name, (HERE / f"{name}.npz").stat().st_size, "bytes")
