"""Allocator benchmark (issue 4): microseconds per request on a shared-prefix serving workload, and the cost of
one allocate/free as the pool grows from 1e3 to 1e6 blocks. Prints markdown tables.

Run: .venv/bin/python bench/allocator.py [--quick]
"""
import argparse
import os
import random
import statistics
import sys
import time

from kvref.kv_cache_manager import KVCacheManager, Request


def serving_workload(num_requests=2000, prompt_len=512, shared_len=256, num_prefixes=8, decode_steps=32,
                     block_size=16, num_blocks=20000, live=16, algo="sha256", behavior="vllm_0_33", seed=0):
    "Run the workload once; return (wall seconds, CPU seconds, prefix-hit tokens, refusals)."
    rng = random.Random(seed)
    prefixes = [[rng.randrange(32000) for _ in range(shared_len)] for _ in range(num_prefixes)]
    prompts = [prefixes[i % num_prefixes] + [rng.randrange(32000) for _ in range(prompt_len - shared_len)]
               for i in range(num_requests)]
    m = KVCacheManager(num_blocks, block_size, behavior=behavior, hash_algo=algo)
    waiting, running, hit_tokens, refused = list(range(num_requests)), [], 0, 0
    start, cpu_start = time.perf_counter(), time.process_time()
    while waiting or running:
        while waiting and len(running) < live:
            i = waiting.pop(0)
            r = Request(f"r{i}", prompts[i])
            hits, num_hit = m.get_computed_blocks(r)
            if m.allocate_slots(r, r.num_tokens - num_hit, num_hit, hits) is None:
                refused += 1; waiting.insert(0, i); break
            r.num_computed_tokens = r.num_tokens
            hit_tokens += num_hit
            running.append([r, 0])
        for entry in list(running):
            r, steps = entry
            if steps == decode_steps:
                m.free(r); running.remove(entry); continue
            r.append_output_token_ids(steps + 7)     # the token the model "sampled"
            if m.allocate_slots(r, 1) is None: raise RuntimeError("pool too small for the workload")
            r.num_computed_tokens += 1
            entry[1] += 1
    return time.perf_counter() - start, time.process_time() - cpu_start, hit_tokens, refused


def allocate_free_cost(num_blocks, iterations=2000, block_size=16, repeats=5):
    "Median CPU microseconds for one allocate_slots + free of a 4-block request (2 hit blocks), half the pool held."
    m = KVCacheManager(num_blocks, block_size)
    m.block_pool.get_new_blocks((num_blocks - 1) // 2)     # half the pool held elsewhere
    shared = list(range(2 * block_size))
    reqs = [Request(f"q{i}", shared + [i % 50000 + 100] * (2 * block_size)) for i in range(iterations)]
    warm = Request("warm", shared + [1])
    m.allocate_slots(warm, warm.num_tokens); m.free(warm)
    for r in reqs: m._block_hashes(r)                      # hash outside the timed loop
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        for r in reqs:
            hits, num_hit = m.get_computed_blocks(r)
            m.allocate_slots(r, r.num_tokens - num_hit, num_hit, hits)
            m.free(r)
        times.append((time.process_time() - t0) / iterations * 1e6)
    return statistics.median(times)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="smaller runs (a smoke test)")
    args = p.parse_args(argv)
    n = 200 if args.quick else 2000
    load0 = os.getloadavg()
    print(f"## Serving workload ({n} requests x (512 prompt + 32 decode), 256-token prefixes shared by 8 prompts, "
          "block size 16, 20000 blocks, sha256, 16 live)\n")
    print("| behavior | run | wall s | wall us / request | CPU us / request | prefix-hit tokens | refusals |")
    print("|---|---|---|---|---|---|---|")
    for behavior in ("vllm_0_33", "design_doc"):
        runs = [serving_workload(num_requests=n, behavior=behavior) for _ in range(3)]
        for k, (wall, cpu, hits, refused) in enumerate(runs):
            print(f"| {behavior} | {k + 1} | {wall:.2f} | {wall / n * 1e6:.0f} | {cpu / n * 1e6:.0f} | {hits} | {refused} |")
        print(f"| {behavior} | **median** | | **{statistics.median(r[0] for r in runs) / n * 1e6:.0f}** "
              f"| **{statistics.median(r[1] for r in runs) / n * 1e6:.0f}** | | |")
    print("\n## One allocate + free as the pool grows (4-block request, 2 prefix-hit blocks, half the pool held)\n")
    print("| pool blocks | CPU us per allocate+free (median of 5 x 2000) | ratio to 1e3 |")
    print("|---|---|---|")
    sizes = [1_000, 10_000, 100_000] + ([] if args.quick else [1_000_000])
    base = None
    for size in sizes:
        us = allocate_free_cost(size)
        base = base or us
        print(f"| {size:,} | {us:.1f} | {us / base:.2f} |")
    print(f"\nPython {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average at start/end "
          f"{load0[0]:.1f}/{os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


if __name__ == "__main__":
    main()
