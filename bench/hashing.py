"""Block hashing speed: ns per token of `kvref.hashing.hash_request_tokens` for every algorithm, block sizes 16 and
64, with and without extra keys, beside two references; and the per-call cost of a decode step.

Run: `.venv/bin/python bench/hashing.py [--tokens N] [--repeats R]`. Prints markdown tables (medians and bests).

References, timed on the same tokens in the same process:
- `vllm-style loop`: the structure of vLLM 0.33's request block hasher (`get_request_block_hasher`): per block,
  `generate_block_hash_extra_keys`, a list slice of the token ids, then `hash_block_tokens` (tuple + hash).
- `plain loop`: pickle (protocol 5) or canonical CBOR, then the digest, one block at a time, no checks, no keys.
"""
from __future__ import annotations
import argparse, datetime, hashlib, pickle, platform, random, statistics, time

import cbor2

from kvref.hashing import (LoRARequest, MultiModalItem, generate_block_hash_extra_keys, get_hash_fn_by_name,
                           hash_block_tokens, hash_request_tokens, init_none_hash)

ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor", "builtin")


def timed(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def vllm_style(tokens, block_size, algo, extra):
    "vLLM 0.33's request hasher loop, transcribed (per-block key generation and slicing)."
    hash_fn, none_hash = get_hash_fn_by_name(algo), init_none_hash(algo, "vllm-none-hash")
    def run():
        parent, hashes = None, []
        for start in range(0, len(tokens) - block_size + 1, block_size):
            keys = generate_block_hash_extra_keys(start, start + block_size, **extra)
            parent = hash_block_tokens(hash_fn, parent, tokens[start:start + block_size], keys, none_hash)
            hashes.append(parent)
        return hashes
    return run


def plain_loop(tokens, block_size, algo):
    "Serialize and digest each block, nothing else."
    dumps = (lambda obj: pickle.dumps(obj, protocol=5)) if "cbor" not in algo else (lambda obj: cbor2.dumps(obj, canonical=True))
    if algo.startswith("sha256"): digest = lambda data: hashlib.sha256(data).digest()
    else:
        import xxhash
        digest = xxhash.xxh3_128_digest
    def run():
        parent, hashes = b"\0" * 32, []
        for start in range(0, len(tokens) - block_size + 1, block_size):
            parent = digest(dumps((parent, tuple(tokens[start:start + block_size]), None)))
            hashes.append(parent)
        return hashes
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1 << 20, help="tokens per request (default 1,048,576)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(0)
    tokens = [rng.randrange(200_000) for _ in range(args.tokens)]
    extras = {
        "none": {},
        "lora+salt": dict(lora=LoRARequest("sql", "/adapters/sql-v2"), cache_salt="tenant-a"),
        "lora+salt+mm": dict(lora=LoRARequest("sql", "/adapters/sql-v2"), cache_salt="tenant-a",
                             mm_items=[MultiModalItem(f"img{i}", i * 4096 + 100, 576) for i in range(args.tokens // 4096)]),
    }
    n = args.tokens
    print(f"# kvref block hashing, {n:,} tokens, median (best) of {args.repeats}, ns/token")
    print(f"\n{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC\n")
    print("| algo | block size | extra keys | kvref | vllm-style loop | plain loop | vllm-style / kvref |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for algo in ALGOS:
        for block_size in (16, 64):
            for name, extra in extras.items():
                kvref_t = timed(lambda: hash_request_tokens(tokens, block_size, algo, seed="s", **extra), args.repeats)
                ref_extra = dict(extra)
                if "mm_items" in ref_extra: ref_extra["mm_items"] = sorted(ref_extra["mm_items"], key=lambda m: m.offset)
                vllm_t = timed(vllm_style(tokens, block_size, algo, ref_extra), args.repeats)
                plain = "" if name != "none" or algo == "builtin" else \
                    fmt(timed(plain_loop(tokens, block_size, algo), args.repeats), n)
                ratio = statistics.median(vllm_t) / statistics.median(kvref_t)
                print(f"| {algo} | {block_size} | {name} | {fmt(kvref_t, n)} | {fmt(vllm_t, n)} | {plain} | {ratio:.2f} |")

    print("\n## Decode steps (block size 16, sha256, 4k-token request, LoRA + salt), µs per call\n")
    print("| step | kvref |")
    print("|---|---:|")
    req = dict(lora=LoRARequest("sql", "/adapters/sql-v2"), cache_salt="tenant-a")
    prompt = tokens[:4096]
    known = hash_request_tokens(prompt, 16, **req)
    steps = 20_000
    grow = prompt + [7]
    t = timed(lambda: [hash_request_tokens(grow, 16, known_hashes=known, **req) for _ in range(steps)], args.repeats)
    print(f"| one token appended, no block completed | {statistics.median(t) / steps * 1e6:.2f} |")
    full = prompt + [7] * 16
    t = timed(lambda: [hash_request_tokens(full, 16, known_hashes=known, **req) for _ in range(steps)], args.repeats)
    print(f"| one token appended, one block completed | {statistics.median(t) / steps * 1e6:.2f} |")
    t = timed(lambda: [hash_request_tokens(prompt, 16, **req) for _ in range(20)], args.repeats)
    print(f"| whole 4k prompt from scratch | {statistics.median(t) / 20 * 1e6:.0f} |")


def fmt(times: list[float], n: int) -> str:
    return f"{statistics.median(times) / n * 1e9:.0f} ({min(times) / n * 1e9:.0f})"


if __name__ == "__main__":
    main()
