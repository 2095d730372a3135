"""The allocator, kvref against vLLM 0.33 itself: kvref's `FastKVCacheManager` beside vLLM's own `KVCacheManager`
(`vllm/v1/core/kv_cache_manager.py` at v0.33.0, one full-attention KV cache group, on the CPU), in one process.

Run where both import, e.g. `PYTHONPATH=. /work/venv-vllm/bin/python bench/allocator.py` (a venv with torch and
`pip install --no-deps vllm==0.33.0` plus the pure-Python packages its core imports; CPU only is enough). Where vLLM
is not importable the script says why and times kvref alone.

The workload is a serving loop: requests whose prompt's first half is one of 8 shared prefixes (round robin) and
whose second half is unique, 16 live at a time, each prefilled in one step (`get_computed_blocks`, then one
`allocate_slots`), then 32 decode steps (append one token, `allocate_slots(request, 1)`), then freed. Block size 16,
sha256 block hashes, a pool twice what the live requests hold. *Hashing included*: the timed loop builds each
request (token checks, prompt hashing); *excluded*: requests are built and their prompts hashed before it (decode
hashing stays in). Before timing, one untimed run of each side records every request's prefix hit and block ids
and the final free queue, and the two must be equal. Then interleaved repetitions, the order flipped every
repetition, CPU time (`time.process_time`). Reported: each side's microseconds per request (medians) and the ratio
kvref / vLLM per repetition, median and range (below 1: kvref is faster).

`--memory` measures RSS growth per cached block: a pool of 1e6 blocks, every one filled, cached and freed (so all
sit cached in the free queue), each side in its own fresh process. `--profile` runs kvref alone under cProfile.
`--build` times building and hashing a request alone, step by step: kvref's `Request(...)`, then its first
`update_block_hashes`; vLLM's `Request(...)` without a block hasher, and with one (the difference is its hashing).
"""
from __future__ import annotations
import argparse, cProfile, datetime, gc, io, os, platform, pstats, random, statistics, subprocess, sys, time

from kvref.core.kv_cache_manager import Request
from kvref.core.fast_allocator import FastKVCacheManager

BLOCK_SIZE, NUM_PREFIXES, LIVE, DECODE_STEPS, ALGO = 16, 8, 16, 32, "sha256"
PROMPT_LENGTHS = (128, 512, 2048, 8192, 32768)
TOKENS_PER_REPETITION = 1 << 19  # prompt tokens per side per repetition (at least 2 x LIVE requests)


def load_vllm():
    "vLLM's KV cache manager and what it needs, or the reason it cannot be imported."
    try:
        import torch, vllm
        from vllm import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.request import Request as VllmRequest
    except Exception as e:  # any import failure means: no vLLM here
        return None, f"{type(e).__name__}: {e}"
    hash_fn = get_hash_fn_by_name(ALGO)
    init_none_hash(hash_fn)  # PYTHONHASHSEED unset: the sha256 family's fixed seed, as kvref's default

    def manager(num_blocks: int):
        spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32)
        config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                               kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
        return VllmManager(config, max_model_len=1 << 20, scheduler_block_size=BLOCK_SIZE,
                           hash_block_size=BLOCK_SIZE, enable_caching=True)

    hasher, params = get_request_block_hasher(BLOCK_SIZE, hash_fn), SamplingParams(max_tokens=DECODE_STEPS + 1)
    request = lambda rid, prompt: VllmRequest(rid, prompt, params, None, block_hasher=hasher)
    bare_request = lambda rid, prompt: VllmRequest(rid, prompt, params, None)
    return dict(version=vllm.__version__, manager=manager, request=request, bare_request=bare_request), None


def prompts_of(prompt_len: int, num_requests: int, seed: int = 0) -> list[list[int]]:
    "Prompts of `prompt_len` tokens: the first half one of NUM_PREFIXES shared prefixes, the rest unique."
    rng, shared = random.Random(seed), prompt_len // 2
    prefixes = [[rng.randrange(32000) for _ in range(shared)] for _ in range(NUM_PREFIXES)]
    return [prefixes[i % NUM_PREFIXES] + [rng.randrange(32000) for _ in range(prompt_len - shared)]
            for i in range(num_requests)]


def pool_size(prompt_len: int) -> int:
    "Blocks in the pool: twice what the live requests hold at their longest, plus the null block."
    return 2 * LIVE * -(-(prompt_len + DECODE_STEPS) // BLOCK_SIZE) + 1


class KvrefSide:
    "kvref's manager driven through the workload."
    name = "kvref"
    def __init__(self, num_blocks: int): self.m = FastKVCacheManager(num_blocks, BLOCK_SIZE, hash_algo=ALGO)
    @staticmethod
    def request(rid: str, prompt: list[int]) -> Request: return Request(rid, prompt)
    def prehash(self, r: Request) -> None: self.m._block_hashes(r)
    def lookup(self, r): return self.m.get_computed_blocks(r)
    def allocate(self, r, n, num_hit=0, hits=None): return self.m.allocate_slots(r, n, num_hit, hits)
    def free(self, r): self.m.free(r)
    def block_ids(self, r) -> list[int]: return self.m.get_block_ids(r.request_id)
    def free_queue(self) -> list[int]: return self.m.get_free_queue_ids()


class VllmSide:
    "vLLM 0.33's own manager driven through the same workload, as its scheduler calls it."
    name = "vLLM"
    def __init__(self, v: dict, num_blocks: int): self.m, self.request = v["manager"](num_blocks), v["request"]
    def prehash(self, r) -> None: pass  # vLLM's Request hashes its prompt when it is built
    def lookup(self, r):
        blocks, num_hit, _ = self.m.get_computed_blocks(r)
        return blocks, num_hit
    def allocate(self, r, n, num_hit=0, hits=None): return self.m.allocate_slots(r, n, num_hit, hits if num_hit else None)
    def free(self, r): self.m.free(r)
    def block_ids(self, r) -> list[int]: return list(self.m.get_block_ids(r.request_id)[0])
    def free_queue(self) -> list[int]: return [b.block_id for b in self.m.block_pool.free_block_queue.get_all_free_blocks()]


def serve(side, prompts: list[list[int]], prebuilt: list | None = None, record: bool = False):
    "Run the serving loop; with `record`, return each request's (prefix-hit tokens, block ids) and the free queue."
    waiting, running, decisions = list(range(len(prompts)))[::-1], [], []
    while waiting or running:
        while waiting and len(running) < LIVE:
            i = waiting.pop()
            r = prebuilt[i] if prebuilt else side.request(f"r{i}", prompts[i])
            hits, num_hit = side.lookup(r)
            if side.allocate(r, r.num_tokens - num_hit, num_hit, hits) is None: raise RuntimeError("pool too small")
            r.num_computed_tokens = r.num_tokens
            running.append([r, 0, num_hit])
        for entry in list(running):
            r, steps, num_hit = entry
            if steps == DECODE_STEPS:
                if record: decisions.append((r.request_id, num_hit, side.block_ids(r)))
                side.free(r); running.remove(entry); continue
            r.append_output_token_ids(steps + 7)     # the token the model "sampled"
            if side.allocate(r, 1) is None: raise RuntimeError("pool too small")
            r.num_computed_tokens += 1
            entry[1] += 1
    return (decisions, side.free_queue()) if record else None


def timed_run(make_side, prompts: list[list[int]], hashing: bool) -> float:
    "CPU seconds of one serving run on a fresh manager; requests built (and hashed) inside the timing if `hashing`."
    side = make_side()
    prebuilt = None
    if not hashing:
        prebuilt = [side.request(f"r{i}", p) for i, p in enumerate(prompts)]
        for r in prebuilt: side.prehash(r)
    gc.collect()
    start = time.process_time()
    serve(side, prompts, prebuilt)
    return time.process_time() - start


def compare(v, prompt_len: int, num_requests: int, hashing: bool, repeats: int) -> dict:
    "Check both sides decide alike, then time them interleaved; per-request microseconds and ratios."
    prompts, num_blocks = prompts_of(prompt_len, num_requests), pool_size(prompt_len)
    sides = {"kvref": lambda: KvrefSide(num_blocks)}
    if v: sides["vLLM"] = lambda: VllmSide(v, num_blocks)
    if v:
        got = {name: serve(make(), prompts, record=True) for name, make in sides.items()}
        if got["kvref"] != got["vLLM"]:
            raise SystemExit(f"different decisions at {prompt_len}-token prompts")
    times = {name: [] for name in sides}
    for rep in range(repeats):
        for name in (list(sides) if rep % 2 == 0 else list(sides)[::-1]):
            times[name].append(timed_run(sides[name], prompts, hashing))
    out = {name: statistics.median(t) / num_requests * 1e6 for name, t in times.items()}
    if v: out["ratios"] = [k / w for k, w in zip(times["kvref"], times["vLLM"])]
    return out


def num_requests_for(prompt_len: int) -> int:
    return max(2 * LIVE, TOKENS_PER_REPETITION // prompt_len)


def profile(prompt_len: int, num_requests: int, hashing: bool, top: int = 14) -> str:
    "cProfile of one kvref serving run: the functions with the most time of their own."
    prompts, side = prompts_of(prompt_len, num_requests), KvrefSide(pool_size(prompt_len))
    prebuilt = None
    if not hashing:
        prebuilt = [side.request(f"r{i}", p) for i, p in enumerate(prompts)]
        for r in prebuilt: side.prehash(r)
    profiler = cProfile.Profile()
    profiler.runcall(serve, side, prompts, prebuilt)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()



def build_and_hash(v, prompt_len: int, num_requests: int, repeats: int) -> dict:
    "Microseconds per request to build it and to hash its prompt, each side, interleaved (medians, ratios)."
    from kvref.core.kv_cache_manager import update_block_hashes
    prompts, built = prompts_of(prompt_len, num_requests), []
    steps = {"kvref build": lambda i, p: built.append(Request(f"r{i}", p)),
             "kvref hash": lambda i, p: update_block_hashes(built[i], BLOCK_SIZE, ALGO)}
    if v: steps.update({"vLLM build": lambda i, p: v["bare_request"](f"r{i}", p),
                        "vLLM build+hash": lambda i, p: v["request"](f"r{i}", p)})
    times = {name: [] for name in steps}
    for rep in range(repeats):
        built.clear()
        for name in (list(steps) if rep % 2 == 0 else list(steps)[2:] + list(steps)[:2]):  # kvref: build, then hash
            gc.collect()
            start = time.process_time()
            for i, p in enumerate(prompts): steps[name](i, p)
            times[name].append((time.process_time() - start) / num_requests * 1e6)
    out = {name: statistics.median(t) for name, t in times.items()}
    if v: out["ratios"] = [(a + b) / c for a, b, c in zip(times["kvref build"], times["kvref hash"], times["vLLM build+hash"])]
    return out


def rss_bytes() -> int:
    "This process's resident set size (Linux)."
    with open("/proc/self/statm") as f: return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_child(name: str, num_blocks: int, blocks_per_request: int = 1000) -> None:
    "In a fresh process: print RSS growth per block for a pool of `num_blocks`, all cached and free."
    v, _ = load_vllm() if name == "vLLM" else (None, None)
    rng = random.Random(1)
    gc.collect()
    before = rss_bytes()
    side = VllmSide(v, num_blocks + 1) if v else KvrefSide(num_blocks + 1)
    gc.collect()
    empty = rss_bytes()
    for i in range(num_blocks // blocks_per_request):
        r = side.request(f"m{i}", [rng.randrange(256) for _ in range(blocks_per_request * BLOCK_SIZE)])
        side.allocate(r, r.num_tokens)
        side.free(r)
    del r
    gc.collect()
    if len(side.free_queue()) != num_blocks: raise SystemExit("not every block is free")
    print(before, empty, rss_bytes())


def memory(v, num_blocks: int, repeats: int) -> dict:
    "RSS growth per block (pool, then pool + cache) for each side, each run in a fresh process, order flipped."
    names = ["kvref"] + (["vLLM"] if v else [])
    runs = {name: [] for name in names}
    for rep in range(repeats):
        for name in (names if rep % 2 == 0 else names[::-1]):
            out = subprocess.run([sys.executable, __file__, "--memory-child", name, str(num_blocks)],
                                 capture_output=True, text=True, check=True).stdout
            before, empty, cached = map(int, out.split())
            runs[name].append(((empty - before) / num_blocks, (cached - before) / num_blocks))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true", help="cProfile kvref alone instead of comparing")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repetitions per case (default 7)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 repetitions, small memory pool")
    parser.add_argument("--build", action="store_true", help="time building and hashing a request alone, by step")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory measurement")
    parser.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child: return memory_child(args.memory_child[0], int(args.memory_child[1]))
    if args.profile:
        for prompt_len, n in ((512, 2000), (32768, 16)):
            for hashing in (True, False):
                print(f"## kvref alone, {n} x {prompt_len}-token prompts, hashing {'included' if hashing else 'excluded'}\n")
                print(profile(prompt_len, n, hashing))
        return
    if os.environ.get("PYTHONHASHSEED") is not None: raise SystemExit("unset PYTHONHASHSEED: it changes NONE_HASH")
    repeats = 2 if args.quick else args.repeats
    v, why = load_vllm()
    print(f"# Allocator: kvref vs vLLM {v['version'] if v else '(absent)'}\n")
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, load average "
          f"{os.getloadavg()[0]:.1f}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"{repeats} interleaved repetitions, CPU time\n")
    if v is None: print(f"vLLM is not importable here ({why}): kvref alone.\n")
    if args.build:
        print("| prompt tokens | requests | kvref build | kvref hash | vLLM build | vLLM build+hash | kvref / vLLM, both steps (range) |")
        print("|---:|---:|---:|---:|---:|---:|---|")
        for prompt_len in PROMPT_LENGTHS:
            n = num_requests_for(prompt_len) // (8 if args.quick else 2)
            out = build_and_hash(v, prompt_len, max(2 * LIVE, n), repeats)
            r = out.get("ratios", [float("nan")])
            print(f"| {prompt_len} | {max(2 * LIVE, n)} | {out['kvref build']:.0f} | {out['kvref hash']:.0f} | "
                  f"{out.get('vLLM build', float('nan')):.0f} | {out.get('vLLM build+hash', float('nan')):.0f} | "
                  f"{statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f}) |", flush=True)
        return
    print("| prompt tokens | requests | hashing | kvref us/request | vLLM us/request | kvref / vLLM median (range) |")
    print("|---:|---:|---|---:|---:|---|")
    cases = [(512, 2000, True), (512, 2000, False)] + [(n, num_requests_for(n), h) for n in PROMPT_LENGTHS
                                                        for h in (True, False)]
    for prompt_len, num_requests, hashing in cases:
        if args.quick: num_requests = max(2 * LIVE, num_requests // 8)
        out = compare(v, prompt_len, num_requests, hashing, repeats)
        ratio = ""
        if v: ratio = f"{statistics.median(out['ratios']):.2f} ({min(out['ratios']):.2f}-{max(out['ratios']):.2f})"
        print(f"| {prompt_len} | {num_requests} | {'included' if hashing else 'excluded'} | {out['kvref']:.0f} | "
              f"{out['vLLM']:.0f} | {ratio} |" if v else f"| {prompt_len} | {num_requests} | "
              f"{'included' if hashing else 'excluded'} | {out['kvref']:.0f} | | |", flush=True)
    if args.no_memory: return
    num_blocks = 100_000 if args.quick else 1_000_000
    print(f"\n## Memory: RSS growth per block, {num_blocks:,} blocks all cached and free, fresh process per run\n")
    print("| side | bytes per block: pool alone (median) | pool + cache (median, range) |")
    print("|---|---:|---|")
    runs = memory(v, num_blocks, 3 if not args.quick else 1)
    for name, rows in runs.items():
        cached = [c for _, c in rows]
        print(f"| {name} | {statistics.median(p for p, _ in rows):.0f} | {statistics.median(cached):.0f} "
              f"({min(cached):.0f}-{max(cached):.0f}) |")
    if v: print(f"\nkvref / vLLM, cached: {statistics.median(c for _, c in runs['kvref']) / statistics.median(c for _, c in runs['vLLM']):.2f}")


if __name__ == "__main__":
    main()
