"""Hybrid allocator benchmark (issue 16): microseconds per request on the shared-prefix serving workload for a
Gemma-3-like layout (6 sliding-window groups + full, 7 groups) and a gpt-oss-like one (sliding + full), next to the
single-group manager on the same workload, and next to vLLM 0.33's own KVCacheManager when vLLM is importable.
Prints a markdown table.

Run: .venv/bin/python bench/hybrid.py [--quick]
"""
import argparse
import random
import statistics
import time

from kvref.hybrid import FullAttentionSpec, HybridKVCacheManager, HybridRequest, SlidingWindowSpec
from kvref.kv_cache_manager import KVCacheManager, Request

LAYOUTS = {
    "single group (full)": [FullAttentionSpec(16)],
    "gpt-oss-like (sliding 128 + full)": [SlidingWindowSpec(16, 128), FullAttentionSpec(16)],
    "Gemma-3-like (6 x sliding 512 + full)": [SlidingWindowSpec(16, 512)] * 6 + [FullAttentionSpec(16)],
}


def serving_workload(specs, num_requests=600, prompt_len=512, shared_len=256, num_prefixes=8, decode_steps=32,
                     num_blocks=40000, live=16, seed=0, single=False):
    "Run the workload once; return (CPU seconds, prefix-hit tokens). `single`: the single-group KVCacheManager."
    rng = random.Random(seed)
    prefixes = [[rng.randrange(32000) for _ in range(shared_len)] for _ in range(num_prefixes)]
    prompts = [prefixes[i % num_prefixes] + [rng.randrange(32000) for _ in range(prompt_len - shared_len)]
               for i in range(num_requests)]
    m = KVCacheManager(num_blocks, 16) if single else HybridKVCacheManager(specs, num_blocks, retention_interval=None)
    make = Request if single else HybridRequest
    waiting, running, hit_tokens = list(range(num_requests)), [], 0
    cpu_start = time.process_time()
    while waiting or running:
        while waiting and len(running) < live:
            i = waiting.pop(0)
            r = make(f"r{i}", prompts[i])
            hits, num_hit, *_ = m.get_computed_blocks(r)
            if m.allocate_slots(r, r.num_tokens - num_hit, num_hit, hits) is None: raise RuntimeError("pool too small")
            r.num_computed_tokens, hit_tokens = r.num_tokens, hit_tokens + num_hit
            running.append([r, 0])
        for entry in list(running):
            r, steps = entry
            if steps == decode_steps: m.free(r); running.remove(entry); continue
            r.append_output_token_ids(steps + 7)
            if m.allocate_slots(r, 1) is None: raise RuntimeError("pool too small")
            r.num_computed_tokens += 1; entry[1] += 1
    return time.process_time() - cpu_start, hit_tokens


def vllm_available() -> bool:
    try:
        import vllm.v1.core.kv_cache_manager  # noqa: F401
        return True
    except Exception:
        return False


def main(quick: bool = False):
    n, repeats = (150, 3) if quick else (600, 5)
    print(f"Shared-prefix serving workload: {n} requests of 512 tokens (256 shared, 8 prefixes), 32 decode steps, "
          f"16 live, block 16, dense retention; median of {repeats} runs, CPU time.\n")
    print("| layout | groups | kvref µs/request | prefix-hit tokens |")
    print("|---|---|---|---|")
    base = [serving_workload(None, n, single=True)[0] for _ in range(repeats)]
    print(f"| KVCacheManager (single group) | 1 | {statistics.median(base) / n * 1e6:.0f} | |")
    for name, specs in LAYOUTS.items():
        runs = [serving_workload(specs, n) for _ in range(repeats)]
        print(f"| {name} | {len(specs)} | {statistics.median(t for t, _ in runs) / n * 1e6:.0f} | {runs[0][1]} |")
    print("\nvLLM 0.33 KVCacheManager on the same layouts:",
          "importable (not yet wired into this script)" if vllm_available() else "not importable here (no vLLM in this environment)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and repeats")
    main(parser.parse_args().quick)
