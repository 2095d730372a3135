"""Router conformance (nbs/07d_router_conformance.ipynb): kvref's allocator emits vLLM 0.33's event stream op for op
(every recording, both hash forms), KVIndex agrees with the allocator's own cache, buggy routers are caught and
shrunk, and a router that misbehaves is a divergence, never a crash."""
import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from kvref.core.hashing import hash_request_tokens
from kvref.distributed.kv_events import KVIndex, external_block_hash
from kvref.oracle.replay import TraceReplayer, load_trace
from kvref.oracle.router_conformance import (ClearBlindRouter, DropAllCopiesRouter, ExampleRouter, FirstBytesRouter, SaltBlindRouter,
                                      check_router, event_records, op_batches, reference_router, shrink_router,
                                      trace_prompts)

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
NAMES = ["design-doc-example", "trace-11-0", "trace-11-1", "trace-11-2", "trace-11-3", "trace-mm-15-0"]


def trace(name):
    path = GOLDEN / "traces" / f"{name}.jsonl"
    return load_trace(path if path.exists() else GOLDEN / "events" / f"{name}.jsonl")


def recorded(name, form):
    suffix = ".events.bytes.jsonl" if form == "bytes" else ".events.jsonl"
    return [json.loads(line) for line in (GOLDEN / "events" / (name + suffix)).read_text().splitlines()]


@pytest.mark.parametrize("form", ["int", "bytes"])
@pytest.mark.parametrize("name", NAMES)
def test_every_op_reproduced(name, form):
    "Events, seq and payload of every op equal vLLM's; with rank 0 the payload equals what its publisher sent."
    want = recorded(name, form)
    mine = list(event_records(trace(name), form))
    assert len(mine) == len(want)
    for m, w in zip(mine, want):
        assert m == {k: w[k] for k in m}, f"{name} op {w['i']}"
    dp0 = [r["payload_b64"] for r in event_records(trace(name), form, 0)]
    assert dp0 == [w["payload_dp0_b64"] for w in want]


def test_no_events_on_free_preempt_refusal_or_reset_refused():
    "Ops that must publish nothing publish nothing, in every recording."
    for name in NAMES:
        replayer = TraceReplayer()
        for op, b in zip(trace(name), op_batches(trace(name))):
            decision = replayer.apply(op)
            if op["op"] in ("add", "free", "preempt", "append", "config"): assert b.events == [], (name, b.i)
            if op["op"] == "schedule" and not decision["allocated"]: assert b.events == [], (name, b.i)
            if op["op"] == "reset_prefix_cache":
                assert [type(e).__name__ for e in b.events] == (["AllBlocksCleared"] if decision["ok"] else [])


def test_removals_precede_the_store_within_an_op():
    for name in NAMES:
        for b in op_batches(trace(name)):
            kinds = [type(e).__name__ for e in b.events]
            assert kinds.count("BlockStored") <= 1 and kinds[:kinds.index("BlockStored") if "BlockStored" in kinds else None].count("BlockStored") == 0
            if "BlockStored" in kinds: assert kinds[-1] == "BlockStored"


@pytest.mark.parametrize("form", ["int", "bytes"])
@pytest.mark.parametrize("name", NAMES)
def test_index_matches_the_allocator_cache(name, form):
    "After every op, KVIndex's longest prefix for every prompt equals the allocator's cached prefix of full blocks."
    ops, replayer, index = trace(name), TraceReplayer(), None
    prompts = trace_prompts("e", ops)
    for op, b in zip(ops, op_batches(ops, form, 0)):
        replayer.apply(op)
        if op["op"] == "config": index = KVIndex(op["block_size"], op.get("hash_algo", "sha256"), form)
        if b.events: index.apply("e", b.seq, b.payload)
        if not index.engines: continue
        cached = {external_block_hash(h, form) for h in replayer.manager.block_pool.cached_block_hash_to_block}
        for p in prompts:
            hashes = [external_block_hash(h, form) for h in hash_request_tokens(
                list(p.prompt), op_block_size(ops), ops[0].get("hash_algo", "sha256"), cache_salt=p.cache_salt,
                lora=p.lora, mm_items=p.mm_items)]
            n = next((i for i, h in enumerate(hashes) if h not in cached), len(hashes))
            assert p.ask(index) == {("e", 0): n}, (name, b.i, p.name)


def op_block_size(ops):
    return ops[0]["block_size"]


ENGINES_4 = ["design-doc-example", "trace-mm-15-0", "trace-11-3"]


@pytest.mark.parametrize("form", ["int", "bytes"])
def test_correct_routers_pass(form):
    engines = {n: trace(n) for n in ENGINES_4}
    assert check_router(ExampleRouter, engines, form) is None
    assert check_router(reference_router, engines, form) is None
    assert check_router(ExampleRouter, {n: trace(n) for n in ("trace-11-0", "trace-11-1")}, form) is None


@pytest.mark.parametrize("router", [FirstBytesRouter, DropAllCopiesRouter, SaltBlindRouter], ids=lambda r: r.__name__)
def test_buggy_routers_caught_and_shrunk(router):
    engines = {n: trace(n) for n in ENGINES_4}
    found = check_router(router, engines)
    assert found is not None and found.got != found.expected
    small = shrink_router(router, found)
    assert small is not None and small.prompt == found.prompt
    assert sum(map(len, small.traces.values())) <= 10
    assert check_router(ExampleRouter, small.traces, prompts=[small.prompt]) is None  # the bug, not the trace


def test_a_router_blind_to_resets_is_caught_and_shrunk():
    "The planted bug of a router that ignores `AllBlocksCleared`: caught after trace-11-1's reset, shrunk to it."
    engines = {n: trace(n) for n in ("trace-11-0", "trace-11-1")}
    assert check_router(ExampleRouter, engines) is None
    found = check_router(ClearBlindRouter, engines)
    assert found is not None and found.expected == {} and found.got  # stale: claims blocks the engine no longer has
    small = shrink_router(ClearBlindRouter, found)
    assert [op["op"] for t in small.traces.values() for op in t] == ["config", "add", "schedule", "free", "reset_prefix_cache"]
    assert check_router(ExampleRouter, small.traces, prompts=[small.prompt]) is None  # the bug, not the trace


def test_first_bytes_router_passes_in_bytes_form():
    "The projection bug exists only in the int form: with raw digests that router is correct."
    assert check_router(FirstBytesRouter, {n: trace(n) for n in ENGINES_4}, "bytes") is None


class Flaky(ExampleRouter):
    def longest_prefix(self, prompt, **request):
        answer = super().longest_prefix(prompt, **request)
        return {**answer, ("ghost", 0): 1}


class WrongType(ExampleRouter):
    def longest_prefix(self, prompt, **request): return {e: float(n) for e, n in super().longest_prefix(prompt, **request).items()}


@pytest.mark.parametrize("router, got", [(Flaky, "ghost"), (WrongType, "not a dict of engine -> int")])
def test_misbehaving_routers_are_divergences(router, got):
    d = check_router(router, {"d": trace("design-doc-example")})
    assert d is not None and got in str(d.got) and "expected" in d.report()


def test_refusals():
    with pytest.raises(ValueError, match="must share block_size and hash_algo"):
        check_router(ExampleRouter, [trace("design-doc-example"), trace("trace-11-0")])
    with pytest.raises(ValueError, match="no traces given"):
        check_router(ExampleRouter, {})
    with pytest.raises(ValueError, match="same file name"):
        check_router(ExampleRouter, [GOLDEN / "traces/trace-11-3.jsonl", GOLDEN / "traces/trace-11-3.jsonl"])
    with pytest.raises(ValueError, match="op 0: the first op must be 'config'"):
        list(op_batches([{"op": "add", "id": "x", "prompt": [1]}]))


def test_trace_files_are_named_by_stem():
    d = check_router(SaltBlindRouter, [GOLDEN / "traces/trace-11-3.jsonl"])
    assert d.stream == "trace-11-3" and list(d.traces) == ["trace-11-3"]


@settings(max_examples=10, deadline=None)
@given(st.integers(3, 12), st.data())
def test_random_prefix_workloads_agree(num_blocks, data):
    "Random small traces with shared prefixes, salts and evictions: the example router never disagrees with KVIndex."
    ops = [{"op": "config", "num_blocks": num_blocks, "block_size": 2}]
    prefix = data.draw(st.lists(st.integers(0, 9), min_size=2, max_size=6))
    for i in range(data.draw(st.integers(1, 6))):
        tail = data.draw(st.lists(st.integers(0, 9), min_size=1, max_size=6))
        salt = data.draw(st.sampled_from([None, "s"]))
        ops += [{"op": "add", "id": f"r{i}", "prompt": prefix + tail, "cache_salt": salt},
                {"op": "schedule", "id": f"r{i}"}]
        if data.draw(st.booleans()): ops.append({"op": "free", "id": f"r{i}"})
    assert check_router(ExampleRouter, {"a": ops, "b": ops[:len(ops) // 2 + 1]}) is None
