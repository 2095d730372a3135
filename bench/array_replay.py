"""The array replay (chapter 06f) beside the step-by-step one (chapter 06c), in one process: CPU seconds per request.

Run: .venv/bin/python bench/array_replay.py [--repeat 5] [--full ../shared/traces/mooncake/synthetic_trace.jsonl]
     [--million /tmp/million.jsonl --million-sizes 50000,...]  (the million-request trace: `kvref gen-trace /tmp/million.jsonl --requests 1000000`)

Every row replays the same trace both ways, checks the two `CacheSizeResult`s equal, and times each with
`time.process_time`, interleaved, the order flipped each repetition; each side builds its per-trace keys once, outside
the clock (06c's `block_hashes`, 06f's `TraceKeys`: their cost is reported apart). **kvref alone.** The million-request
sweep runs `sweep_arrays` on 2 processes and reports wall time and peak memory per worker.
"""
import argparse, itertools, os, resource, statistics, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kvref.oracle.array_replay import TraceKeys, replay_arrays, sweep_arrays
from kvref.oracle.production_traces import block_hashes, read_mooncake, replay_mooncake

SAMPLE = ROOT / "golden" / "mooncake" / "synthetic-trace-last300.jsonl"
SIZES = (12_500, 25_000, 50_000, 100_000, 256_000)


def cpu(f):
    start = time.process_time(); result = f(); return time.process_time() - start, result


def row(label, reqs, hashes, keys, n, ms, repeat):
    "One size both ways: medians per request and the ratio's median and range."
    old, new, ratios = [], [], []
    for rep in range(repeat):
        runs = {}
        for side in ((0, 1) if rep % 2 == 0 else (1, 0)):
            runs[side] = cpu(lambda: replay_mooncake(reqs, n, ms_per_step=ms, hashes=hashes) if side == 0 else
                             replay_arrays(reqs, n, ms_per_step=ms, keys=keys))
        assert runs[0][1] == runs[1][1], (runs[0][1], runs[1][1])
        old.append(runs[0][0]); new.append(runs[1][0]); ratios.append(runs[0][0] / runs[1][0])
    ms_req = lambda ts: statistics.median(ts) * 1e3 / len(reqs)
    print(f"| {label} | {n} | {runs[0][1].num_steps} | {ms_req(old):.2f} | {ms_req(new):.3f} | {statistics.median(ratios):.1f}x "
          f"({min(ratios):.1f}-{max(ratios):.1f}) | {os.getloadavg()[0]:.1f} |", flush=True)


def prepared(reqs):
    "Each side's per-trace keys, and what building them cost per request."
    t_hashes, hashes = cpu(lambda: [block_hashes(r, 16, 512) for r in reqs])
    t_keys, keys = cpu(lambda: TraceKeys(reqs, 16, 512))
    print(f"per-trace keys, ms per request: block_hashes {t_hashes * 1e3 / len(reqs):.3f}, TraceKeys {t_keys * 1e3 / len(reqs):.3f}")
    return hashes, keys


def million(path, sizes, limit=None):
    "The million-request sweep on the array engine: 2 processes, wall time, CPU time, peak memory per worker."
    start = time.time(); reqs = list(itertools.islice(read_mooncake(path), limit)); read = time.time() - start
    print(f"read {len(reqs)} requests in {read:.0f} s wall; main process peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB", flush=True)
    start, c0 = time.time(), os.times()
    results = sweep_arrays(reqs, sizes, jobs=min(2, len(sizes)))
    c1, wall = os.times(), time.time() - start
    children = (c1.children_user + c1.children_system - c0.children_user - c0.children_system  # the workers, or this process
                + (c1.user + c1.system - c0.user - c0.system if len(sizes) == 1 else 0))
    print(f"sweep: {len(sizes)} sizes x {len(reqs)} requests in {wall:.0f} s wall, {children:.0f} CPU s replaying "
          f"({children * 1e3 / len(sizes) / len(reqs):.3f} ms per request per size); workers' peak RSS "
          f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MB; load {os.getloadavg()[0]:.1f}")
    for r in results: print(f"| {r.num_blocks} | {r.hit_rate:.4f} | {r.evictions} | {r.preemptions} | {r.num_steps} |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--full", type=Path, help="also the whole trace, at --full-sizes")
    p.add_argument("--full-sizes", default="200000,800000")
    p.add_argument("--million", type=Path, help="a million-request trace: sweep it at --million-sizes")
    p.add_argument("--million-sizes", default="25000,50000,100000,200000,400000,800000,1600000,2000000")
    p.add_argument("--million-requests", type=int, default=None, help="only the first N requests of the --million trace")
    p.add_argument("--no-sample", action="store_true", help="skip the sample rows")
    a = p.parse_args()
    print("| load | blocks | steps | step-by-step CPU ms/request | arrays CPU ms/request | speed-up, median (range) | load avg |")
    print("|---|---|---|---|---|---|---|")
    if not a.no_sample:
        sample = list(read_mooncake(SAMPLE)); hashes, keys = prepared(sample)
        for ms, label in ((None, "sample, all queued at step 0"), (10, "sample, 10 ms per step")):
            for n in SIZES: row(label, sample, hashes, keys, n, ms, a.repeat)
    if a.full:
        full = list(read_mooncake(a.full)); hashes, keys = prepared(full)
        for n in map(int, a.full_sizes.split(",")): row("whole trace, all queued at step 0", full, hashes, keys, n, None, 1)
    if a.million: million(a.million, [int(n) for n in a.million_sizes.split(",")], a.million_requests)


if __name__ == "__main__":
    main()
