"""Conformance kit: kvref against itself (no divergence), the broken variants always caught and shrunk, the
nano-style adapter's known differences, and `kvref check`."""
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvref.cli import check_main
from kvref.oracle.conformance import check, conformance_machine, load_adapter, shrink
from kvref.oracle.replay import KVRefAdapter, TraceDriver, kvref_factory, run_adapter
from kvref.core.kv_cache_manager import KVCacheManager
from kvref.adapters.nano import NanoAdapter
from kvref.oracle.replay import load_trace, replay
from kvref.core.scheduler import run_workload
from kvref.oracle.workloads import WORKLOADS, adversarial_tiny_pool, to_trace

GOLDEN = Path(__file__).parent.parent / "golden" / "traces"
TRACES = sorted(GOLDEN.glob("*[0-9e].jsonl"))  # the traces, not the .vllm.jsonl decisions
ROOT = Path(__file__).parent.parent
KVREF_BIN = Path(sys.executable).parent / "kvref"
HUNT = settings(max_examples=150, stateful_step_count=12, deadline=None, derandomize=True, database=None,
                print_blob=False, phases=[Phase.generate, Phase.shrink])
DEEP_HUNT = settings(HUNT, max_examples=100, stateful_step_count=25)  # the nano room check needs longer runs


class OffByOneHitCap(KVCacheManager):
    "Bug: caps hits at num_tokens // block_size blocks instead of (num_tokens - 1) // block_size."
    def get_computed_blocks(self, request):
        if not self.enable_caching: return [], 0
        hits = []
        for block_hash in self._block_hashes(request)[:request.num_tokens // self.block_size]:
            if (block := self.block_pool.get_cached_block(block_hash)) is None: break
            hits.append(block)
        return hits, len(hits) * self.block_size


class ForgetsReverse(KVCacheManager):
    "Bug: frees a request's blocks first to last."
    def free(self, request):
        rid = request if isinstance(request, str) else request.request_id
        self.num_cached_block.pop(rid, None)
        table = self.req_to_blocks.pop(rid, None)
        if table is not None: self.block_pool.free_blocks(table, unhashed_first=self.behavior == "vllm_0_33")


class HitStaysInQueue(KVCacheManager):
    "Bug: a prefix hit on a free cached block takes it into use but leaves it in the free queue."
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        def touch(blocks):
            for block in blocks: block.ref_cnt += 1
        self.block_pool._touch = touch  # the manager's hits go through the pool's unchecked `_touch`


PLANTED = [OffByOneHitCap, ForgetsReverse, HitStaysInQueue]


def broken(cls, behavior="vllm_0_33"):
    return lambda config: KVRefAdapter(config, behavior, cls)


def test_golden_traces_are_present():
    assert {p.name for p in TRACES} >= {"design-doc-example.jsonl", "trace-11-0.jsonl"} and len(TRACES) == 5


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_kvref_adapter_reproduces_vllm(trace):
    decisions = [json.loads(l) for l in trace.with_suffix("").with_suffix(".vllm.jsonl").read_text().splitlines()]
    assert run_adapter(kvref_factory(), load_trace(trace)) == decisions
    assert check(kvref_factory(), trace) is None


@pytest.mark.parametrize("behavior", ["vllm_0_33", "design_doc"])
def test_self_check_on_a_thousand_random_traces(behavior):
    "kvref against itself through the lockstep loop: never a divergence."
    rng = random.Random(5)
    for i in range(1000):
        w = adversarial_tiny_pool(num_requests=rng.randint(1, 6), max_prompt_len=rng.randint(1, 9),
                                  output_len=rng.randint(1, 3), block_size=rng.randint(1, 3),
                                  num_blocks=rng.randint(2, 8), seed=i)
        w.config["enable_caching"] = rng.random() < 0.8
        ops = to_trace(w, max_live=rng.randint(1, 4))
        assert check(kvref_factory(behavior), ops, behavior) is None, i


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_self_check_on_scheduler_runs(name):
    run = run_workload(WORKLOADS[name](seed=1), max_num_batched_tokens=48, max_num_seqs=6)
    assert check(kvref_factory(), run.trace) is None


@pytest.mark.parametrize("behavior", ["vllm_0_33", "design_doc"])
def test_state_machine_finds_nothing_in_kvref(behavior, tmp_path):
    machine = conformance_machine(kvref_factory(behavior), behavior, out_path=tmp_path / "d.jsonl")
    run_state_machine_as_test(machine, settings=settings(deadline=None, phases=[Phase.generate]))
    assert not (tmp_path / "d.jsonl").exists()


@pytest.mark.parametrize("cls", PLANTED)
@pytest.mark.parametrize("behavior", ["vllm_0_33", "design_doc"])
def test_planted_bugs_are_caught_and_the_shrunk_trace_replays(cls, behavior, tmp_path):
    out = tmp_path / "min.jsonl"
    machine = conformance_machine(broken(cls, behavior), behavior, out_path=out, caching=[True])
    with pytest.raises(AssertionError, match="diverged at op|the adapter raised at op"):
        run_state_machine_as_test(machine, settings=HUNT)
    minimal = load_trace(out)  # the file is a valid trace
    d = check(broken(cls, behavior), minimal, behavior)
    assert d is not None and d.index == len(minimal) - 1  # replays to a divergence at its last op
    assert len(minimal) <= 8
    # shrinking the shrunk trace again keeps the same divergence
    again = check(broken(cls, behavior), shrink(broken(cls, behavior), minimal, behavior), behavior)
    assert (again.op["op"], again.fields) == (d.op["op"], d.fields)
    if cls is OffByOneHitCap:  # kvref then refuses to allocate nothing, or the hits differ
        assert "hit_tokens" in d.fields or "num_new_tokens must be > 0" in d.error
    elif cls is ForgetsReverse: assert {"free_queue", "to_head", "to_tail"} & set(d.fields)
    else: assert "num_free" in d.fields or d.error  # the hit block is still counted free


@pytest.mark.parametrize("cls", [OffByOneHitCap, ForgetsReverse])
def test_broken_variants_caught_on_recorded_traces(cls):
    found = [t for t in TRACES if check(broken(cls), t)]
    assert found
    d = check(broken(cls), found[0])
    small = shrink(broken(cls), found[0])
    assert len(small) < d.index + 1
    d2 = check(broken(cls), small)
    assert (d2.op["op"], d2.fields) == (d.op["op"], d.fields)


def test_nano_matches_the_design_doc_example_but_not_vllm_ids():
    doc = GOLDEN / "design-doc-example.jsonl"
    assert check(NanoAdapter, doc, "design_doc") is None
    d = check(NanoAdapter, doc, "vllm_0_33")
    assert d.index == 0 and d.fields == ["free_queue", "num_free"]  # no null block
    assert check(NanoAdapter, doc, "vllm_0_33", fields=["hit_tokens", "num_new_tokens", "allocated"]) is None


def test_nano_known_differences():
    cfg = {"op": "config", "num_blocks": 4, "block_size": 1, "enable_caching": True, "hash_algo": "sha256"}
    # no hit cap: a preempted one-token request hits its whole prompt
    uncapped = [cfg, {"op": "add", "id": "a", "prompt": [3]}, {"op": "schedule", "id": "a"},
                {"op": "preempt", "id": "a"}, {"op": "schedule", "id": "a"}]
    d = check(NanoAdapter, uncapped, "design_doc")
    assert d.index == 4 and (d.expected["hit_tokens"], d.got["hit_tokens"]) == (0, 1)
    capped = lambda c: NanoAdapter(c, hit_cap=True)
    assert check(capped, uncapped, "design_doc") is None
    # stale map entry: block reused under another parent still hits
    stale = [cfg, {"op": "add", "id": "a", "prompt": [5, 7, 8]}, {"op": "schedule", "id": "a"}, {"op": "free", "id": "a"},
             {"op": "add", "id": "b", "prompt": [6, 6, 7]}, {"op": "schedule", "id": "b"},
             {"op": "add", "id": "c", "prompt": [5, 7, 9]}, {"op": "schedule", "id": "c"}]
    d = check(capped, stale, "design_doc")
    assert (d.index, d.expected["hit_tokens"], d.got["hit_tokens"]) == (7, 1, 2)


def test_machine_mix_tests_prefix_caching():
    "At least half the ops schedule, resets are rare, and at least a third of the prefix lookups hit."
    from collections import Counter
    tally = Counter()
    class Counting(conformance_machine(kvref_factory(), caching=[True])):
        def step(self, op):
            lookup = op["op"] == "schedule" and self.ref.requests[op["id"]].num_computed_tokens == 0
            super().step(op)
            tally[op["op"]] += 1
            if lookup: tally["lookups"] += 1; tally["hits"] += self.lock.last["hit_tokens"] > 0
    run_state_machine_as_test(Counting, settings=settings(max_examples=100, stateful_step_count=40, deadline=None,
                                                          derandomize=True, database=None))
    ops = sum(n for k, n in tally.items() if k not in ("lookups", "hits", "config"))
    assert tally["schedule"] >= ops / 2 and tally["reset_prefix_cache"] < ops / 30
    assert tally["hits"] >= tally["lookups"] / 3


def test_nano_hunt_finds_a_divergence(tmp_path):
    out = tmp_path / "nano.jsonl"
    machine = conformance_machine(lambda c: NanoAdapter(c, hit_cap=True), "design_doc", out_path=out, caching=[True])
    with pytest.raises(AssertionError, match="diverged at op"):
        run_state_machine_as_test(machine, settings=DEEP_HUNT)
    d = check(lambda c: NanoAdapter(c, hit_cap=True), load_trace(out), "design_doc")
    assert d is not None and d.index == len(load_trace(out)) - 1


class NoQueue(KVRefAdapter):
    def free_queue(self): return None


class Raises(KVRefAdapter):
    def preempt(self, request_id): raise RuntimeError("preempt not supported")


def test_adapters_without_a_free_queue_and_adapters_that_raise():
    ops = load_trace(GOLDEN / "trace-11-1.jsonl")
    assert check(lambda c: NoQueue(c), ops) is None
    d = check(lambda c: Raises(c), ops)
    assert d.op["op"] == "preempt" and d.got is None and "RuntimeError: preempt not supported" in d.report()
    assert d.report().startswith("the adapter raised at op") and "in preempt" in d.error  # its own traceback


def test_report_reads():
    d = check(kvref_factory("design_doc"), GOLDEN / "design-doc-example.jsonl")
    text = d.report()
    assert text.startswith('diverged at op 0 (line 1 of the trace): {"op": "config"')
    assert "expected [1, 2, 3, 4, 5, 6, 7, 8, 9]" in text


def test_bad_inputs():
    with pytest.raises(ValueError, match="must look like module:factory"): load_adapter("nocolon")
    with pytest.raises(ValueError, match="has no attribute 'Nope'"): load_adapter("kvref.adapters.nano:Nope")
    with pytest.raises(ValueError, match="no such file"): load_adapter("nowhere/adapter.py:Adapter")
    with pytest.raises(ValueError, match="unknown fields"): check(kvref_factory(), [], fields=["x"])
    with pytest.raises(TypeError, match="adapter must be a factory"): check(NanoAdapter({"num_blocks": 2, "block_size": 1}), [])
    with pytest.raises(ValueError, match="nothing to shrink"): shrink(kvref_factory(), GOLDEN / "trace-11-0.jsonl")
    d = TraceDriver(kvref_factory())
    with pytest.raises(ValueError, match="the first op must be 'config'"): d.apply({"op": "add", "id": "a", "prompt": [1]})
    d.apply({"op": "config", "num_blocks": 4, "block_size": 2})
    with pytest.raises(ValueError, match="unknown op 'bogus'"): d.apply({"op": "bogus"})
    with pytest.raises(ValueError, match="budget must be >= 1"):
        d.apply({"op": "add", "id": "a", "prompt": [1]}); d.apply({"op": "schedule", "id": "a", "budget": 0})


def test_check_main_exit_codes(tmp_path, capsys):
    good = str(GOLDEN / "trace-11-2.jsonl")
    assert check_main(["--adapter", "kvref.oracle.conformance:KVRefAdapter", good]) == 0
    assert check_main(["--adapter", "kvref.adapters.nano:NanoAdapter", "--out", str(tmp_path), good]) == 1
    out = capsys.readouterr().out
    minimal = tmp_path / "trace-11-2.min.jsonl"
    assert f"minimal trace" in out and str(minimal) in out
    assert check(NanoAdapter, load_trace(minimal)) is not None
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"op": "config", "num_blocks": 4, "block_size": 2}\n{not json\n')
    assert check_main(["--adapter", "kvref.adapters.nano:NanoAdapter", str(bad)]) == 2
    assert "line 2" in capsys.readouterr().err
    assert check_main(["--adapter", "nope", good]) == 2


@pytest.mark.skipif(not KVREF_BIN.exists(), reason="kvref console script not installed")
def test_kvref_check_command(tmp_path):
    good = str(GOLDEN / "design-doc-example.jsonl")
    r = subprocess.run([str(KVREF_BIN), "check", "--adapter", "kvref.adapters.nano:NanoAdapter", "--behavior", "design_doc", good],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(KVREF_BIN), "check", "--adapter", "kvref.adapters.nano:NanoAdapter", good, "--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 1 and (tmp_path / "design-doc-example.min.jsonl").exists()
    r = subprocess.run([str(KVREF_BIN), "check", good], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--adapter" in r.stderr


def test_nano_leaks_across_salts_on_a_recorded_trace():
    capped = lambda c: NanoAdapter(c, hit_cap=True)
    fields = ["hit_tokens", "allocated"]
    small = shrink(capped, GOLDEN / "trace-11-3.jsonl", "design_doc", fields)
    d = check(capped, small, "design_doc", fields)
    assert d.fields == ["hit_tokens"] and d.expected["hit_tokens"] == 0 < d.got["hit_tokens"]
    assert {op.get("cache_salt") for op in small if op["op"] == "add"} == {"b", None}


# ---------------------------------------------------------------- nano's adapter checks its input (and only that)

def nano_with_a():
    a = NanoAdapter({"num_blocks": 8, "block_size": 4})
    a.add("a", [1, 2, 3, 4, 5])
    return a

def nano_state(a):
    m = a.manager
    return (repr(m.blocks), dict(m.hash_to_block_id), list(m.free_block_ids), set(m.used_block_ids),
            repr(a.tokens), repr(a.tables), dict(a.computed), dict(a.hashed))

@pytest.mark.parametrize("call, error, message", [
    (lambda a: a.allocate("ghost", 4, 0), ValueError, "request 'ghost' is not known: add it first"),
    (lambda a: a.allocate("a", True, 0), TypeError, "num_new_tokens must be an int >= 0, got True"),
    (lambda a: a.allocate("a", -1, 0), ValueError, "num_new_tokens must be an int >= 0, got -1"),
    (lambda a: a.allocate("a", 5, True), TypeError, "num_hit_tokens must be an int >= 0, got True"),
    (lambda a: a.allocate("a", 5, -4), ValueError, "num_hit_tokens must be an int >= 0, got -4"),
    (lambda a: a.allocate("a", 5.0, 0), TypeError, "num_new_tokens must be an int >= 0, got 5.0"),
    (lambda a: a.append("ghost", [7]), ValueError, "request 'ghost' is not known: add it first"),
    (lambda a: a.append("a", "abc"), TypeError, "tokens must be a list of ints, got str"),
    (lambda a: a.append("a", [1.0]), TypeError, "token_ids[0] is 1.0 (float)"),
    (lambda a: a.append("a", [7, -1]), ValueError, "token_ids[1] is -1"),
    (lambda a: a.append("a", [True]), TypeError, "token_ids[0] is True (bool)"),
    (lambda a: a.lookup("ghost"), ValueError, "request 'ghost' is not known"),
    (lambda a: a.add(["r"], [1, 2]), TypeError, "request_id must be a str, got ['r']"),  # not "unhashable type: 'list'"
    (lambda a: a.add("b", 5), TypeError, "prompt must be a list of ints, got int"),
    (lambda a: a.lookup(["a"]), TypeError, "request_id must be a str, got ['a']"),
    (lambda a: a.allocate({"a": 1}, 4, 0), TypeError, "request_id must be a str, got {'a': 1}"),
    (lambda a: a.free(["a"]), TypeError, "request_id must be a str, got ['a']"),
    (lambda a: a.preempt("ghost"), ValueError, "request 'ghost' is not known"),
    (lambda a: a.block_ids("ghost"), ValueError, "request 'ghost' is not known"),
])
def test_nano_adapter_refuses_by_name_and_changes_nothing(call, error, message):
    a = nano_with_a()
    before = nano_state(a)
    with pytest.raises(error) as got:
        call(a)
    assert message in str(got.value)
    assert nano_state(a) == before

@pytest.mark.parametrize("num_blocks, block_size, error, message", [
    (True, 4, TypeError, "num_blocks must be an int >= 1, got True"), (8, 3.0, TypeError, "block_size must be an int >= 1, got 3.0"),
    (0, 4, ValueError, "num_blocks must be an int >= 1, got 0"), (8, "4", TypeError, "block_size must be an int >= 1, got '4'"),
    (None, 4, TypeError, "num_blocks must be an int >= 1, got None"),
])
def test_nano_block_manager_refuses_bad_sizes(num_blocks, block_size, error, message):
    from kvref.adapters.nano import NanoBlockManager
    with pytest.raises(error) as got:
        NanoBlockManager(num_blocks, block_size)
    assert str(got.value) == message


@pytest.mark.parametrize("fields, error, message", [
    (3, TypeError, "fields must be a list of decision field names, got 3"),  # not "'int' object is not iterable"
    ("num_free", TypeError, "fields must be a list of decision field names, got 'num_free'"),
    ([["num_free"]], TypeError, "fields[0] must be a str, got ['num_free']"),  # not "unhashable type: 'list'"
    ([1], TypeError, "fields[0] must be a str, got 1"),
    (["blocks"], ValueError, "unknown fields ['blocks']"),
])
def test_fields_are_refused_by_name(fields, error, message):
    from kvref.oracle.conformance import conformance_machine, shrink
    trace = [{"op": "config", "num_blocks": 8, "block_size": 4}]
    for call in (lambda: check(kvref_factory(), trace, fields=fields), lambda: shrink(kvref_factory(), trace, fields=fields),
                 lambda: conformance_machine(kvref_factory(), fields=fields)):
        with pytest.raises(error) as got: call()
        assert message in str(got.value)
