"""Golden files in golden/attention/: the oracle must reproduce them exactly, the kernels within tolerance."""
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from kvref.kernels import assert_attention_close, paged_attention_ref, triton_available

GOLDEN = Path(__file__).parent.parent / "golden" / "attention"
FILES = sorted(GOLDEN.glob("*.npz"))
ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"


def load(path):
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        dtype = getattr(torch, meta["dtype"])
        batch = {k: torch.from_numpy(z[k]) for k in ("query", "key_cache", "value_cache", "query_start_loc", "seq_lens", "block_table")}
        for k in ("query", "key_cache", "value_cache"):
            batch[k] = batch[k].to(dtype)
        options = dict(scale=meta["scale"], sliding_window=meta["sliding_window"], softcap=meta["softcap"])
        return meta, batch, options, torch.from_numpy(z["expected"])


def test_golden_files_exist():
    assert len(FILES) >= 5, f"expected the golden cases in {GOLDEN}, found {FILES}"
    assert {load(f)[0]["dtype"] for f in FILES} == {"float32", "float16", "bfloat16"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_oracle_reproduces_golden(path):
    meta, batch, options, expected = load(path)
    torch.testing.assert_close(paged_attention_ref(**batch, **options), expected, atol=1e-12, rtol=1e-12)


@pytest.mark.skipif(not triton_available(), reason="the kernels need Triton")
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_kernels_match_golden(path):
    from kvref.kernels.triton_attention import paged_decode_attention, unified_attention
    meta, batch, options, expected = load(path)
    batch = {k: v.to(DEVICE) for k, v in batch.items()}
    assert_attention_close(unified_attention(**batch, **options), expected)
    if meta["decode"]:
        decode = {k: v for k, v in batch.items() if k != "query_start_loc"}
        for splits in (1, 4):
            assert_attention_close(paged_decode_attention(**decode, num_kv_splits=splits, **options), expected)
