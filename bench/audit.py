"""kvref audit: KV events checked per second by `EngineAudit.check`, and the audit's memory over a long stream.

Run: `.venv/bin/python bench/audit.py [--users N] [--repeats R]`.

Workload: `kvref.oracle.workloads.shared_system_prompts` (8 system prompts of 256 tokens, N users each adding 64 tokens
and generating 32, block size 16, 256 blocks, 8 requests in flight) replayed by kvref's allocator with KV events
on (vLLM 0.33 behaviour, `op_batches`): one batch per op that published, every block hash an int64, so every stored
block's hash is rebuilt (none unverifiable). Timed is `EngineAudit.check(seq, payload)` over the whole stream,
stated as vLLM 0.33.0, sha256, block size 16, PYTHONHASHSEED unset (so the audit finds nothing), in four parts:
everything; and, for the breakdown, decoding alone (`decode_batch` with the release's layout), and the layout check
alone (re-encoding). Times are CPU seconds of this process (the box is shared), best of R. Memory: the audit's
state (digests held, index entries, remembered first blocks) at its peak, against the pool's 256 blocks.
"""
from __future__ import annotations
import argparse, datetime, platform, time

from kvref.distributed.kv_events import decode_batch, encode_batch_fast
from kvref.oracle.live_audit import EngineAudit, EngineConfig
from kvref.oracle.releases import wire_schema
from kvref.oracle.router_conformance import op_batches
from kvref.oracle.workloads import shared_system_prompts, to_trace


def stream(users: int) -> list[tuple[int, bytes, int]]:
    ops = to_trace(shared_system_prompts(num_prompts=8, num_users=users, system_len=256, user_len=64, output_len=32,
                                         block_size=16, num_blocks=256), max_live=8)
    return [(b.seq, b.payload, len(b.events)) for b in op_batches(ops, data_parallel_rank=0) if b.events]


def best(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time(); run(); times.append(time.process_time() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    batches = stream(args.users)
    events = sum(n for _, _, n in batches)
    config = EngineConfig("bench", "0.33.0", "sha256", 16)
    schema = wire_schema("0.33.0")

    def audit():
        engine = EngineAudit(config)
        for seq, payload, _ in batches: engine.check(seq, payload)
        assert not engine.findings and engine.counts["hashes_checked"] == engine.counts["blocks_stored"]
        return engine
    decoded = [decode_batch(p, "int", "b", schema) for _, p, _ in batches]
    whole = best(audit, args.repeats)
    decode = best(lambda: [decode_batch(p, "int", "b", schema) for _, p, _ in batches], args.repeats)
    encode = best(lambda: [encode_batch_fast(b) for b in decoded], args.repeats)
    peak, engine = 0, EngineAudit(config)
    for seq, payload, _ in batches:
        engine.check(seq, payload)
        peak = max(peak, len(engine.digests) + len(engine.index.engines.get(engine.engine, {})))
    blocks = engine.counts["blocks_stored"]
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, Python {platform.python_version()}, "
          f"{len(batches)} batches, {events} events, {blocks} stored blocks")
    print(f"audit (everything): {events / whole:,.0f} events/s, {len(batches) / whole:,.0f} batches/s, "
          f"{blocks / whole:,.0f} block hashes rebuilt/s")
    print(f"  of which decode {decode / whole:.0%}, layout re-encode {encode / whole:.0%}")
    print(f"peak state: {peak} entries (digests + index) for a 256-block pool; remembered first blocks {len(engine.roots)}")


if __name__ == "__main__":
    main()
