"""Paged decode attention: achieved memory bandwidth against the device's copy bandwidth and PyTorch SDPA.

    .venv/bin/python bench/attention.py                 # needs a CUDA GPU; prints that none is present otherwise
    .venv/bin/python bench/attention.py --cpu-interpreter   # small shapes through TRITON_INTERPRET=1 (test budgeting)

Decode at batch 64, context 4096, 32 query heads over 8 KV heads, head size 128, block size 16, float16. The bytes
a decode step must move are the keys and values of every sequence (2 x 64 x 4096 x 8 x 128 x 2 B = 1.07 GB); the
achieved bandwidth is those bytes over the median time, reported as a fraction of a device-to-device copy's
bandwidth measured on the same GPU. SDPA runs on the same data made dense ([batch, heads, context, head_size]).
Prints a markdown table.
"""
import argparse
import os
import statistics
import sys
import time

import torch


def median_ms(fn, reps: int = 50, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth(num_bytes: int = 2 << 30) -> float:
    """Bytes per second of a device-to-device copy (read + write counted)."""
    src = torch.empty(num_bytes // 2, dtype=torch.float16, device="cuda").normal_()
    dst = torch.empty_like(src)
    return 2 * num_bytes / (median_ms(lambda: dst.copy_(src), reps=20) / 1e3)


def gpu_bench(batch: int, context: int, num_query_heads: int, num_kv_heads: int, head_size: int, block_size: int,
              dtype: torch.dtype) -> tuple[list[tuple], float]:
    from kvref.kernels.triton_attention import paged_decode_attention, unified_attention
    g = torch.Generator(device="cuda").manual_seed(0)
    blocks_per_seq = context // block_size
    num_blocks = batch * blocks_per_seq
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_size, device="cuda", dtype=dtype, generator=g)
    value_cache = torch.randn_like(key_cache)
    block_table = torch.randperm(num_blocks, device="cuda", generator=g).view(batch, blocks_per_seq).to(torch.int32)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    query = torch.randn(batch, num_query_heads, head_size, device="cuda", dtype=dtype, generator=g)
    query_start_loc = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    # the same data made dense for SDPA: [batch, kv_heads, context, head_size]
    rows = block_table.long()
    dense_k = key_cache[rows].reshape(batch, context, num_kv_heads, head_size).transpose(1, 2).contiguous()
    dense_v = value_cache[rows].reshape(batch, context, num_kv_heads, head_size).transpose(1, 2).contiguous()
    q4 = query.unsqueeze(2)  # [batch, heads, 1, head_size]
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q4, dense_k, dense_v, enable_gqa=True)
    expected = sdpa().squeeze(2).float()
    decode_args = dict(query=query, key_cache=key_cache, value_cache=value_cache, seq_lens=seq_lens, block_table=block_table)
    paged_decode_attention(**decode_args)  # validated once; timed calls skip the host-side checks
    kv_bytes = 2 * batch * context * num_kv_heads * head_size * key_cache.element_size()
    peak = copy_bandwidth()
    runs = [("torch SDPA (dense)", sdpa)]
    for splits in (1, 2, 4, 8):
        runs.append((f"kvref paged_decode_attention, {splits} split(s)",
                     lambda s=splits: paged_decode_attention(**decode_args, num_kv_splits=s, validate=False, tile_size=64)))
    runs.append(("kvref unified_attention", lambda: unified_attention(query, key_cache, value_cache, query_start_loc, seq_lens,
                                                                     block_table, max_query_len=1, validate=False)))
    table = []
    sdpa_ms = None
    for name, fn in runs:
        out = fn()
        err = (out.reshape(expected.shape).float() - expected).abs().max().item()
        ms = median_ms(fn)
        sdpa_ms = sdpa_ms or ms
        table.append((name, ms, kv_bytes / (ms / 1e3) / 1e9, kv_bytes / (ms / 1e3) / peak, sdpa_ms / ms, err))
    return table, peak


def cpu_interpreter_bench() -> list[tuple]:
    os.environ["TRITON_INTERPRET"] = "1"
    from kvref.kernels import paged_attention_ref, random_paged_batch
    from kvref.kernels.triton_attention import paged_decode_attention, unified_attention
    rows = []
    for label, seqs, qlens in (("decode 4 x 100", [100] * 4, [1] * 4), ("mixed 5 seqs, 35 new tokens", [1, 16, 19, 53, 100], [1, 1, 19, 7, 1])):
        batch = random_paged_batch(seqs, qlens, 8, 2, 64, 16, torch.float32, seed=0)
        decode = {k: v for k, v in batch.items() if k != "query_start_loc"}
        calls = [("oracle (float64 torch)", lambda: paged_attention_ref(**batch)),
                 ("unified_attention (interpreted)", lambda: unified_attention(**batch))]
        if all(q == 1 for q in qlens):
            calls.append(("paged_decode_attention, 4 splits (interpreted)", lambda: paged_decode_attention(**decode, num_kv_splits=4)))
        for name, fn in calls:
            fn()
            times = []
            for _ in range(5):
                t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
            rows.append((label, name, 1e3 * statistics.median(times)))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-interpreter", action="store_true", help="time small shapes through the Triton interpreter on CPU")
    args = parser.parse_args(argv)
    if args.cpu_interpreter:
        print("| batch | call | median ms |\n|---|---|---:|")
        for label, name, ms in cpu_interpreter_bench():
            print(f"| {label} | {name} | {ms:.1f} |")
        return 0
    if not torch.cuda.is_available():
        print("No CUDA GPU present: bench/attention.py measures GPU bandwidth and has nothing to do here.")
        return 0
    import triton
    shape = dict(batch=64, context=4096, num_query_heads=32, num_kv_heads=8, head_size=128, block_size=16, dtype=torch.float16)
    table, peak = gpu_bench(**shape)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"shape: {shape}; measured copy bandwidth {peak / 1e9:.0f} GB/s")
    print("\n| kernel | median ms | GB/s | fraction of copy bandwidth | speed vs SDPA | max abs err vs SDPA |\n|---|---:|---:|---:|---:|---:|")
    for name, ms, gbs, frac, speed, err in table:
        print(f"| {name} | {ms:.3f} | {gbs:.0f} | {frac:.0%} | {speed:.2f}x | {err:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
