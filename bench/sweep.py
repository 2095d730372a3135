"""Hit rate versus cache size on the whole shared Mooncake trace: the cost of `kvref.oracle.production_traces.sweep`.

Run: .venv/bin/python bench/sweep.py [--trace golden/mooncake/synthetic_trace.jsonl] [--jobs 2]
     [--blocks 12500,25000,...] [--scaling]
Prints the sweep as a markdown table, then wall seconds, CPU seconds per replay and requests per second per core.
`--scaling` also times one replay of the first half of the trace and of the whole trace at one size (2x the
requests should take about 2x the time).
"""
import argparse
import time

from kvref.oracle.production_traces import block_hashes, format_results, ideal_hit_rate, read_mooncake, replay_mooncake, sweep

SIZES = "12500,25000,50000,100000,200000,400000,800000,1600000"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trace", default="golden/mooncake/synthetic_trace.jsonl")
    p.add_argument("--blocks", default=SIZES)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--scaling", action="store_true")
    a = p.parse_args()
    t = time.perf_counter()
    requests = list(read_mooncake(a.trace))
    print(f"read {len(requests)} requests, {sum(r.input_length for r in requests):,} prompt tokens "
          f"in {time.perf_counter() - t:.1f} s; infinite-cache hit rate {ideal_hit_rate(requests):.4f}")
    blocks = [int(b) for b in a.blocks.split(",")]
    t = time.perf_counter()
    results = sweep(requests, blocks, jobs=a.jobs)
    wall = time.perf_counter() - t
    print(format_results(results))
    per_core = len(requests) * len(blocks) / (wall * a.jobs)
    print(f"sweep of {len(blocks)} sizes on {a.jobs} processes: {wall:.1f} s wall; "
          f"{per_core:,.0f} requests/s per core")
    if a.scaling:
        half = requests[:len(requests) // 2]
        for name, reqs in (("first half", half), ("whole", requests)):
            hashes = [block_hashes(r) for r in reqs]
            t = time.process_time()
            replay_mooncake(reqs, 200_000, hashes=hashes)
            cpu = time.process_time() - t
            print(f"{name}: {len(reqs)} requests, one replay at 200,000 blocks: {cpu:.1f} CPU s "
                  f"({len(reqs) / cpu:,.0f} requests/s)")


if __name__ == "__main__":
    main()
