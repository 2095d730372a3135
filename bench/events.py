"""KV events: events encoded per second, kvref against vLLM's own encoder in the same process, and KVIndex lookups
per second at 100 engines x 100k cached blocks.

Run: `.venv/bin/python bench/events.py [--engines N] [--blocks B] [--repeats R] [--part all|encode|index]`.
The encoding part needs vLLM 0.33.0 importable for its vLLM columns: when it is not and /work/venv-vllm/READY exists,
it re-runs itself there (`/work/venv-vllm/bin/python` with this checkout on PYTHONPATH), so both encoders share one
process. msgspec columns are skipped without msgspec.

Encoding, on two workloads (every recorded event of golden/events, int hashes; and 1000 synthetic engine steps, each
one pool BlockStored of 32 blocks of 16 tokens plus one pool BlockRemoved of 8 blocks, i.e. 9 wire events), three
timed regions, each column's region stated exactly:
- built -> bytes: the batches exist; timed is the one encode call per batch (vLLM: `encoder.encode(batch)` on its
  KVEventBatch Structs with a held `msgspec.msgpack.Encoder`, as ZmqEventPublisher does; kvref: `encode_batch` or
  `encode_batch_fast` on KVEventBatch dataclasses, or on `wire_batch_fast`-style twin batches, or the twin batches
  through `msgspec_types()`'s encoder, held as vLLM's publisher holds its own);
- build + encode: from each event's fields as a keyword dict, timed is constructing the events and the batch, then
  encoding (vLLM: its Structs, as its block pool builds them; kvref: its dataclasses or its msgspec twins);
- pool -> bytes (kvref only, synthetic): from kvref's block-pool events, timed is `wire_events` + encode or
  `wire_batch_fast` + `encode_batch_fast` (hash projection, extra keys, per-copy removals included).
Rounds are interleaved: every column once per round, the order reversed every other round; each measurement runs
enough passes over the workload for ~20 ms. Reported: median events/s and [min, max] over rounds, and the median
per-round ratio of each column to vLLM's column of the same region (same round).

KVIndex: N engines each holding B cached blocks (random 64-bit hashes in 32-block chains, plus a 64-block probe
prompt whose first 8 blocks all engines share and whose rest only engine 0 holds), filled through `KVIndex.apply`
from encoded payloads; then `longest_prefix` on probe prompts of 8 to 64 blocks, and the same at smaller index
sizes, to show the cost follows the prompt's blocks, not the index size. Memory: RSS growth while filling. Times are CPU seconds of this process (the box is shared), best or median of R.
"""
from __future__ import annotations
import argparse, datetime, json, math, os, platform, random, statistics, subprocess, sys, time
from dataclasses import fields
from pathlib import Path

from kvref.core import block_pool
from kvref.distributed.kv_events import (EVENT_TYPES, BlockStored, KVEventBatch, KVIndex, encode_batch, encode_batch_fast,
                             event_from_json, msgspec_types, wire_batch_fast, wire_events)

ROOT = Path(__file__).resolve().parents[1]
VLLM_VENV = Path("/work/venv-vllm")
BLOCK = 16


def timed(fn, repeats: int, clock=time.process_time) -> list[float]:
    "Seconds per run of `fn`, `repeats` runs, in CPU time of this process (other jobs share the machine)."
    out = []
    for _ in range(repeats):
        start = clock()
        fn()
        out.append(clock() - start)
    return out


def recorded_batches() -> list[KVEventBatch]:
    out = []
    for path in sorted((ROOT / "golden/events").glob("*.events.jsonl")):
        for line in path.read_text().splitlines():
            events = json.loads(line)["events"]
            if events: out.append(KVEventBatch(0.0, [event_from_json(e) for e in events], 0))
    return out


def synthetic_pool_steps(steps: int = 1000) -> list[list]:
    "Per engine step, kvref block-pool events: 8 blocks evicted, then 32 full blocks of 16 tokens cached."
    rng = random.Random(0)
    digest = lambda: rng.getrandbits(256).to_bytes(32, "big")
    return [[block_pool.BlockRemoved([digest() for _ in range(8)]),
             block_pool.BlockStored([digest() for _ in range(32)], digest(), [rng.randrange(150_000) for _ in range(32 * BLOCK)],
                                    BLOCK, None)] for _ in range(steps)]


def keywords(batches: list[KVEventBatch]) -> list[list[tuple[str, dict]]]:
    "Each batch's events as (type name, field keyword dict): the input of the build + encode region."
    return [[(type(e).__name__, {f.name: getattr(e, f.name) for f in fields(e)}) for e in b.events] for b in batches]


def vllm_encoders():
    "vLLM 0.33.0's event classes, batch and encoder, or None when vLLM is not importable here."
    try:
        import msgspec
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored as VStored, KVEventBatch as VBatch
    except ImportError: return None
    return {"BlockStored": VStored, "BlockRemoved": BlockRemoved, "AllBlocksCleared": AllBlocksCleared}, VBatch, msgspec.msgpack.Encoder()


def columns(batches: list[KVEventBatch], pool: list[list] | None) -> dict[str, tuple[str, callable]]:
    "(region, column) -> function encoding the whole workload once, returning its payloads."
    kw, fast, vllm = keywords(batches), msgspec_types(), vllm_encoders()
    plain = dict(EVENT_TYPES)
    build = lambda classes, Batch: [Batch(ts=0.0, events=[classes[t](**k) for t, k in b], data_parallel_rank=0) for b in kw]
    cols = {("built -> bytes", "kvref `encode_batch`, dataclasses"): lambda: [encode_batch(b) for b in batches],
            ("build + encode", "kvref dataclasses + `encode_batch`"): lambda: [encode_batch(b) for b in build(plain, KVEventBatch)]}
    if fast:
        twins = fast[0]
        twin_classes = {cls.__name__: twin for cls, twin in twins.items()}
        twin_batches, encoder = build(twin_classes, twins[KVEventBatch]), fast[1]
        cols |= {("built -> bytes", "kvref `encode_batch_fast`, dataclasses"): lambda: [encode_batch_fast(b) for b in batches],
                 ("built -> bytes", "kvref `encode_batch_fast`, twins"): lambda: [encode_batch_fast(b) for b in twin_batches],
                 ("build + encode", "kvref dataclasses + `encode_batch_fast`"): lambda: [encode_batch_fast(b) for b in build(plain, KVEventBatch)],
                 ("built -> bytes", "kvref twins, held `encoder.encode`"): lambda: [encoder.encode(b) for b in twin_batches],
                 ("build + encode", "kvref twins + `encode_batch_fast`"): lambda: [encode_batch_fast(b) for b in build(twin_classes, twins[KVEventBatch])],
                 ("build + encode", "kvref twins + held `encoder.encode`"): lambda: [encoder.encode(b) for b in build(twin_classes, twins[KVEventBatch])]}
    if vllm:
        classes, VBatch, vllm_encoder = vllm
        vllm_batches = build(classes, VBatch)
        cols |= {("built -> bytes", "vLLM 0.33.0 `encoder.encode`"): lambda: [vllm_encoder.encode(b) for b in vllm_batches],
                 ("build + encode", "vLLM 0.33.0 Structs + `encoder.encode`"):
                     lambda: [vllm_encoder.encode(b) for b in build(classes, VBatch)]}
    if pool:
        cols |= {("pool -> bytes", "kvref `wire_events` + `encode_batch`"): lambda: [encode_batch(KVEventBatch(0.0, wire_events(p), 0)) for p in pool],
                 ("pool -> bytes", "kvref `wire_events` + `encode_batch_fast`"): lambda: [encode_batch_fast(KVEventBatch(0.0, wire_events(p), 0)) for p in pool]}
        if fast:
            cols[("pool -> bytes", "kvref `wire_batch_fast` + `encode_batch_fast`")] = lambda: [encode_batch_fast(wire_batch_fast(p, data_parallel_rank=0)) for p in pool]
            cols[("pool -> bytes", "kvref `wire_batch_fast` + held `encoder.encode`")] = lambda: [fast[1].encode(wire_batch_fast(p, data_parallel_rank=0)) for p in pool]
    return cols


def interleaved(cols: dict, n_events: int, rounds: int) -> dict[tuple, list[float]]:
    "Events/s of each column per round: every column once a round, the order reversed every other round."
    passes = {}
    for key, fn in cols.items():
        seconds = min(timed(fn, 2))
        passes[key] = max(1, math.ceil(0.02 / max(seconds, 1e-6)))
    rates = {key: [] for key in cols}
    for r in range(rounds):
        for key in (list(cols) if r % 2 == 0 else list(cols)[::-1]):
            k, fn = passes[key], cols[key]
            seconds = timed(lambda: [fn() for _ in range(k)], 1)[0]
            rates[key].append(n_events * k / seconds)
    return rates


def encoding_table(repeats: int) -> list[str]:
    if vllm_encoders() is None and (VLLM_VENV / "READY").exists() and not os.environ.get("KVREF_BENCH_CHILD"):
        env = dict(os.environ, PYTHONPATH=str(ROOT), KVREF_BENCH_CHILD="1")
        out = subprocess.run([str(VLLM_VENV / "bin/python"), __file__, "--part", "encode", "--repeats", str(repeats), "--no-header"],
                             capture_output=True, text=True, timeout=1800, env=env)
        if out.returncode == 0: return [f"(run in {VLLM_VENV}/bin/python, kvref and vLLM in one process)", "", out.stdout.rstrip()]
        print(out.stderr[-2000:], file=sys.stderr)
    rows = ["| workload | region | column | events/s, median | [min, max] over rounds | vs vLLM: per-round ratio, median [min, max] |",
            "|---|---|---|---:|---:|---:|"]
    pool = synthetic_pool_steps()
    workloads = (("recorded (golden/events)", recorded_batches(), None),
                 ("synthetic steps", [KVEventBatch(0.0, wire_events(p), 0) for p in pool], pool))
    for name, batches, steps in workloads:
        n = sum(len(b.events) for b in batches)
        cols = columns(batches, steps)
        expected = [encode_batch(b) for b in batches]
        for key, fn in cols.items(): assert fn() == expected, f"{name}: {key} writes other bytes than encode_batch"
        rates = interleaved(cols, n, repeats)
        regions = list(dict.fromkeys(region for region, _ in rates))
        for (region, col), r in sorted(rates.items(), key=lambda item: regions.index(item[0][0])):
            vllm = next((v for (reg, c), v in rates.items() if reg == region and c.startswith("vLLM")), None)
            ratios = [a / b for a, b in zip(r, vllm)] if vllm else None
            ratio = f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]" if vllm else "—"
            rows.append(f"| {name} ({n} events) | {region} | {col} | {statistics.median(r):,.0f} | "
                        f"[{min(r):,.0f}, {max(r):,.0f}] | {ratio} |")
    return rows


def rss_mb() -> float:
    "Resident memory now, MB (Linux)."
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def probe_prompt(blocks: int) -> list[int]:
    "A prompt whose first 8 blocks every engine holds and whose rest engine 0 holds."
    return list(range(blocks * BLOCK))


def fill(index: KVIndex, engines: int, blocks: int, probe: list[int]) -> float:
    "Fill every engine with `blocks` blocks through encoded payloads; seconds taken."
    rng, hashes = random.Random(1), index.prompt_hashes(probe)
    start, chain = time.perf_counter(), 32
    for e in range(engines):
        mine = hashes if e == 0 else hashes[:8]
        events = [BlockStored(mine, None, probe[:len(mine) * BLOCK], BLOCK, None, "GPU", None, [None] * len(mine), 0, "full_attention")]
        for _ in range((blocks - len(mine)) // chain):
            events.append(BlockStored([rng.getrandbits(64) for _ in range(chain)], None, [], BLOCK, None, "GPU", None))
        for seq, lo in enumerate(range(0, len(events), 100)):
            index.apply(f"engine{e}", seq, encode_batch_fast(KVEventBatch(0.0, events[lo:lo + 100], 0)))
    return time.perf_counter() - start


def lookup_us(index: KVIndex, prompt: list[int], repeats: int, n: int = 50) -> tuple[float, float]:
    "(µs per `longest_prefix` call, µs per `cached_prefix` walk of its hashes), best of `repeats`."
    hashes = index.prompt_hashes(prompt)
    total = min(timed(lambda: [index.longest_prefix(prompt) for _ in range(n)], repeats)) / n
    walk = min(timed(lambda: [index.cached_prefix(hashes) for _ in range(4 * n)], repeats)) / (4 * n)
    return total * 1e6, walk * 1e6


def index_tables(engines: int, blocks: int, repeats: int) -> list[str]:
    probe = probe_prompt(64)
    rows = ["| index | fill through `apply` | RSS growth | prompt blocks | µs per lookup (hash + walk) | µs walking the index | lookups/s | engine 0 answer |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for size in sorted({blocks // 100, blocks // 10, blocks}):
        index, before = KVIndex(BLOCK), rss_mb()
        seconds = fill(index, engines, size, probe)
        grown = rss_mb() - before
        for pb in (8, 16, 32, 64):
            us, walk = lookup_us(index, probe[:pb * BLOCK], repeats)
            answer = index.longest_prefix(probe[:pb * BLOCK])[("engine0", 0)]
            rows.append(f"| {engines} x {size:,} blocks | {seconds:.1f} s | {grown:,.0f} MB | {pb} | {us:,.0f} | {walk:,.1f} | {1e6 / us:,.0f} | {answer} |")
        del index
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", type=int, default=100)
    p.add_argument("--blocks", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--part", choices=["all", "encode", "index"], default="all")
    p.add_argument("--no-header", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if not a.no_header: print(f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, Python {platform.python_version()}, {platform.machine()}, "
          f"load average {os.getloadavg()[0]:.1f}\n")
    if a.part in ("all", "encode"): print("\n".join(encoding_table(a.repeats)) + "\n")
    if a.part in ("all", "index"): print("\n".join(index_tables(a.engines, a.blocks, a.repeats)))


if __name__ == "__main__":
    main()
