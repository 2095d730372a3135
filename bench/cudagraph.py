"""Benchmark kvref.compilation.cudagraph: key building, dispatch latency, and the CPU stand-in wrapper against eager calls.

Run: .venv/bin/python bench/cudagraph.py   (prints a markdown table; numbers go to bench/cudagraph.md)
"""
import random, statistics, time

import torch

from kvref.compilation.cudagraph import (
    BatchDescriptor, CUDAGraphMode, CUDAGraphWrapper, CudagraphDispatcher, LoRASettings, capture_cudagraphs,
    derive_capture_sizes, set_forward_context,
)


def median_us(fn, calls: int, repeats: int = 7) -> float:
    """Median over `repeats` runs of the mean time of one call, in microseconds."""
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls): fn()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(runs)


def main() -> None:
    sizes, _ = derive_capture_sizes(max_num_seqs=256, max_num_batched_tokens=8192)
    rows = []
    for label, lora in [("no LoRA", None), ("LoRA, 8 adapters, per-count graphs", LoRASettings(8, specialize_active_loras=True))]:
        d = CudagraphDispatcher(sizes, 256, lora)
        build = median_us(lambda: d.initialize_cudagraph_keys("FULL_AND_PIECEWISE"), calls=20)
        keys = sum(len(k) for k in d.cudagraph_keys.values())
        rows.append((f"initialize_cudagraph_keys, {len(sizes)} sizes, {label} ({keys} keys)", build))
    d = CudagraphDispatcher(sizes, 256)
    d.initialize_cudagraph_keys("FULL_AND_PIECEWISE")
    rng = random.Random(0)
    batches = [(n, False) for n in (rng.randint(1, 600) for _ in range(500))] + [(r, True) for r in (rng.randint(1, 256) for _ in range(500))]
    it = iter(batches * 1000)
    rows.append(("dispatch, mixed + uniform batches of 1..600 tokens", median_us(lambda: d.dispatch(*next(it)), calls=5000)))

    # the stand-in wrapper: one piece (a 256x256 matmul) called eagerly vs replayed
    w = torch.randn(256, 256)
    piece = CUDAGraphWrapper(lambda x: torch.tanh(x @ w), "PIECEWISE", device="cpu")
    buf, key = torch.randn(64, 256), BatchDescriptor(64)
    with set_forward_context(CUDAGraphMode.PIECEWISE, key, capturing=True): piece(buf)
    def eager():
        with set_forward_context(CUDAGraphMode.NONE): piece(buf)
    def replay():
        with set_forward_context(CUDAGraphMode.PIECEWISE, key): piece(buf)
    rows.append(("64x256 piece, eager through the wrapper", median_us(eager, calls=2000)))
    rows.append(("64x256 piece, stand-in replay (recompute + copy into static output)", median_us(replay, calls=2000)))

    print("| what | median µs per call |\n|---|---|")
    for what, us in rows: print(f"| {what} | {us:.2f} |")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
