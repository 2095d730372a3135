"""The kernels' limits: tile shapes chosen from the GQA ratio, every bad argument refused by name before launch, and
a soft-cap whose error does not grow with the cap (issue 12, "Kernels"); on CPU through TRITON_INTERPRET=1.
"""
import pytest
import torch

from kvref.kernels import (assert_attention_close, kv_cache_shape, paged_attention_ref, random_paged_batch,
                           reshape_and_cache_ref, split_kv_cache, triton_available)
from test_kernels_support import DEVICE, check, decode_inputs, needs_triton, on_device, seed_for

pytestmark = needs_triton
if triton_available():
    import triton
    import triton.language as tl

    from kvref.kernels.triton_attention import _tanh, paged_decode_attention, reshape_and_cache, unified_attention


@pytest.mark.parametrize("num_query_heads, num_kv_heads", [(32, 1), (40, 2), (64, 2)])
def test_default_block_m_follows_the_gqa_ratio(num_query_heads, num_kv_heads):
    """vLLM sizes BLOCK_M from the query heads per KV head (16, or the next power of two above 16); kvref's default
    does the same, so ratios 20, 32 and 64 run without a hand-picked `block_m`."""
    case = ("gqa", num_query_heads, num_kv_heads)
    batch = on_device(random_paged_batch([9, 20], [3, 1], num_query_heads, num_kv_heads, 64, 16, seed=seed_for(*case)))
    check(unified_attention(**batch), batch, case)
    check(paged_decode_attention(**decode_inputs({**batch, "query": batch["query"][[2, 3]]}), num_kv_splits=2),
          {**batch, "query": batch["query"][[2, 3]], "query_start_loc": torch.arange(3, dtype=torch.int32)}, case)


def test_explicit_block_m_below_the_ratio_is_refused():
    batch = random_paged_batch([9], [3], 32, 1, 64, 16, seed=0)
    with pytest.raises(ValueError, match="block_m must be a power of two >= 32 and <= 1024 for 32 query heads per KV head, got 16"):
        unified_attention(**batch, block_m=16)
    check(unified_attention(**batch, block_m=64), batch, ("block_m", 64))


def _batches():
    batch = random_paged_batch([20, 3], [2, 1], 8, 2, 64, 16, seed=0)
    decode = {**decode_inputs(batch), "query": batch["query"][1:]}
    key = batch["query"][:, :2].contiguous()
    write = dict(key=key, value=key.clone(), key_cache=batch["key_cache"].clone(),
                 value_cache=batch["value_cache"].clone(), slot_mapping=torch.tensor([0, 1, 2]))
    return batch, decode, write


BAD_ARGUMENTS = [  # (kernel, argument, bad value, exception, message)
    ("unified", "query", lambda t: t[:, :0], ValueError, "num_query_heads must be an int >= 1"),
    ("decode", "query", lambda t: t[:, :0], ValueError, "num_query_heads must be an int >= 1"),
    ("ref", "query", lambda t: t[:, :0], ValueError, "num_query_heads must be an int >= 1"),
    ("decode", "num_kv_splits", 0, ValueError, "num_kv_splits must be a power of two >= 1 and <= 1024"),
    ("decode", "num_kv_splits", -0.0, TypeError, "num_kv_splits must be an int, got -0.0"),
    ("decode", "num_kv_splits", True, TypeError, "num_kv_splits must be an int, got True"),
    ("decode", "num_kv_splits", torch.tensor(2), TypeError, "num_kv_splits must be an int, got tensor\\(2\\)"),
    ("decode", "num_kv_splits", 2**70, ValueError, "num_kv_splits must be a power of two >= 1 and <= 1024"),
    ("unified", "tile_size", 2**70, ValueError, "tile_size must be a power of two >= 16 and <= 1024"),
    ("unified", "tile_size", 32.0, TypeError, "tile_size must be an int"),
    ("decode", "tile_size", 2**70, ValueError, "tile_size must be a power of two >= 16 and <= 1024"),
    ("unified", "block_m", 2**70, ValueError, "block_m must be a power of two >= 16 and <= 1024"),
    ("unified", "block_m", True, TypeError, "block_m must be an int, got True"),
    ("unified", "sliding_window", 2**70, ValueError, "sliding_window must be an int >= 1 and <= 2147483647"),
    ("decode", "sliding_window", 2**31, ValueError, "sliding_window must be an int >= 1 and <= 2147483647"),
    ("ref", "sliding_window", 2**70, ValueError, "sliding_window must be an int >= 1 and <= 2147483647"),
    ("ref", "scale", 10**400, ValueError, "scale must be a positive finite number"),
    ("ref", "softcap", 10**400, ValueError, "softcap must be None or a finite number >= 0"),
    ("unified", "scale", 1e-300, ValueError, "scale 1e-300 is outside float32's normal range"),
    ("decode", "softcap", 1e-300, ValueError, "softcap 1e-300 is outside float32's normal range"),
    ("unified", "softcap", 1e39, ValueError, "softcap 1e\\+39 is outside float32's normal range"),
    ("unified", "max_query_len", -1, ValueError, "max_query_len must be an int >= 0, got -1"),
    ("unified", "max_query_len", 1.5, TypeError, "max_query_len must be an int >= 0, got 1.5"),
    ("unified", "max_query_len", 7, ValueError, "max_query_len=7 but the longest query has 2 tokens"),
    ("unified", "validate", None, TypeError, "validate must be a bool"),
    ("decode", "validate", 1, TypeError, "validate must be a bool"),
    ("cache", "validate", "yes", TypeError, "validate must be a bool"),
    ("unified", "out", [1, 2], TypeError, "out must be None or a torch.Tensor"),
    ("decode", "out", "x", TypeError, "out must be None or a torch.Tensor"),
    ("cache", "key", lambda t: t.to("meta"), ValueError, "all inputs must be on one device"),
    ("cache", "slot_mapping", lambda t: t.to("meta"), ValueError, "all inputs must be on one device"),
    ("ref", "query", lambda t: t.to("meta"), ValueError, "all inputs must be on one device"),
]


@pytest.mark.parametrize("kernel, argument, bad, error, match", BAD_ARGUMENTS,
                         ids=[f"{k}-{a}-{i}" for i, (k, a, *_) in enumerate(BAD_ARGUMENTS)])
def test_bad_arguments_are_refused_by_name(kernel, argument, bad, error, match):
    """Each row crashed (ZeroDivisionError, OverflowError, an interpreter error, NotImplementedError) or was
    silently misread (0 splits taken as the default, `True` as 1) before issue 12; now each is named."""
    batch, decode, write = _batches()
    call, kwargs = {"unified": (unified_attention, batch), "decode": (paged_decode_attention, decode),
                    "ref": (paged_attention_ref, batch), "cache": (reshape_and_cache, write)}[kernel]
    kwargs = {**kwargs, argument: bad(kwargs[argument]) if callable(bad) else bad}
    with pytest.raises(error, match=match):
        call(**kwargs)


def test_every_input_on_meta_is_refused():
    """Meta tensors have shapes but no data: the checks would crash reading them."""
    batch, decode, write = _batches()
    with pytest.raises(ValueError, match="tensors on the meta device have no data"):
        paged_attention_ref(**{k: v.to("meta") for k, v in batch.items()})
    with pytest.raises(ValueError, match="tensors on the meta device have no data"):
        reshape_and_cache(**{k: v.to("meta") for k, v in write.items()})


def test_a_refused_cache_write_changes_nothing():
    _, _, write = _batches()
    before = write["key_cache"].clone()
    with pytest.raises(ValueError):
        reshape_and_cache(**{**write, "slot_mapping": torch.tensor([0, 1, 10**6])})
    torch.testing.assert_close(write["key_cache"], before, rtol=0, atol=0, equal_nan=True)


if triton_available():
    @triton.jit
    def _tanh_kernel(x_ptr, out_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(out_ptr + i, _tanh(tl.load(x_ptr + i)))


def test_tanh_has_float32_relative_error():
    """The kernels' tanh against float64 over 24 binades, both signs: relative error within a few float32 ulps
    everywhere, where `2 * sigmoid(2x) - 1` loses all digits as x -> 0."""
    x = torch.cat([torch.logspace(-12, 1.3, 1000), torch.tensor([0.2499, 0.25, 0.2501, 30.0, 100.0])])
    x = torch.cat([x, -x, torch.zeros(3)]).float()
    padded = torch.zeros(4096)
    padded[:len(x)] = x
    out = torch.empty(4096, device=DEVICE)
    _tanh_kernel[(1,)](padded.to(DEVICE), out, N=4096)
    out, want = out.cpu(), torch.tanh(padded.double())
    relative = ((out.double() - want).abs() / want.abs().clamp_min(1e-300))[want != 0]
    assert relative.max().item() < 8 * 2**-24, relative.max().item()
    assert (out[want == 0] == 0).all()


@pytest.mark.parametrize("softcap", [1.0, 30.0, 500.0, 5000.0])
def test_softcap_error_does_not_grow_with_the_cap(softcap):
    """A 64-token decode and a 64-token prefill at caps 1, 30, 500 and 5000: all within the float32 tolerance.
    With `c * (2 * sigmoid(2s / c) - 1)` the error was about c * 2**-24: cap 500 failed by 1.8e-5, 5000 by 1.7e-4."""
    for seed in range(2):
        case = ("softcap", softcap, seed)
        decode = on_device(random_paged_batch([64, 64], [1, 1], 8, 2, 64, 16, seed=seed_for(*case)))
        check(unified_attention(**decode, softcap=softcap), decode, case, softcap=softcap)
        check(paged_decode_attention(**decode_inputs(decode), softcap=softcap, num_kv_splits=2), decode, case,
              softcap=softcap)
    prefill = on_device(random_paged_batch([64], [64], 4, 2, 64, 16, seed=seed_for("softcap-prefill", softcap)))
    check(unified_attention(**prefill, softcap=softcap), prefill, ("prefill", softcap), softcap=softcap)
