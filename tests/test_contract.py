"""The trace contract: format 2 (free-queue changes, lookahead slots), adapter protocol 2 (everything a trace says
reaches the engine; protocol 1 still driven), adapter errors reported as such, and check's free-queue checkpoints."""
import json
import random
from pathlib import Path

import pytest

from kvref.oracle.conformance import check, load_adapter, shrink
from kvref.core.kv_cache_manager import KVCacheManager
from kvref.oracle.replay import (KVRefAdapter, Lockstep, TraceDriver, TraceReplayer, apply_changes, kvref_factory, load_decisions,
                          load_trace, replay, replay_lockstep, run_adapter, trace_config)
from kvref.oracle.workloads import adversarial_tiny_pool, to_trace

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "traces"
TRACES = sorted(p for p in GOLDEN.glob("*.jsonl") if not p.name.endswith(".vllm.jsonl"))
CFG = {"op": "config", "num_blocks": 8, "block_size": 4}


def image(name, offset=0, length=4):
    return [{"identifier": name, "offset": offset, "length": length}]


MULTIMODAL = [CFG, {"op": "add", "id": "a", "prompt": [5] * 9, "mm_items": image("cat")}, {"op": "schedule", "id": "a"},
              {"op": "add", "id": "b", "prompt": [5] * 9, "mm_items": image("dog")}, {"op": "schedule", "id": "b"},
              {"op": "free", "id": "a"}, {"op": "add", "id": "c", "prompt": [5] * 9, "mm_items": image("cat")},
              {"op": "schedule", "id": "c"}]
LOOKAHEAD = [{**CFG, "version": 2}, {"op": "add", "id": "a", "prompt": [1] * 6},
             {"op": "schedule", "id": "a", "num_lookahead_tokens": 3}, {"op": "append", "id": "a", "tokens": [2]},
             {"op": "schedule", "id": "a", "num_lookahead_tokens": 4}]
SALTED_LORA = [CFG, {"op": "add", "id": "a", "prompt": [3] * 9, "cache_salt": "t1", "lora": {"name": "L", "path": "/l"}},
               {"op": "schedule", "id": "a"}, {"op": "add", "id": "b", "prompt": [3] * 9, "cache_salt": "t1"},
               {"op": "schedule", "id": "b"}, {"op": "add", "id": "c", "prompt": [3] * 9, "cache_salt": "t1",
                                               "lora": {"name": "L", "path": "/l"}}, {"op": "schedule", "id": "c"}]


# ---------------------------------------------------------------- format 2

@pytest.mark.parametrize("trace, behavior", [(t, "vllm_0_33") for t in TRACES] + [(GOLDEN / "design-doc-example.jsonl", "design_doc")],
                         ids=lambda x: getattr(x, "stem", x))
def test_format2_changes_rebuild_every_format1_queue(trace, behavior):
    ops = load_trace(trace)
    v1, v2 = list(replay(ops, behavior)), list(replay(ops, behavior, version=2))
    queue = v2[0]["free_queue"]
    for d1, d2 in zip(v1, v2):
        if d2 is not v2[0]: queue = apply_changes(queue, d2)
        assert queue == d1["free_queue"], d1
        assert {k: v for k, v in d1.items() if k != "free_queue"} == \
               {k: v for k, v in d2.items() if k not in ("free_queue", "taken", "to_head", "to_tail")}


def test_format2_on_random_traces():
    rng = random.Random(3)
    for i in range(200):
        w = adversarial_tiny_pool(num_requests=rng.randint(1, 6), max_prompt_len=rng.randint(1, 9), output_len=2,
                                  block_size=rng.randint(1, 3), num_blocks=rng.randint(2, 8), seed=i)
        ops = to_trace(w, max_live=rng.randint(1, 4))
        v1, v2 = list(replay(ops)), list(replay(ops, version=2))
        queue = v2[0]["free_queue"]
        for d1, d2 in zip(v1[1:], v2[1:]):
            queue = apply_changes(queue, d2)
            assert queue == d1["free_queue"], (i, d1, d2)


def test_format2_file_states_its_version_and_checkpoints():
    ops = [{**CFG, "version": 2, "free_queue_every": 3}] + load_trace(GOLDEN / "design-doc-example.jsonl")[1:]
    got = list(replay(ops))
    assert [i for i, d in enumerate(got) if "free_queue" in d] == [i for i in range(len(ops)) if i % 3 == 0]
    assert "taken" in got[2] and "free_queue" not in got[2]


def test_format2_decision_does_not_walk_the_queue():
    "A format 2 decision never asks for the whole free queue (its cost does not grow with the pool)."
    calls = []
    class Counting(KVRefAdapter):
        def free_queue(self): calls.append(1); return super().free_queue()
    ops = [{"op": "config", "num_blocks": 100_000, "block_size": 4, "version": 2},
           {"op": "add", "id": "a", "prompt": [1] * 9}, {"op": "schedule", "id": "a"}, {"op": "free", "id": "a"}]
    got = run_adapter(Counting, ops)
    assert len(calls) == 1 and got[2]["taken"] == [1, 2, 3] and got[3]["to_tail"] == [2, 1]


def test_recorded_format1_decisions_still_match_exactly():
    for trace in TRACES:
        lock = replay_lockstep(load_decisions(trace.with_name(trace.stem + ".vllm.jsonl")))
        assert all(lock.apply(op) is None for op in load_trace(trace)), trace


def test_lookahead_slots_reach_the_allocator():
    got = list(replay(LOOKAHEAD))
    assert got[2]["block_ids"] == [1, 2, 3]           # 6 tokens + 3 lookahead = 9 slots, 3 blocks
    assert got[4]["block_ids"] == [1, 2, 3]           # 7 computed + 1 new + 4 lookahead = 12 slots
    m = KVCacheManager(8, 4)
    from kvref.core.kv_cache_manager import Request
    r = Request("a", [1] * 6)
    assert len(m.allocate_slots(r, 6, num_lookahead_tokens=3)) == 3


def test_config_defaults():
    assert trace_config({"num_blocks": 4, "block_size": 2}) == {
        "enable_caching": True, "hash_algo": "sha256", "max_model_len": None, "version": 1, "num_blocks": 4, "block_size": 2}
    assert trace_config({"num_blocks": 4, "block_size": 2, "version": 2})["free_queue_every"] is None
    m = KVCacheManager.from_config(CFG, "design_doc")
    assert (m.behavior, m.num_free_blocks, m.enable_caching, m.hash_algo) == ("design_doc", 8, True, "sha256")


# ---------------------------------------------------------------- protocol 2

@pytest.mark.parametrize("ops", [MULTIMODAL, LOOKAHEAD, SALTED_LORA], ids=["multimodal", "lookahead", "salt+lora"])
def test_kvref_adapter_never_diverges_from_kvref(ops):
    assert check(kvref_factory(), ops) is None
    assert check(KVRefAdapter, ops) is None  # the spec `kvref.oracle.conformance:KVRefAdapter` names this class


def test_multimodal_items_reach_the_adapter():
    got = run_adapter(KVRefAdapter, MULTIMODAL)
    assert [d["hit_tokens"] for d in got if d["op"] == "schedule"] == [0, 0, 8]


class Recorder:
    "A protocol 2 adapter that records what it receives, over kvref."
    protocol_version = 2
    def __init__(self, config):
        self.inner, self.calls, self.config = KVRefAdapter(config), [], config
    def add(self, request_id, prompt, *, cache_salt, lora, mm_items):
        self.calls.append(("add", request_id, cache_salt, lora, mm_items))
        self.inner.add(request_id, prompt, cache_salt=cache_salt, lora=lora, mm_items=mm_items)
    def allocate(self, request_id, num_new_tokens, num_hit_tokens, *, num_computed_tokens, num_lookahead_tokens):
        self.calls.append(("allocate", request_id, num_new_tokens, num_hit_tokens, num_computed_tokens, num_lookahead_tokens))
        return self.inner.allocate(request_id, num_new_tokens, num_hit_tokens, num_computed_tokens=num_computed_tokens,
                                   num_lookahead_tokens=num_lookahead_tokens)
    def __getattr__(self, name): return getattr(self.inner, name)


def test_everything_a_trace_says_reaches_a_protocol2_adapter():
    d = TraceDriver(Recorder)
    for op in LOOKAHEAD + [{"op": "add", "id": "m", "prompt": [1, 2], "cache_salt": "s", "lora": {"name": "L", "path": "p"},
                            "mm_items": image("x", 0, 1)}]:
        d.apply(op)
    assert d.adapter.config == {"num_blocks": 8, "block_size": 4, "enable_caching": True, "hash_algo": "sha256",
                                "max_model_len": None, "version": 2, "free_queue_every": None}
    assert d.adapter.calls == [("add", "a", None, None, []), ("allocate", "a", 6, 0, 0, 3), ("allocate", "a", 1, 0, 6, 4),
                               ("add", "m", "s", {"name": "L", "path": "p"}, image("x", 0, 1))]


class Version1:
    "A protocol 1 adapter (no protocol_version): the old signatures; it mirrors the computed count itself."
    def __init__(self, config): self.inner, self.computed = KVRefAdapter(config), {}
    def add(self, request_id, prompt, cache_salt, lora):
        self.inner.add(request_id, prompt, cache_salt=cache_salt, lora=lora); self.computed[request_id] = 0
    def allocate(self, request_id, num_new_tokens, num_hit_tokens):
        ok = self.inner.allocate(request_id, num_new_tokens, num_hit_tokens, num_computed_tokens=self.computed[request_id])
        if ok: self.computed[request_id] += num_hit_tokens + num_new_tokens
        return ok
    def preempt(self, request_id): self.inner.preempt(request_id); self.computed[request_id] = 0
    def lookup(self, request_id): return self.inner.lookup(request_id)
    def append(self, request_id, tokens): self.inner.append(request_id, tokens)
    def free(self, request_id): self.inner.free(request_id)
    def reset_prefix_cache(self): return self.inner.reset_prefix_cache()
    def block_ids(self, request_id): return self.inner.block_ids(request_id)
    def num_free(self): return self.inner.num_free()
    def free_queue(self): return self.inner.free_queue()


def test_protocol1_adapters_still_work_and_say_what_they_cannot_receive():
    assert check(Version1, SALTED_LORA) is None
    assert check(Version1, GOLDEN / "trace-11-2.jsonl") is None
    d = check(Version1, MULTIMODAL)
    assert d.index == 1 and "protocol 1 adapter cannot receive" in d.error and "protocol_version = 2" in d.error
    d = check(Version1, LOOKAHEAD)
    assert d.index == 2 and "lookahead" in d.error


# ---------------------------------------------------------------- adapter errors

def test_a_factory_that_raises_is_the_adapters_error_not_a_divergence():
    def factory(config): raise RuntimeError("cannot open the engine")
    d = check(factory, GOLDEN / "design-doc-example.jsonl")
    text = d.report()
    assert text.startswith("the adapter raised at op 0") and "diverged" not in text
    assert "RuntimeError: cannot open the engine" in text and "in factory" in text  # the adapter's frame


def test_lockstep_catch_nothing_lets_errors_through():
    lock = Lockstep(lambda op: None, TraceReplayer(strict=True).apply, catch=())
    lock.apply(CFG)
    with pytest.raises(ValueError, match="'x' is unknown or already freed"):
        lock.apply({"op": "free", "id": "x"})


def test_replay_lockstep_reports_the_end_of_the_decisions():
    ops = load_trace(GOLDEN / "design-doc-example.jsonl")
    want = load_decisions(GOLDEN / "design-doc-example.vllm.jsonl")[:5]
    lock = replay_lockstep(want)
    d = next(d for op in ops if (d := lock.apply(op)))
    assert d.index == 5 and d.expected is None and d.fields[0] == "op"


# ---------------------------------------------------------------- checkpoints

class ReverseFree(KVCacheManager):
    def free(self, request):
        rid = request if isinstance(request, str) else request.request_id
        self.num_cached_block.pop(rid, None)
        if (table := self.req_to_blocks.pop(rid, None)) is not None: self.block_pool.free_blocks(table, unhashed_first=True)


class QueueOnly(KVRefAdapter):
    "An engine that reports whole free queues but not their changes."
    def __getattribute__(self, name):
        if name == "free_queue_changes": raise AttributeError(name)
        return super().__getattribute__(name)


def test_checkpointed_free_queue_finds_the_first_divergent_op():
    ops = [{"op": "config", "num_blocks": 1024, "block_size": 2}]
    for i in range(6):
        ops += [{"op": "add", "id": f"r{i}", "prompt": [i] * 5}, {"op": "schedule", "id": f"r{i}"}]
    ops += [{"op": "free", "id": "r0"}] + [{"op": "add", "id": f"x{i}", "prompt": [9]} for i in range(30)]
    engine = lambda c: QueueOnly(c, manager_cls=ReverseFree)
    every_op = check(engine, ops, free_queue_every=1)
    assert every_op.index == 13 and every_op.fields == ["free_queue"]
    d = check(engine, ops)  # whole queues every 1024 ops: found after the last op, then pinned to op 13
    assert (d.index, d.fields) == (13, ["free_queue"])


# ---------------------------------------------------------------- load_adapter

def test_adapter_from_a_file_path(tmp_path, monkeypatch):
    f = tmp_path / "my_engine.py"
    f.write_text("from kvref.oracle.replay import KVRefAdapter\nclass Engine(KVRefAdapter): pass\n")
    assert check(load_adapter(f"{f}:Engine"), GOLDEN / "trace-11-0.jsonl") is None
    (tmp_path / "local_engine.py").write_text("from kvref.oracle.replay import KVRefAdapter as Engine\n")
    monkeypatch.chdir(tmp_path)
    assert load_adapter("local_engine:Engine").__name__ == "KVRefAdapter"   # the current folder, no PYTHONPATH
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ValueError, match="cannot import .*bad.py.*RuntimeError: boom"):
        load_adapter(f"{bad}:X")


# ---------------------------------------------------------------- vectors that ship

def test_list_vectors_names_every_recorded_file():
    from kvref.oracle.replay import list_vectors, vector_path
    found = {v.name: v for v in list_vectors()}
    assert {"traces/trace-11-0", "traces/trace-11-0.vllm", "hashing/vllm-0.33-block-hashes",
            "cudagraph/vllm-0.33-cudagraph-dispatch", "thinking_budget/vllm-0.33-thinking-budget-v1"} <= set(found)
    assert found["traces/trace-11-3"].count == len(load_trace(GOLDEN / "trace-11-3.jsonl")) == 118
    assert found["hashing/vllm-0.33-block-hashes"].source == "vllm 0.33.0" and found["hashing/vllm-0.33-block-hashes"].count == 16
    assert vector_path("traces/design-doc-example") == GOLDEN / "design-doc-example.jsonl"
    with pytest.raises(ValueError, match="no shipped vector 'nope'"):
        vector_path("nope")


def test_package_data_covers_every_vector_file():
    "pyproject maps golden/ into the wheel as kvref/golden; its globs must match every file list_vectors lists."
    import fnmatch, tomllib
    from kvref.oracle.replay import golden_dir, list_vectors
    setuptools = tomllib.loads((GOLDEN.parent.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"]["kvref.golden"] == "golden" and "kvref.golden" in setuptools["packages"]
    globs = setuptools["package-data"]["kvref.golden"]
    for v in list_vectors():
        rel = str(v.path.relative_to(golden_dir()))
        assert any(fnmatch.fnmatch(rel, g) for g in globs), rel
