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
    from kvref import block_pool, hashing, kv_cache_manager, kv_events, production_traces, releases, router_conformance
    index = kv_events.KVIndex(2)
    return [
        (lambda: index.cached_prefix(None), TypeError, "hashes must be a list of external block hashes"),
        (lambda: index.cached_prefix([[1]]), TypeError, "hashes must be a list of external block hashes"),
        (lambda: list(router_conformance.op_batches(5)), TypeError, "trace must be a list of ops or a trace file's path, got int"),
        (lambda: block_pool.BlockPool(8).get_cached_block([b"x"]), TypeError, "block_hash must be bytes, got list"),
        (lambda: kv_cache_manager.KVCacheManager(8, 4).get_block_ids(["a"]), TypeError, "request_id must be a str, got list"),
        (lambda: hashing.hash_request_tokens([1, 2, 3, 4], 4, known_hashes=None), TypeError, "known_hashes must be a list"),
        (lambda: production_traces.MooncakeRequest("x", 20, 2, [1]), ValueError, "field 'timestamp' must be an int >= 0"),
        (lambda: releases.release_block_hashes(None, [1, 2], 2), TypeError, "profile must be a VllmProfile"),
    ]


@pytest.mark.parametrize("i", range(8))
def test_refusal_names_the_argument(i):
    call, error, message = _named_refusals()[i]
    with pytest.raises(error, match=re.escape(message)): call()
