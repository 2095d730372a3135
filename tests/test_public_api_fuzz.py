"""Every public entry point, called with wrong types, wrong sizes and misuse (issue 12): each refusal is a named
`TypeError`/`ValueError` (or `OSError` for a file), never a crash deep inside; a refused call leaves its object's
state exactly as it was; and bad values a correct API must refuse (booleans as counts, negative counts, token ids
outside [0, 2**64), non-tensors as logits) are refused rather than silently accepted.

The table of entry points is `fuzz_table.py`; the bad values and the snapshot are in `fuzz_support.py`. The whole
file is a fixed table (about 2,000 calls, deterministic, a few seconds). Entry points owned by other chapters that
still fail are strict xfails naming the owner, so the fix turns them red until the mark is removed."""
import re

import pytest

from fuzz_support import judge
from fuzz_table import ENTRIES

# Entry points that still fail, by owner (the lead routes them); strict: a fix makes the test fail until removed.
KNOWN: dict[str, str] = {}  # entry -> why it still fails (owner); empty: every public entry point refuses by name


def _id(entry): return entry.name


@pytest.mark.parametrize("entry", [pytest.param(e, marks=pytest.mark.xfail(strict=True, reason=KNOWN[e.name]))
                                   if e.name in KNOWN else e for e in ENTRIES], ids=_id)
def test_bad_input_is_refused_by_name_and_changes_nothing(entry):
    failures = [v for v in judge(entry) if v.outcome != "ok"]
    assert not failures, "\n".join(f"{v.arg} = {v.value}: {v.outcome} {v.detail}" for v in failures)


# Issue 32: refusals that gave Python's generic message ("unhashable type: 'list'", "'int' object is not iterable")
# now name the argument; each row failed before its fix.
def _named_refusals():
    from kvref.core import block_pool, fast_hashing, hashing, hybrid, kv_cache_manager
    from kvref.oracle import hybrid_replay, production_traces, releases, replay, router_conformance
    from kvref.distributed import kv_events
    index, p033, router = kv_events.KVIndex(2), releases.profile_for_version("0.33.0"), router_conformance.ExampleRouter
    manager = hybrid.HybridKVCacheManager([hybrid.FullAttentionSpec(4), hybrid.SlidingWindowSpec(4, 8)], 16)
    trace = [{"op": "config", "num_blocks": 8, "block_size": 4}, {"op": "add", "id": "a", "prompt": list(range(9))},
             {"op": "schedule", "id": "a"}]
    mooncake = production_traces.MooncakeRequest(0, 20, 2, [1, 2])
    return [
        (lambda: index.cached_prefix(None), TypeError, "hashes must be a list of external block hashes"),
        (lambda: index.cached_prefix([[1]]), TypeError, "hashes must be a list of external block hashes"),
        (lambda: list(router_conformance.op_batches(5)), TypeError, "trace must be a list of ops or a trace file's path, got int"),
        (lambda: block_pool.BlockPool(8).get_cached_block([b"x"]), TypeError, "block_hash must be bytes, got [b'x']"),
        (lambda: kv_cache_manager.KVCacheManager(8, 4).get_block_ids(["a"]), TypeError, "request_id must be a str, got list"),
        (lambda: fast_hashing.hash_request_tokens([1, 2, 3, 4], 4, known_hashes=None), TypeError, "known_hashes must be a list"),
        (lambda: production_traces.MooncakeRequest("x", 20, 2, [1]), ValueError, "field 'timestamp' must be an int >= 0"),
        (lambda: releases.release_block_hashes(None, [1, 2], 2), TypeError, "profile must be a VllmProfile"),
        # the rest, found by calling the newer chapters' entry points with wrong types (crash: a KeyError or
        # AttributeError or ZeroDivisionError before)
        (lambda: manager.get_block_ids([[1]]), TypeError, "request_id must be a str, got [[1]]"),
        (lambda: hybrid.resolve_block_sizes(["x"]), TypeError, "block_sizes[0] must be an int >= 1, got 'x'"),
        (lambda: hybrid.resolve_block_sizes([0]), ValueError, "block_sizes[0] must be an int >= 1, got 0"),  # crash
        (lambda: hybrid.group_block_hashes(None, 4, 8), TypeError, "block_hashes must be a list of block hashes, got None"),
        (lambda: hybrid.hash_with_group_id(None, 1), TypeError, "block_hash must be bytes, got NoneType"),
        (lambda: manager.allocate_slots(hybrid.HybridRequest("b", [1, 2]), 2, 0, 5), TypeError,
         "request 'b': new_computed_blocks must be one list of blocks per group, got 5"),
        (lambda: hybrid_replay.replay_hybrid(None), TypeError, "ops must be a list of ops, got NoneType"),
        (lambda: hybrid_replay.hybrid_replay_stats({"a": 1}), TypeError, "ops must be a list of ops, got dict"),  # crash
        (lambda: list(replay.replay(5)), TypeError, "ops must be a list of ops, got int"),
        (lambda: releases.release_event_block_hashes(p033, None), TypeError, "block_hashes must be a list of block hashes"),
        (lambda: releases.release_none_hash(p033, [[1]], None), TypeError, "algo must be a hash algorithm's name, got list"),
        (lambda: list(releases.replay_release(None, "0.19.1")), TypeError, "ops must be a list of ops, got NoneType"),
        (lambda: releases.check_release_vectors(None), TypeError, "path must be a str or Path, got NoneType"),
        (lambda: releases.diagnose(5), TypeError, "path must be a str or Path, got int"),
        (lambda: hashing.load_vectors(None), TypeError, "path must be a str or Path, got NoneType"),
        (lambda: router_conformance.check_router(None, [trace]), TypeError, "factory must make a router from a config dict"),
        (lambda: router_conformance.check_router(router, [[1]]), ValueError, "op 0: the first op must be 'config', got 1"),  # crash
        (lambda: router_conformance.check_router(router, None), TypeError, "traces must be a list of trace files or op lists"),
        (lambda: router_conformance.check_router(router, [trace], "int", 5), TypeError, "prompts must be a list of Prompt"),
        (lambda: router_conformance.trace_prompts("e", None), TypeError, "ops must be a list of ops, got NoneType"),
        (lambda: router_conformance.trace_prompts("e", [{}]), ValueError, "trace 'e': op 0: unknown op None"),  # crash
        (lambda: router_conformance.reference_router({}), TypeError, "config must be a dict of block_size"),
        (lambda: kv_events.wire_events(None), TypeError, "events must be a list of block pool events, got NoneType"),
        (lambda: production_traces.format_results(None), TypeError, "results must be a list of CacheSizeResult"),
        (lambda: production_traces.replay_mooncake([mooncake], None, 4, hash_block_size=16), TypeError,
         "num_blocks must be an int >= 1, got None"),
    ]


@pytest.mark.parametrize("i", range(33))
def test_refusal_names_the_argument(i):
    assert len(_named_refusals()) == 33
    call, error, message = _named_refusals()[i]
    with pytest.raises(error, match=re.escape(message)): call()
