"""When fast hashing's numpy routes pay, measured where the KV cache manager uses them.

1. The *prompt route*: `pickle_prompt` when a `Request` is built (one pickle of the whole prompt checks its ids), then
   its first hashing cuts each block from that pickle. Timed: building the request and its first hashing
   (`FastKVCacheManager._block_hashes`), the route on (from 4 tokens) and off, interleaved.
2. The *chunk route* for ids already checked: `hash_blocks` with one pickle per chunk, cut with numpy (the route,
   which checks the ids as it cuts, `ids_checked=False`, forced on from 4 blocks) against the per-block loop that
   trusts them (`ids_checked=True`, which the manager passes).

CPU µs per request (medians of `--repeat`, sides interleaved), sha256, block size 16, random ids below 100,000
(below 10,000,000 at 12,800 tokens, as in the Mooncake sample).

Run: `.venv/bin/python bench/hash_routes.py [--repeat 7] [--lengths 512,640,768,...]`
"""
import argparse, datetime, gc, os, platform, random, statistics, sys, time

import kvref.core.fast_hashing as fh
from kvref.core.kv_cache_manager import Request
from kvref.core.fast_allocator import FastKVCacheManager

OFF = 10**9


def build_and_hash(prompts: list[list[int]], prompt_min: int) -> float:
    "CPU µs per request to build it and hash its prompt, as the manager's first lookup does; the prompt route from `prompt_min` tokens."
    fh._PICKLED_PROMPT_MIN_TOKENS = prompt_min
    m = FastKVCacheManager(10, 16, hash_algo="sha256")
    c = time.process_time()
    for i, p in enumerate(prompts): m._block_hashes(Request(f"r{i}", p))
    return (time.process_time() - c) / len(prompts) * 1e6


def chunk_hash(prompts: list[list[int]], route: bool) -> float:
    "CPU µs per prompt to hash all its blocks with `hash_blocks`: the chunk route (checking the ids) or the trusting loop."
    fh._PICKLE_MIN_BLOCKS, parent = 4, fh.init_none_hash("sha256")
    c = time.process_time()
    for p in prompts: fh.hash_blocks("sha256", parent, p, 0, len(p) // 16 * 16, 16, None, ids_checked=not route)
    return (time.process_time() - c) / len(prompts) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--lengths", default="256,512,640,768,1024,2048,4096,12800")
    args = parser.parse_args()
    saved = fh._PICKLED_PROMPT_MIN_TOKENS, fh._PICKLE_MIN_BLOCKS
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, load {os.getloadavg()[0]:.1f}; kvref's thresholds: the prompt route from {saved[0]} "
          f"tokens, the chunk route from {saved[1]} blocks (unchecked ids only)")
    print("\n| prompt tokens | requests | prompt route on µs | off µs | on / off | chunk route µs | trusting loop µs | route / loop |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    gc.disable()
    rng = random.Random(0)
    sides = {"on": lambda p: build_and_hash(p, 4), "off": lambda p: build_and_hash(p, OFF),
             "route": lambda p: chunk_hash(p, True), "loop": lambda p: chunk_hash(p, False)}
    for n in map(int, args.lengths.split(",")):
        top = 10**7 if n >= 12800 else 100_000
        prompts = [[rng.randrange(top) for _ in range(n)] for _ in range(400_000 // n + 10)]
        times = {k: [] for k in sides}
        try:
            for rep in range(args.repeat):
                for name in (list(sides) if rep % 2 == 0 else list(sides)[::-1]): times[name].append(sides[name](prompts))
        finally: fh._PICKLED_PROMPT_MIN_TOKENS, fh._PICKLE_MIN_BLOCKS = saved
        m = {k: statistics.median(v) for k, v in times.items()}
        print(f"| {n} | {len(prompts)} | {m['on']:.1f} | {m['off']:.1f} | {m['on'] / m['off']:.2f} | {m['route']:.1f} | "
              f"{m['loop']:.1f} | {m['route'] / m['loop']:.2f} |")
    gc.enable()


if __name__ == "__main__":
    sys.exit(main())
