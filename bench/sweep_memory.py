"""Memory per sweep worker: the peak RSS of one grid point, kvref alone and (with --ray) in Ray's worker processes.

Run: .venv/bin/python bench/sweep_memory.py [--trace golden/mooncake/synthetic_trace.jsonl] [--blocks 50000,200000] [--ray]
Each size runs in a fresh Python process that does what one worker does (read the trace, derive its block keys, replay
one size) and reports its peak RSS (`ru_maxrss`) after each stage. `--ray` then runs the same sizes as one sweep on a
Ray started on this machine (`sweep(..., ray="local")`) and samples the RSS of its worker processes (`ps`, every 0.2 s).
"""
import argparse, json, resource, subprocess, sys, threading, time

from kvref.oracle.production_traces import read_mooncake, sweep

ONE_POINT = """
import json, resource, sys, time
mb = lambda: round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
from kvref.oracle.production_traces import block_hashes, read_mooncake, replay_mooncake
stages = {"imports": mb()}
requests = list(read_mooncake(sys.argv[1])); stages["trace"] = mb()
keys = [block_hashes(r) for r in requests]; stages["block keys"] = mb()  # what a worker's init derives, once
t = time.process_time(); result = replay_mooncake(requests, int(sys.argv[2]), hashes=keys); stages["replay (peak)"] = mb()
print(json.dumps(dict(stages, cpu_s=round(time.process_time() - t, 1), hit_rate=round(result.hit_rate, 4))))
"""


def ray_worker_peaks(requests, blocks) -> list[int]:
    "Peak RSS in MB of each Ray worker process while `sweep(requests, blocks, ray='local')` runs."
    peak, done = {}, threading.Event()
    def poll():
        while not done.is_set():
            for line in subprocess.run(["ps", "-eo", "pid,rss,cmd"], capture_output=True, text=True).stdout.splitlines()[1:]:
                pid, rss, cmd = line.split(None, 2)
                if cmd.startswith("ray::"): peak[pid] = max(peak.get(pid, 0), int(rss) // 1024)
            time.sleep(0.2)
    threading.Thread(target=poll, daemon=True).start()
    try: sweep(requests, blocks, ray="local")
    finally: done.set()
    return sorted(peak.values())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trace", default="golden/mooncake/synthetic_trace.jsonl")
    p.add_argument("--blocks", default="50000,200000")
    p.add_argument("--ray", action="store_true")
    a = p.parse_args()
    blocks = [int(b) for b in a.blocks.split(",")]
    for n in blocks:
        out = subprocess.run([sys.executable, "-c", ONE_POINT, a.trace, str(n)], capture_output=True, text=True, check=True)
        print(f"{n} blocks, kvref alone, peak RSS in MB after each stage:", out.stdout.strip())
    if a.ray:
        print("Ray worker processes, peak RSS in MB:", ray_worker_peaks(list(read_mooncake(a.trace)), blocks))


if __name__ == "__main__":
    main()
