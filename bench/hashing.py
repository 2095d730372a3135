"""Block hashing speed: ns per token of `kvref.hashing.hash_request_tokens` for every algorithm, block sizes 16 and
64, with and without extra keys, beside two references; and the per-call cost of a decode step.

Run: `.venv/bin/python bench/hashing.py [--requests N] [--request-tokens T] [--repeats R]`. Default: 16 requests of
65,536 tokens (1,048,576 tokens per timing, the request size of the issue's vLLM figure). Prints markdown tables
(median and best of R timings, ns per token).

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


def vllm_style(requests, block_size, algo, extra):
    "vLLM 0.33's request hasher loop, transcribed (per-block key generation and slicing), over every request."
    hash_fn, none_hash = get_hash_fn_by_name(algo), init_none_hash(algo, "vllm-none-hash")
    def run():
        for tokens in requests:
            parent, hashes = None, []
            for start in range(0, len(tokens) - block_size + 1, block_size):
                keys = generate_block_hash_extra_keys(start, start + block_size, **extra)
                parent = hash_block_tokens(hash_fn, parent, tokens[start:start + block_size], keys, none_hash)
                hashes.append(parent)
    return run


def plain_loop(requests, block_size, algo):
    "Serialize and digest each block, nothing else."
    dumps = (lambda obj: pickle.dumps(obj, protocol=5)) if "cbor" not in algo else (lambda obj: cbor2.dumps(obj, canonical=True))
    if algo.startswith("sha256"): digest = lambda data: hashlib.sha256(data).digest()
    else:
        import xxhash
        digest = xxhash.xxh3_128_digest
    def run():
        for tokens in requests:
            parent, hashes = b"\0" * 32, []
            for start in range(0, len(tokens) - block_size + 1, block_size):
                parent = digest(dumps((parent, tuple(tokens[start:start + block_size]), None)))
                hashes.append(parent)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--request-tokens", type=int, default=1 << 16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(0)
    size = args.request_tokens
    requests = [[rng.randrange(200_000) for _ in range(size)] for _ in range(args.requests)]
    n = size * args.requests
    images = [MultiModalItem(f"img{i}", i * 4096 + 100, 576) for i in range(size // 4096)]
    extras = {
        "none": {},
        "lora+salt": dict(lora=LoRARequest("sql", "/adapters/sql-v2"), cache_salt="tenant-a"),
        "lora+salt+mm": dict(lora=LoRARequest("sql", "/adapters/sql-v2"), cache_salt="tenant-a", mm_items=images),
    }
    print(f"# kvref block hashing: {args.requests} requests x {size:,} tokens = {n:,} tokens, "
          f"median (best) of {args.repeats}, ns/token")
    print(f"\n{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC\n")
    print("| algo | block size | extra keys | kvref | vllm-style loop | plain loop | vllm-style / kvref |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for algo in ALGOS:
        for block_size in (16, 64):
            for name, extra in extras.items():
                kvref_t = timed(lambda: [hash_request_tokens(t, block_size, algo, seed="s", **extra) for t in requests],
                                args.repeats)
                vllm_t = timed(vllm_style(requests, block_size, algo, extra), args.repeats)
                plain = "" if name != "none" or algo == "builtin" else \
                    fmt(timed(plain_loop(requests, block_size, algo), args.repeats), n)
                ratio = statistics.median(vllm_t) / statistics.median(kvref_t)
                print(f"| {algo} | {block_size} | {name} | {fmt(kvref_t, n)} | {fmt(vllm_t, n)} | {plain} | {ratio:.2f} |",
                      flush=True)

    print("\n## Decode steps (block size 16, sha256, 4k-token request, LoRA + salt), µs per call\n")
    print("| step | kvref |")
    print("|---|---:|")
    req = dict(lora=LoRARequest("sql", "/adapters/sql-v2"), cache_salt="tenant-a")
    prompt = requests[0][:4096]
    known = hash_request_tokens(prompt, 16, **req)
    steps = 20_000

    def per_call(tokens, known_hashes, calls):  # results dropped at once: keeping 20k lists would time the GC
        def run():
            for _ in range(calls): hash_request_tokens(tokens, 16, known_hashes=known_hashes, **req)
        return statistics.median(timed(run, args.repeats)) / calls * 1e6
    print(f"| one token appended, no block completed | {per_call(prompt + [7], known, steps):.2f} |")
    print(f"| one token appended, one block completed | {per_call(prompt + [7] * 16, known, steps):.2f} |")
    print(f"| whole 4k prompt from scratch | {per_call(prompt, (), 20):.0f} |")

def fmt(times: list[float], n: int) -> str:
    return f"{statistics.median(times) / n * 1e9:.0f} ({min(times) / n * 1e9:.0f})"


if __name__ == "__main__":
    main()
