"""Request hashing, kvref against vLLM 0.33 itself: `kvref.core.hashing.hash_request_tokens` beside vLLM's own request
block hasher (`get_request_block_hasher` in `vllm/v1/core/kv_cache_utils.py`), in one process.

Run where both import, e.g. `PYTHONPATH=. /work/venv-vllm/bin/python bench/hashing.py` (a venv with torch and
`pip install --no-deps vllm==0.33.0` plus the pure-Python packages its core imports; CPU only is enough). Where vLLM
is not importable the script says why and times kvref alone.

For every algorithm (sha256, sha256_cbor), block size (16, 64), prompt length (1k, 64k tokens) and set of extra keys
(none; LoRA + salt; LoRA + salt + a 576-token image every 4096 tokens) it first checks that both give the same block
hashes for every prompt, then times them in interleaved repetitions, the order flipped every repetition, CPU time
(`time.process_time`, garbage collector off). Each repetition hashes about 128k tokens per side (128 prompts of 1k,
or 2 of 64k), every prompt from scratch. Reported: kvref's and vLLM's ns per token (medians) and the ratio
kvref / vLLM per repetition, median and range (below 1: kvref is faster).

Then the release profiles (`kvref.oracle.releases`): the same prompts hashed with `release_block_hashes` under every profile
that offers the algorithm (`builtin` too, for the profiles up to 0.10.1, against 0.33's `sha256`), the profiles timed
interleaved in a rotating order within each repetition, `PYTHONHASHSEED=0` given to every profile. Reported: the
0.33 path's ns per token and, per profile, profile / 0.33 per repetition, median (above 1: slower than the 0.33 path).
`--profiles-only` prints the profile table alone; `--profile-algos builtin` keeps only its `builtin` rows.
"""
from __future__ import annotations
import argparse, datetime, gc, os, platform, random, statistics, time

from kvref.core.hashing import LoRARequest, MultiModalItem
from kvref.core.fast_hashing import hash_request_tokens
from kvref.oracle.releases import PROFILES, release_block_hashes

ALGOS = ("sha256", "sha256_cbor")
PROFILE_ALGOS = ("sha256", "sha256_cbor", "builtin")
BLOCK_SIZES = (16, 64)
PROMPT_TOKENS = (1024, 65536)
TOKENS_PER_REPETITION = 1 << 17
IMAGE_EVERY, IMAGE_TOKENS = 4096, 576
SALT, LORA = "tenant-a", ("sql", "/adapters/sql-v2")


def load_vllm():
    "vLLM's request block hasher and what it needs, or the reason it cannot be imported."
    try:
        from vllm import SamplingParams
        from vllm.lora.request import LoRARequest as VllmLoRA
        from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.request import Request
        import vllm
    except Exception as e:  # any import failure means: no vLLM here
        return None, f"{type(e).__name__}: {e}"
    return dict(version=vllm.__version__, SamplingParams=SamplingParams, LoRA=VllmLoRA, Feature=MultiModalFeatureSpec,
                Range=PlaceholderRange, hash_fn=get_hash_fn_by_name, utils=kv_cache_utils, Request=Request), None


def kvref_side(prompts, block_size, algo, extra):
    "A function hashing every prompt with kvref, and kvref's hashes (for the equality check)."
    kwargs = dict(cache_salt=SALT if extra else None, lora=LoRARequest(*LORA) if extra else None, seed="vllm-none-hash")
    images = [images_of(len(p)) if extra == "lora+salt+mm" else [] for p in prompts]
    run = lambda: [hash_request_tokens(p, block_size, algo, mm_items=m, **kwargs) for p, m in zip(prompts, images)]
    return run, run()


def vllm_side(v, prompts, block_size, algo, extra):
    "A function hashing every prompt with vLLM 0.33's request block hasher, and vLLM's hashes."
    hash_fn = v["hash_fn"](algo)
    v["utils"].init_none_hash(hash_fn)  # PYTHONHASHSEED unset: the sha256 family's fixed seed, as kvref's seed= above
    lora = v["LoRA"](lora_name=LORA[0], lora_int_id=1, lora_path=LORA[1]) if extra else None
    requests = []
    for i, prompt in enumerate(prompts):
        features = [v["Feature"](data=None, modality="image", identifier=m.identifier,
                                 mm_position=v["Range"](offset=m.offset, length=m.length))
                    for m in (images_of(len(prompt)) if extra == "lora+salt+mm" else [])]
        requests.append(v["Request"](f"r{i}", prompt, v["SamplingParams"](max_tokens=1), None, mm_features=features,
                                     lora_request=lora, cache_salt=SALT if extra else None))
    hasher = v["utils"].get_request_block_hasher(block_size, hash_fn)
    run = lambda: [hasher(r) for r in requests]  # from scratch: each request's block_hashes stays empty
    return run, [[bytes(h) for h in hashes] for hashes in run()]


def images_of(num_tokens: int) -> list[MultiModalItem]:
    return [MultiModalItem(f"img-{k}", offset, IMAGE_TOKENS)
            for k, offset in enumerate(range(100, num_tokens - IMAGE_TOKENS + 1, IMAGE_EVERY))]


def cpu_seconds(fn) -> float:
    gc.disable()
    try:
        start = time.process_time()
        fn()
        return time.process_time() - start
    finally:
        gc.enable()


def profile_side(profile, prompts, block_size, algo, extra):
    "A function hashing every prompt with `release_block_hashes` under `profile` (salt only where it has one)."
    kwargs = dict(pythonhashseed="0", lora=LoRARequest(*LORA) if extra else None, lora_int_id=1,
                  cache_salt=SALT if extra and profile.cache_salt else None)
    images = [images_of(len(p)) if extra == "lora+salt+mm" else [] for p in prompts]
    return lambda: [release_block_hashes(profile, p, block_size, algo, mm_items=m, **kwargs) for p, m in zip(prompts, images)]


def profile_table(repeats: int, rng: random.Random, args) -> None:
    "A column per release profile: its time over the 0.33 path's, per repetition, median."
    names = list(PROFILES)
    print("\n| algo | block size | prompt tokens | extra keys | 0.33 ns/token | "
          + " | ".join(n.removeprefix("vllm_") for n in names) + " |")
    print("|---|---:|---:|---|---:|" + "---:|" * len(names))
    for algo in PROFILE_ALGOS:
        for block_size in args.block_sizes:
            for num_tokens in args.prompt_tokens:
                prompts = [[rng.randrange(200_000) for _ in range(num_tokens)]
                           for _ in range(TOKENS_PER_REPETITION // num_tokens)]
                if algo not in args.profile_algos: continue  # the prompts are drawn all the same: every row keeps its prompts
                for extra in ("", "lora+salt", "lora+salt+mm"):
                    if algo == "builtin" and not extra: continue  # hash(None): not reproducible, refused
                    base = profile_side(PROFILES["vllm_0_33"], prompts, block_size, "sha256" if algo == "builtin" else algo, extra)
                    sides = {n: profile_side(p, prompts, block_size, algo, extra) for n, p in PROFILES.items() if algo in p.hash_algos}
                    sides["base"] = base
                    order, times = list(sides), {n: [] for n in sides}
                    for r in range(repeats):
                        for n in order[r % len(order):] + order[:r % len(order)]: times[n].append(cpu_seconds(sides[n]))
                    cells = [f"{statistics.median(t / b for t, b in zip(times[n], times['base'])):.2f}" if n in times else "-"
                             for n in names]
                    ns = statistics.median(times["base"]) / (len(prompts) * num_tokens) * 1e9
                    print(f"| {algo} | {block_size} | {num_tokens} | {extra or 'none'} | {ns:.0f} | " + " | ".join(cells) + " |",
                          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="interleaved repetitions per case (default 9)")
    parser.add_argument("--profiles-only", action="store_true", help="only the table of release profiles")
    parser.add_argument("--profile-algos", nargs="+", choices=PROFILE_ALGOS, default=PROFILE_ALGOS,
                        help="the algorithms of the profile table's rows (default: all)")
    parser.add_argument("--algos", nargs="+", default=ALGOS, help="only these algorithms (default: sha256 sha256_cbor)")
    parser.add_argument("--block-sizes", nargs="+", type=int, default=BLOCK_SIZES, help="only these block sizes")
    parser.add_argument("--prompt-tokens", nargs="+", type=int, default=PROMPT_TOKENS, help="only these prompt lengths")
    args = parser.parse_args()
    if os.environ.get("PYTHONHASHSEED") is not None: raise SystemExit("unset PYTHONHASHSEED: it changes NONE_HASH")
    rng = random.Random(0)
    if args.profiles_only: return profile_table(args.repeats, rng, args)
    v, why = load_vllm()
    print(f"# Request hashing: kvref vs vLLM {v['version'] if v else '(absent)'}\n")
    print(f"{platform.machine()}, Python {platform.python_version()}, load average "
          f"{os.getloadavg()[0]:.1f}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"{args.repeats} interleaved repetitions, CPU time\n")
    if v is None: print(f"vLLM is not importable here ({why}): kvref alone.\n")
    print("| algo | block size | prompt tokens | extra keys | kvref ns/token | vLLM ns/token | kvref / vLLM median (range) |")
    print("|---|---:|---:|---|---:|---:|---|")
    for algo in args.algos:
        for block_size in args.block_sizes:
            for num_tokens in args.prompt_tokens:
                prompts = [[rng.randrange(200_000) for _ in range(num_tokens)]
                           for _ in range(TOKENS_PER_REPETITION // num_tokens)]
                for extra in ("", "lora+salt", "lora+salt+mm"):
                    sides = {"kvref": kvref_side(prompts, block_size, algo, extra)}
                    if v: sides["vLLM"] = vllm_side(v, prompts, block_size, algo, extra)
                    if v and sides["kvref"][1] != sides["vLLM"][1]:
                        raise SystemExit(f"different hashes: {algo}, block size {block_size}, {extra or 'no extra keys'}")
                    times = {name: [] for name in sides}
                    for r in range(args.repeats):
                        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                            times[name].append(cpu_seconds(sides[name][0]))
                    total = len(prompts) * num_tokens
                    ns = {name: f"{statistics.median(t) / total * 1e9:.0f}" for name, t in times.items()}
                    ratio = ""
                    if v:
                        ratios = [k / w for k, w in zip(times["kvref"], times["vLLM"])]
                        ratio = f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
                    print(f"| {algo} | {block_size} | {num_tokens} | {extra or 'none'} | {ns['kvref']} | "
                          f"{ns.get('vLLM', '')} | {ratio} |", flush=True)
    profile_table(args.repeats, rng, args)


if __name__ == "__main__":
    main()
