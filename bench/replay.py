"""Replay throughput of a shared-prefix workload, and the cost of lockstep conformance checking.

Run: .venv/bin/python bench/replay.py [--requests 100000] [--repeat 1] [--num-blocks 256]
Prints a markdown table (ops per second; medians over --repeat runs). Times are process CPU seconds
(`time.process_time`), and the measurements are interleaved run by run, so that other load on a shared machine
skews them as little as possible.
"""
import argparse
import statistics
import time

from kvref.conformance import check
from kvref.replay import TraceDriver, kvref_factory
from kvref.replay import replay
from kvref.workloads import replay_stats, shared_system_prompts, to_trace


def measure(fns: dict, repeat: int) -> dict:
    "Median CPU seconds of each function, running them in turn `repeat` times."
    times = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t = time.process_time(); fn(); times[name].append(time.process_time() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def engine_alone(ops):
    "kvref driven through the adapter protocol, decisions discarded as they come (like the replay measurement)."
    driver = TraceDriver(kvref_factory())
    for op in ops: driver.apply(op)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--num-blocks", type=int, default=256)
    a = p.parse_args()
    users = a.requests // 8
    w = shared_system_prompts(num_prompts=8, num_users=users, system_len=64, user_len=16, output_len=2,
                              block_size=16, num_blocks=a.num_blocks, seed=0)
    t = time.perf_counter(); ops = to_trace(w, max_live=16); t_gen = time.perf_counter() - t
    n = len(ops)
    m = measure({"replay": lambda: sum(1 for _ in replay(ops)),
                 "engine": lambda: engine_alone(ops),
                 "check": lambda: check(kvref_factory(), ops),
                 "stats": lambda: replay_stats(ops, replay(ops))}, a.repeat)
    t_replay, t_engine, t_check, t_stats = m["replay"], m["engine"], m["check"], m["stats"]
    s = replay_stats(ops, replay(ops))
    print(f"workload: shared_system_prompts, {8 * users} requests, 8 prompts x 64 tokens + 16 user tokens, "
          f"2 output tokens, block size 16, {a.num_blocks} blocks, 16 live; {n} ops "
          f"(trace written in {t_gen:.1f} s); token hit rate {s.token_hit_rate:.1%}, {s.evictions} evictions\n")
    print("| measurement | CPU seconds | ops/s | vs plain replay |")
    print("|---|---|---|---|")
    for name, sec in (("plain replay (`kvref.replay.replay`)", t_replay),
                      ("engine alone (kvref behind the adapter protocol, `Driver`)", t_engine),
                      ("lockstep `check` (replay + engine + compare)", t_check),
                      ("replay + `replay_stats`", t_stats)):
        print(f"| {name} | {sec:.2f} | {n / sec:,.0f} | {sec / t_replay:.2f}x |")
    print(f"\nlockstep check vs the engine's own run: {t_check / t_engine:.2f}x")


if __name__ == "__main__":
    main()
