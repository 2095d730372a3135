"""Hybrid allocator benchmark (issue 16): kvref's `HybridKVCacheManager` beside vLLM 0.33's own `KVCacheManager`
(`vllm/v1/core/kv_cache_manager.py` at v0.33.0, its `HybridKVCacheCoordinator`, on the CPU), in one process, on the
shared-prefix serving workload, for a single-group layout, a gpt-oss-like one (sliding 128 + full, 2 groups) and a
Gemma-3-like one (6 x sliding 512 + full, 7 groups). kvref's single-group `KVCacheManager` is timed too, as a
reference row. Prints markdown tables.

Run where both import, e.g. `PYTHONPATH=$PWD /work/venv-vllm/bin/python bench/hybrid.py`; where vLLM is not
importable the script says why and times kvref alone.

vLLM's side gets its KV cache groups from vLLM's own planner: a per-layer spec dict shaped like the model (26
layers, every 6th full, for Gemma-3-like; 24 alternating sliding/full layers for gpt-oss-like; 24 full layers for
the single group) goes through `unify_kv_cache_spec_page_size` and `_get_kv_cache_groups_uniform_page_size`
(`vllm/v1/core/kv_cache_planning.py` at v0.33.0, what `get_kv_cache_groups` does for these specs), and the script
checks that the groups it returns are the layout kvref is given, in the same order.

The workload: 8 shared prefixes of 256 tokens, each request's prompt one of them (round robin) plus 256 unique
tokens; 16 live at a time, each prefilled in one step (`get_computed_blocks`, then one `allocate_slots` with the
hit), then 32 decode steps (append one token, `allocate_slots(request, 1)`), then freed. Block size 16, sha256
block hashes, a pool of 40000 blocks, dense retention (`prefix_cache_retention_interval=None`) unless
`--retention 0` (vLLM's serving default: junction and replay-boundary checkpoints only). Requests are built (and
their prompts hashed) inside the timed loop on both sides. Before timing, one untimed run of each side records,
for every request, its prefix hit, the shared-prefix boundary, its block table per group after prefill and after
its last decode step, and the final free queue; the two must be equal (the script prints the first difference and
exits 1 otherwise). Then interleaved repetitions, the order flipped every repetition, CPU time
(`time.process_time`). Reported: each side's microseconds per request (medians) and the ratio kvref / vLLM per
repetition, median and range (below 1: kvref is faster).
"""
from __future__ import annotations
import argparse, gc, platform, random, statistics, sys, time

from kvref.core.hybrid import FullAttentionSpec, HybridKVCacheManager, HybridRequest, SlidingWindowSpec
from kvref.core.kv_cache_manager import Request
from kvref.core.fast_allocator import FastKVCacheManager as KVCacheManager

BLOCK_SIZE, NUM_BLOCKS, MAX_MODEL_LEN, ALGO = 16, 40000, 65536, "sha256"
PROMPT_LEN, SHARED_LEN, NUM_PREFIXES, LIVE, DECODE_STEPS = 512, 256, 8, 16, 32

# name: (kvref's group specs in group order, the per-layer kinds vLLM's planner groups: "full" or a window)
LAYOUTS = {
    "single group (full)": ([FullAttentionSpec(BLOCK_SIZE)], ["full"] * 24),
    "gpt-oss-like (sliding 128 + full)": ([SlidingWindowSpec(BLOCK_SIZE, 128), FullAttentionSpec(BLOCK_SIZE)],
                                          [128, "full"] * 12),
    "Gemma-3-like (6 x sliding 512 + full)": ([SlidingWindowSpec(BLOCK_SIZE, 512)] * 6 + [FullAttentionSpec(BLOCK_SIZE)],
                                              [512, 512, 512, 512, 512, "full"] * 4 + [512, 512]),
}


def load_vllm():
    "vLLM's KV cache manager factory and request factory, or the reason it cannot be imported."
    try:
        import torch, vllm
        from vllm import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager
        from vllm.v1.core.kv_cache_planning import (_get_kv_cache_groups_uniform_page_size,
                                                    unify_kv_cache_spec_page_size)
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import FullAttentionSpec as VFull, KVCacheConfig, SlidingWindowSpec as VSliding
        from vllm.v1.request import Request as VllmRequest
    except Exception as e:  # any import failure means: no vLLM here
        return None, f"{type(e).__name__}: {e}"
    hash_fn = get_hash_fn_by_name(ALGO)
    init_none_hash(hash_fn)  # PYTHONHASHSEED unset: the sha256 family's fixed seed, as kvref's default

    def layer_spec(kind):
        common = dict(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32)
        return VFull(**common) if kind == "full" else VSliding(**common, sliding_window=kind)

    def groups(layer_kinds):
        "vLLM's KV cache groups for the per-layer kinds, as its planner builds them."
        specs = unify_kv_cache_spec_page_size({f"layers.{i}": layer_spec(k) for i, k in enumerate(layer_kinds)})
        return _get_kv_cache_groups_uniform_page_size(specs)

    def manager(kv_cache_groups, retention):
        config = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=kv_cache_groups,
                               prefix_cache_retention_interval=retention)
        return VllmManager(config, max_model_len=MAX_MODEL_LEN, scheduler_block_size=BLOCK_SIZE,
                           hash_block_size=BLOCK_SIZE, enable_caching=True)

    hasher, params = get_request_block_hasher(BLOCK_SIZE, hash_fn), SamplingParams(max_tokens=DECODE_STEPS + 1)
    request = lambda rid, prompt: VllmRequest(rid, prompt, params, None, block_hasher=hasher)
    return dict(version=vllm.__version__, groups=groups, manager=manager, request=request), None


def group_layout(kv_cache_groups) -> list[tuple[str, int | None]]:
    "vLLM groups as (kind, window) in group order, to compare with kvref's specs."
    return [(type(g.kv_cache_spec).__name__, getattr(g.kv_cache_spec, "sliding_window", None)) for g in kv_cache_groups]


def spec_layout(specs) -> list[tuple[str, int | None]]:
    "kvref specs as (kind, window) in group order."
    return [(type(s).__name__, getattr(s, "sliding_window", None)) for s in specs]


class KvrefSide:
    "kvref's HybridKVCacheManager (or, with `single`, the single-group KVCacheManager) driven through the workload."
    def __init__(self, specs, retention, single: bool = False):
        self.m = (KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, hash_algo=ALGO, max_model_len=MAX_MODEL_LEN) if single else
                  HybridKVCacheManager(specs, NUM_BLOCKS, hash_algo=ALGO, max_model_len=MAX_MODEL_LEN,
                                       retention_interval=retention))
        self.single = single
    def request(self, rid, prompt): return Request(rid, prompt) if self.single else HybridRequest(rid, prompt)
    def lookup(self, r):
        if self.single: return (*self.m.get_computed_blocks(r), 0)
        return self.m.get_computed_blocks(r)
    def allocate(self, r, n, num_hit=0, hits=None): return self.m.allocate_slots(r, n, num_hit, hits)
    def free(self, r): self.m.free(r)
    def block_ids(self, r): return [self.m.get_block_ids(r.request_id)] if self.single else self.m.get_block_ids(r.request_id)
    def free_queue(self): return self.m.get_free_queue_ids()


class VllmSide:
    "vLLM 0.33's own KVCacheManager driven through the same workload, as its scheduler calls it."
    def __init__(self, v, kv_cache_groups, retention): self.m, self.request = v["manager"](kv_cache_groups, retention), v["request"]
    def lookup(self, r): return self.m.get_computed_blocks(r)
    def allocate(self, r, n, num_hit=0, hits=None): return self.m.allocate_slots(r, n, num_hit, hits if num_hit else None)
    def free(self, r): self.m.free(r)
    def block_ids(self, r): return [list(ids) for ids in self.m.get_block_ids(r.request_id)]
    def free_queue(self): return [b.block_id for b in self.m.block_pool.free_block_queue.get_all_free_blocks()]


def prompts_of(num_requests: int, seed: int = 0) -> list[list[int]]:
    "Prompts of PROMPT_LEN tokens: the first SHARED_LEN one of NUM_PREFIXES shared prefixes, the rest unique."
    rng = random.Random(seed)
    prefixes = [[rng.randrange(32000) for _ in range(SHARED_LEN)] for _ in range(NUM_PREFIXES)]
    return [prefixes[i % NUM_PREFIXES] + [rng.randrange(32000) for _ in range(PROMPT_LEN - SHARED_LEN)]
            for i in range(num_requests)]


def serve(side, prompts, record: bool = False):
    "Run the serving loop; with `record`, every request's decisions (see the module docstring) and the free queue."
    waiting, running, decisions = list(range(len(prompts)))[::-1], [], []
    while waiting or running:
        while waiting and len(running) < LIVE:
            i = waiting.pop()
            r = side.request(f"r{i}", prompts[i])
            hits, num_hit, r.shared_prefix_boundary = side.lookup(r)  # as vLLM's scheduler does
            if side.allocate(r, r.num_tokens - num_hit, num_hit, hits) is None: raise RuntimeError("pool too small")
            r.num_computed_tokens = r.num_tokens
            if record: decisions += [(r.request_id, "hit", num_hit), (r.request_id, "boundary", r.shared_prefix_boundary),
                                     (r.request_id, "prefill", side.block_ids(r))]
            running.append([r, 0])
        for entry in list(running):
            r, steps = entry
            if steps == DECODE_STEPS:
                if record: decisions.append((r.request_id, "last", side.block_ids(r)))
                side.free(r); running.remove(entry); continue
            r.append_output_token_ids(steps + 7)     # the token the model "sampled"
            if side.allocate(r, 1) is None: raise RuntimeError("pool too small")
            r.num_computed_tokens += 1
            entry[1] += 1
    return (decisions, side.free_queue()) if record else None


def first_difference(ours, theirs) -> str | None:
    "Where kvref's recorded decisions first differ from vLLM's (in the order they were made), in words; None if equal."
    (d1, q1), (d2, q2) = ours, theirs
    for (rid, key, a), (_, _, b) in zip(d1, d2):
        if a == b: continue
        if key in ("prefill", "last"):
            g = next(g for g in range(len(b)) if a[g] != b[g])
            return f"request {rid}, block table of group {g} after {key}: kvref {a[g]}, vLLM {b[g]}"
        return f"request {rid}, {key}: kvref {a}, vLLM {b}"
    if q1 != q2: return f"final free queue: kvref {q1[:10]}..., vLLM {q2[:10]}... ({len(q1)} vs {len(q2)} blocks)"
    return None


def timed_run(make_side, prompts) -> float:
    "CPU seconds of one serving run on a fresh manager (built outside the timing)."
    side = make_side()
    gc.collect()
    start = time.process_time()
    serve(side, prompts)
    return time.process_time() - start


def compare(v, name, prompts, retention, repeats) -> dict:
    "Check both sides decide alike on one layout, then time them interleaved; µs per request, ratios, hit tokens."
    specs, layer_kinds = LAYOUTS[name]
    sides = {"kvref": lambda: KvrefSide(specs, retention)}
    if v:
        kv_cache_groups = v["groups"](layer_kinds)
        if group_layout(kv_cache_groups) != spec_layout(specs):
            sys.exit(f"{name}: vLLM's planner gives groups {group_layout(kv_cache_groups)}, kvref has {spec_layout(specs)}")
        sides["vLLM"] = lambda: VllmSide(v, kv_cache_groups, retention)
    recorded = {side: serve(make(), prompts, record=True) for side, make in sides.items()}
    hit_tokens = sum(value for _, key, value in recorded["kvref"][0] if key == "hit")
    if v and (diff := first_difference(recorded["kvref"], recorded["vLLM"])):
        sys.exit(f"{name}: kvref and vLLM decide differently: {diff}")
    times = {side: [] for side in sides}
    for rep in range(repeats):
        for side in (list(sides) if rep % 2 == 0 else list(sides)[::-1]):
            times[side].append(timed_run(sides[side], prompts))
    out = {side: statistics.median(t) / len(prompts) * 1e6 for side, t in times.items()}
    out["hit_tokens"], out["groups"] = hit_tokens, len(specs)
    if v: out["ratios"] = [k / w for k, w in zip(times["kvref"], times["vLLM"])]
    return out


def main(quick: bool = False, retention: int | None = None):
    n, repeats = (150, 4) if quick else (600, 6)
    v, why = load_vllm()
    prompts = prompts_of(n)
    print(f"Shared-prefix serving workload: {n} requests of {PROMPT_LEN} tokens ({SHARED_LEN} shared, {NUM_PREFIXES} "
          f"prefixes), {DECODE_STEPS} decode steps, {LIVE} live, block {BLOCK_SIZE}, {ALGO}, retention "
          f"{'dense (None)' if retention is None else retention}; {repeats} interleaved repetitions (order flipped "
          f"each), CPU time, medians. Python {platform.python_version()}, "
          + (f"vLLM {v['version']}." if v else f"vLLM not importable here ({why}): kvref alone."))
    if v: print("Decisions checked equal on every layout: per request the prefix hit, shared-prefix boundary, "
                "block table per group after prefill and after the last decode step; the final free queue.")
    print()
    single = [timed_run(lambda: KvrefSide(None, retention, single=True), prompts) for _ in range(repeats)]
    results = {name: compare(v, name, prompts, retention, repeats) for name in LAYOUTS}
    if v:
        print("| layout | groups | kvref µs/request | vLLM µs/request | kvref / vLLM median | range | prefix-hit tokens |")
        print("|---|---|---|---|---|---|---|")
    else:
        print("| layout | groups | kvref µs/request | prefix-hit tokens |")
        print("|---|---|---|---|")
    print(f"| kvref KVCacheManager (single group) | 1 | {statistics.median(single) / n * 1e6:.0f} |"
          + (" | | | |" if v else " |"))
    for name, r in results.items():
        row = f"| {name} | {r['groups']} | {r['kvref']:.0f} |"
        if v: row += f" {r['vLLM']:.0f} | {statistics.median(r['ratios']):.2f} | {min(r['ratios']):.2f}-{max(r['ratios']):.2f} |"
        print(row + f" {r['hit_tokens']} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and repetitions")
    parser.add_argument("--retention", type=int, default=None,
                        help="prefix_cache_retention_interval on both sides (default: dense, None; vLLM serves with 0)")
    args = parser.parse_args()
    main(args.quick, args.retention)
