"""The event-driven replay against the step-by-step one, side by side in one run: CPU seconds per request.

Run: .venv/bin/python bench/event_replay.py [--repeat 5] [--no-heavy] [--full ../shared/traces/mooncake/synthetic_trace.jsonl] [--full-sizes 200000]
For each load and cache size it replays with `replay_mooncake` plain and with `advance=advance_decode` (interleaved,
`--repeat` times, the order flipped each time), checks
the two `CacheSizeResult`s are equal, and prints CPU seconds per request for each, the speed-up, the share of steps
moved in bulk, and the load average of the machine (other work on the same cores inflates both sides alike).
"""
import argparse
import dataclasses
import os
import statistics
import time
from pathlib import Path

from kvref.oracle.event_replay import advance_decode
from kvref.oracle.production_traces import block_hashes, read_mooncake, replay_mooncake

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "golden" / "mooncake" / "synthetic-trace-last300.jsonl"
SIZES = [12_500, 25_000, 50_000, 100_000, 256_000]  # the production-traces chapter's sizes


def timed(requests, hashes, num_blocks, **kwargs):
    "One replay: its result, CPU seconds, and the steps `advance` moved (if given)."
    moved = []
    if "advance" in kwargs: kwargs["advance"] = lambda *a: moved.append(advance_decode(*a)) or moved[-1]
    t = time.process_time()
    result = replay_mooncake(requests, num_blocks, hashes=hashes, **kwargs)
    return result, time.process_time() - t, sum(moved)


def row(name, requests, hashes, num_blocks, repeat=1, **kwargs):
    "Plain and event-driven replays, interleaved `repeat` times with the order flipped each time; medians."
    times = {False: [], True: []}
    for r in range(repeat):
        for fast in ((False, True) if r % 2 == 0 else (True, False)):
            result, t, moved = timed(requests, hashes, num_blocks, **(dict(advance=True) if fast else {}), **kwargs)
            times[fast].append(t)
            if fast: fast_result, num_moved = result, moved
            else: plain_result = result
        assert plain_result == fast_result, (plain_result, fast_result)
    n, (t_plain, t_fast) = len(requests), (statistics.median(times[False]), statistics.median(times[True]))
    ratios = sorted(p / f for p, f in zip(times[False], times[True]))
    print(f"| {name} | {num_blocks} | {plain_result.num_steps} | {num_moved / plain_result.num_steps:.0%} | {1e3 * t_plain / n:.2f} | "
          f"{1e3 * t_fast / n:.2f} | {t_plain / t_fast:.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}) | {os.getloadavg()[0]:.1f} |", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--full", default=None, help="also the whole trace at --full-sizes")
    p.add_argument("--full-sizes", default="200000")
    p.add_argument("--repeat", type=int, default=5, help="interleaved repetitions of each sample row")
    p.add_argument("--no-heavy", action="store_true", help="skip the 2,000-token-output rows (minutes)")
    a = p.parse_args()
    sample = list(read_mooncake(SAMPLE))
    hashes = [block_hashes(r) for r in sample]
    long_out = [dataclasses.replace(r, output_length=2000) for r in sample]
    print("| load | blocks | steps | steps moved in bulk | plain CPU ms/request | event-driven CPU ms/request | speed-up, median (range) | load avg |")
    print("|---|---|---|---|---|---|---|---|")
    for n in SIZES: row("sample, all queued at step 0", sample, hashes, n, a.repeat)
    for n in SIZES: row("sample, 10 ms per step", sample, hashes, n, a.repeat, ms_per_step=10.0)
    for n in SIZES if not a.no_heavy else (): row("sample, outputs set to 2,000 tokens", long_out, hashes, n)
    if a.full:
        full = list(read_mooncake(a.full))
        full_hashes = [block_hashes(r) for r in full]
        for n in map(int, a.full_sizes.split(",")): row("whole trace, all queued at step 0", full, full_hashes, n)


if __name__ == "__main__":
    main()
