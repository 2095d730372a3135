"""Replay and lockstep-check throughput as the pool grows: trace format 1 (whole free queue per decision) against
format 2 (free-queue changes), and `kvref.oracle.conformance.check` against plain replay.

Run: .venv/bin/python bench/replay.py [--users 1000] [--repeat 3] [--v1-ops 3000]
Prints a markdown table: ops per second at 1e3, 1e4 and 1e5 blocks. Times are process CPU seconds
(`time.process_time`), medians of --repeat runs interleaved run by run, with the cost of the config op (building
the pool, which grows with it) measured apart and left out, so the numbers are the cost per op.
"""
import argparse
import statistics
import time

from kvref.oracle.conformance import check
from kvref.oracle.replay import kvref_factory, replay
from kvref.oracle.workloads import shared_system_prompts, to_trace


def cpu(fn) -> float:
    t = time.process_time(); fn(); return time.process_time() - t


def per_op(fn, ops, repeat: int) -> float:
    "Median CPU seconds per op of `fn(ops)`, less `fn` on the config op alone."
    runs = [(cpu(lambda: fn(ops)) - cpu(lambda: fn(ops[:1]))) / (len(ops) - 1) for _ in range(repeat)]
    return statistics.median(runs)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=1000, help="users per system prompt (8 prompts)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--v1-ops", type=int, default=3000, help="ops replayed in format 1 (it walks the whole queue)")
    a = p.parse_args()
    print(f"workload: shared_system_prompts, {8 * a.users} requests, 8 prompts x 64 tokens + 16 user tokens, "
          f"2 output tokens, block size 16, 16 live\n")
    print("| blocks | ops | format 1 replay ops/s | format 2 replay ops/s | lockstep `check` ops/s "
          "| check / format 2 replay |")
    print("|---|---|---|---|---|---|")
    for num_blocks in (1_000, 10_000, 100_000):
        w = shared_system_prompts(num_prompts=8, num_users=a.users, system_len=64, user_len=16, output_len=2,
                                  block_size=16, num_blocks=num_blocks, seed=0)
        ops = to_trace(w, max_live=16)
        v1 = per_op(lambda o: sum(1 for _ in replay(o)), ops[:a.v1_ops], a.repeat)
        v2 = per_op(lambda o: sum(1 for _ in replay(o, version=2)), ops, a.repeat)
        lock = per_op(lambda o: check(kvref_factory(), o), ops, a.repeat)
        print(f"| {num_blocks:,} | {len(ops):,} | {1 / v1:,.0f} | {1 / v2:,.0f} | {1 / lock:,.0f} "
              f"| {lock / v2:.2f}x |")


if __name__ == "__main__":
    main()
