"""Hit rate over GPU x CPU sizes (the CPU offload tier, chapter 06d): the cost of `kvref.kv_offload.offload_sweep`.

Run: PYTHONHASHSEED=0 .venv/bin/python bench/offload_sweep.py [--trace golden/mooncake/synthetic-trace-last300.jsonl] [--block-size 16]
     [--blocks 12500,25000,50000] [--cpu-blocks 0,12500,25000,50000,100000,200000] [--policy lru,arc] [--jobs 2] [--repeat 3]
     [--json bench/offload_sweep.json]
Prints the grid as a markdown table (under the scheduler and tier settings), the grid's wall time, then the cost of
one grid point: the median of `--repeat` replays of the point (first GPU size, largest CPU size, first policy), in
seconds per point and microseconds per request. `--json` also writes the grid's results, which the chapter reads.
PYTHONHASHSEED=0 makes the grid reproducible: as in vLLM, requests finishing in the same step are handled in the
order of a `set` of their ids, which follows the interpreter's string hashing (rows move by up to half a point).
"""
import argparse
import json
import statistics
import time
from dataclasses import asdict

from kvref.kv_offload import doubling_gains, format_offload_results, offload_sweep, replay_offload
from kvref.oracle.production_traces import block_hashes, ideal_hit_rate, read_mooncake


def ints(text: str) -> list[int]: return [int(x) for x in text.split(",")]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trace", default="golden/mooncake/synthetic-trace-last300.jsonl")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--blocks", type=ints, default=ints("12500,25000,50000"))
    p.add_argument("--cpu-blocks", type=ints, default=ints("0,12500,25000,50000,100000,200000"))
    p.add_argument("--policy", default="lru,arc")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json")
    a = p.parse_args()
    requests = list(read_mooncake(a.trace))
    ideal = ideal_hit_rate(requests, a.block_size)
    print(f"{a.trace}: {len(requests)} requests, {sum(r.input_length for r in requests):,} prompt tokens; "
          f"infinite-cache hit rate {ideal:.4f}; block size {a.block_size}")
    policies = a.policy.split(",")
    t = time.perf_counter()
    results = offload_sweep(requests, a.blocks, a.cpu_blocks, policies, block_size=a.block_size, jobs=a.jobs)
    wall = time.perf_counter() - t
    print(format_offload_results(results))
    for d in doubling_gains(results): print("doubling:", json.dumps(d))
    points = len(results)
    print(f"grid of {points} points on {a.jobs} processes: {wall:.1f} s wall, {wall * a.jobs / points:.1f} "
          f"process-seconds per point")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"trace": a.trace, "block_size": a.block_size, "requests": len(requests), "ideal_hit_rate": ideal,
                       "wall_s": round(wall, 1),
                       "jobs": a.jobs, "results": [asdict(r) for r in results]}, f, indent=1)
    if a.repeat:
        hashes = [block_hashes(r, a.block_size) for r in requests]
        point = (a.blocks[0], max(a.cpu_blocks), policies[0])
        times = []
        for _ in range(a.repeat):
            t = time.process_time()
            replay_offload(requests, *point, hashes=hashes, block_size=a.block_size)
            times.append(time.process_time() - t)
        med = statistics.median(times)
        print(f"one point {point}, median of {a.repeat}: {med:.2f} CPU s per point, "
              f"{1e6 * med / len(requests):,.0f} µs per request (runs: {', '.join(f'{x:.2f}' for x in times)})")


if __name__ == "__main__":
    main()
