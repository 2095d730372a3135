"""KV events: events encoded per second, and KVIndex lookups per second at 100 engines x 100k cached blocks.

Run: `.venv/bin/python bench/events.py [--engines N] [--blocks B] [--repeats R]` (defaults 100, 100000, 5).
Prints markdown tables. Needs msgspec for the msgspec columns (`pip install msgspec`); they are skipped without it.

Encoding, on two workloads (every recorded event of golden/events, int hashes; and 1000 synthetic steps of one
32-block BlockStored of 16 tokens per block plus 8 BlockRemoved), events per second of:
- `kvref encode_batch`: the plain Python encoder (the definition);
- `kvref encode_batch_fast`: the same bytes through msgspec (Structs built from the wire dataclasses);
- `msgspec, vLLM's structs`: msgspec encoding Structs restated from vLLM 0.33.0's kv_events.py, built beforehand,
  as vLLM's publisher thread does (its events are born as Structs in the block pool);
- `vLLM 0.33.0`: vLLM's own KVEventBatch and encoder, in /work/venv-vllm, only if /work/venv-vllm/READY exists.

KVIndex: N engines each holding B cached blocks (random 64-bit hashes in 32-block chains, plus a 64-block probe
prompt whose first 8 blocks all engines share and whose rest only engine 0 holds), filled through `KVIndex.apply`
from encoded payloads; then `longest_prefix` on probe prompts of 8 to 64 blocks, and the same at smaller index
sizes, to show the cost follows the prompt's blocks, not the index size. Memory: RSS growth while filling. Times are CPU seconds of this process (the box is shared), best or median of R.
"""
from __future__ import annotations
import argparse, datetime, hashlib, json, os, platform, random, statistics, subprocess, sys, time
from pathlib import Path

from kvref.hashing import hash_request_tokens
from kvref.kv_events import (BlockRemoved, BlockStored, KVEventBatch, KVIndex, encode_batch, encode_batch_fast,
                             event_from_json, external_block_hash)

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


def synthetic_batches(steps: int = 1000) -> list[KVEventBatch]:
    rng = random.Random(0)
    h = lambda: rng.getrandbits(64)
    return [KVEventBatch(0.0, [BlockRemoved([h()], "GPU", 0) for _ in range(8)] +
                         [BlockStored([h() for _ in range(32)], h(), [rng.randrange(150_000) for _ in range(32 * BLOCK)],
                                      BLOCK, None, "GPU", None, [None] * 32, 0, "full_attention")], 0) for _ in range(steps)]


def msgspec_structs():
    "Structs restated from vLLM 0.33.0's vllm/distributed/kv_events.py (as tests/test_kv_events_msgspec.py)."
    sys.path.insert(0, str(ROOT / "tests"))
    from test_kv_events_msgspec import as_msgspec
    return as_msgspec


VLLM_SCRIPT = r'''
import json, sys, time
from vllm.distributed.kv_events import KVEventBatch, BlockStored, BlockRemoved, AllBlocksCleared
import msgspec
kinds = {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved, "AllBlocksCleared": AllBlocksCleared}
batches = [KVEventBatch(ts=0.0, events=[kinds[e.pop("type")](**e) for e in b], data_parallel_rank=0) for b in json.load(sys.stdin)]
enc, n, best = msgspec.msgpack.Encoder(), sum(len(b.events) for b in batches), []
import hashlib
digest = hashlib.sha256(b"".join(enc.encode(b) for b in batches)).hexdigest()
for _ in range(5):
    t = time.process_time()
    for b in batches: enc.encode(b)
    best.append(time.process_time() - t)
print(n / sorted(best)[2], digest)
'''


def vllm_rate(batches: list[KVEventBatch]) -> float | None:
    "Events/s of vLLM's own encoder on the same events, in its own venv; None if that venv is not ready."
    if not (VLLM_VENV / "READY").exists(): return None
    from kvref.kv_events import event_to_json
    data = json.dumps([[{k: v for k, v in event_to_json(e).items() if v is not None or k in ("parent_block_hash", "lora_id", "lora_name", "medium")}
                        for e in b.events] for b in batches])
    out = subprocess.run([str(VLLM_VENV / "bin/python"), "-c", VLLM_SCRIPT], input=data, capture_output=True, text=True, timeout=600)
    if out.returncode != 0: return None
    rate, digest = out.stdout.split()
    assert digest == hashlib.sha256(b"".join(encode_batch(b) for b in batches)).hexdigest(), "vLLM's bytes differ from kvref's"
    return float(rate)


def encoding_table(repeats: int) -> list[str]:
    rows = ["| workload | events | kvref `encode_batch` | kvref `encode_batch_fast` | msgspec, vLLM's structs (prebuilt) | vLLM 0.33.0 |",
            "|---|---:|---:|---:|---:|---:|"]
    try: as_msgspec = msgspec_structs()
    except ImportError: as_msgspec = None
    for name, batches in (("recorded (golden/events)", recorded_batches()), ("synthetic steps", synthetic_batches())):
        n = sum(len(b.events) for b in batches)
        assert all(encode_batch_fast(b) == encode_batch(b) for b in batches)
        rate = lambda fn: f"{n / statistics.median(timed(fn, repeats)):,.0f}"
        cols = [rate(lambda: [encode_batch(b) for b in batches]), rate(lambda: [encode_batch_fast(b) for b in batches])]
        if as_msgspec:
            import msgspec
            structs, enc = [as_msgspec(b) for b in batches], msgspec.msgpack.Encoder()
            assert [enc.encode(s) for s in structs] == [encode_batch(b) for b in batches]
            cols.append(rate(lambda: [enc.encode(s) for s in structs]))
        else: cols.append("(msgspec not installed)")
        v = vllm_rate(batches)
        cols.append(f"{v:,.0f}" if v else "(no /work/venv-vllm/READY)")
        rows.append(f"| {name} | {n} | " + " | ".join(cols) + " |")
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
    a = p.parse_args(argv)
    print(f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, Python {platform.python_version()}, {platform.machine()}, "
          f"load average {os.getloadavg()[0]:.1f}\n")
    if a.part in ("all", "encode"): print("\n".join(encoding_table(a.repeats)) + "\n")
    if a.part in ("all", "index"): print("\n".join(index_tables(a.engines, a.blocks, a.repeats)))


if __name__ == "__main__":
    main()
