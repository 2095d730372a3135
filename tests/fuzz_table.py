"""The public entry points `test_public_api_fuzz.py` calls: one valid call each, the kind of every argument, and a
fresh context per call. Modules other helpers own are marked with their owner."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import torch

from fuzz_support import Entry
from kvref.core import block_pool, fast_hashing, free_queue, hashing, hybrid, kv_cache_manager, mamba, scheduler
from kvref.oracle import array_replay, conformance, event_replay, hybrid_replay, live_audit, production_traces, releases, replay, router_conformance, workloads, sweep_grids
from kvref.compilation import cudagraph
from kvref.distributed import kv_events
from kvref.sample import logits_processors, sampling_params, thinking_budget, thinking_budget_vllm
from kvref.adapters import nano
from kvref import pictures

ROOT = Path(__file__).resolve().parent.parent
TMP = Path("/tmp/kvref-fuzz")
HASH, BENCH, CONTRACT, KERNELS = "hash helper", "bench helper", "contract helper", "kernels helper"
CPU = torch.device("cpu")
CFG = logits_processors.LogitsProcessorConfig(max_num_seqs=4)
SP = sampling_params.SamplingParams
RC = thinking_budget.ReasoningConfig([100], [200])
nothing = lambda: None


# ---------------------------------------------------------------- allocator (bench helper)
def queue():
    blocks = [free_queue.KVCacheBlock(i) for i in range(6)]
    q = free_queue.FreeKVCacheBlockQueue(blocks)
    held = q.popleft_n(2)
    return q, held


def pool():
    p = block_pool.BlockPool(8)
    return p, p.get_new_blocks(2)


def manager():
    m = kv_cache_manager.KVCacheManager(16, 4, max_model_len=64)
    r = kv_cache_manager.Request("a", list(range(9)))
    m.allocate_slots(r, 9)
    return m, r


def fresh_request(): return kv_cache_manager.Request("b", list(range(6)))


ALLOCATOR = [
    Entry("free_queue.KVCacheBlock", nothing, lambda _, i: free_queue.KVCacheBlock(i), (3,), ("count",), owner=BENCH),
    Entry("free_queue.FreeKVCacheBlockQueue", nothing, lambda _, b: free_queue.FreeKVCacheBlockQueue(b),
          ([free_queue.KVCacheBlock(0)],), ("seq",), owner=BENCH),
    Entry("FreeKVCacheBlockQueue.popleft_n", queue, lambda c, n: c[0].popleft_n(n), (2,), ("count",), owner=BENCH),
    Entry("FreeKVCacheBlockQueue.append_n", queue, lambda c, s: c[0].append_n(c[1][:1] if s == "ok" else s), ("ok",),
          ("seq",), owner=BENCH),
    Entry("FreeKVCacheBlockQueue.remove", queue, lambda c, b: c[0].remove(c[0].fake_head.next_free_block if b == "ok" else b),
          ("ok",), ("any",), owner=BENCH),
    Entry("BlockPool", nothing, lambda _, n, c: block_pool.BlockPool(n, c), (8, True), ("positive", "bool"), owner=BENCH,
          skip={(0, "10**30"): ""}),
    Entry("BlockPool.get_new_blocks", pool, lambda c, n: c[0].get_new_blocks(n), (2,), ("count",), owner=BENCH),
    Entry("BlockPool.free_blocks", pool, lambda c, s: c[0].free_blocks(c[1] if s == "ok" else s), ("ok",), ("seq",),
          owner=BENCH),
    Entry("BlockPool.touch", pool, lambda c, s: c[0].touch(c[1] if s == "ok" else s), ("ok",), ("seq",), owner=BENCH),
    Entry("BlockPool.get_cached_block", pool, lambda c, h: c[0].get_cached_block(h), (b"x" * 32,), ("any",), owner=BENCH),
    Entry("BlockPool.cache_full_blocks", pool,
          lambda c, h, n, bs: c[0].cache_full_blocks(c[1], h, 0, n, bs),
          ([b"a" * 32, b"b" * 32], 2, 4), ("seq", "count", "positive"), owner=BENCH),
    Entry("kv_cache_manager.Request", nothing, lambda _, i, t: kv_cache_manager.Request(i, t), ("a", [1, 2]),
          ("str", "tokens"), owner=BENCH,
          cases=((1, [np.int64(3)], "accept: vLLM's Request takes the ids as given; kvref keeps the ints they stand for (04)"),)),
    Entry("KVCacheManager.allocate_slots lookahead", manager,
          lambda c, n: c[0].allocate_slots(fresh_request(), 6, num_lookahead_tokens=n), (2,), ("count",), owner=BENCH,
          skip={(0, "10**30"): "capped at max_model_len, as below"},
          cases=((0, 10**18, "accept: vLLM caps the slots at max_model_len (04, Allocating slots)"),)),
    Entry("Request.append_output_token_ids", fresh_request, lambda r, t: r.append_output_token_ids(t), ([1],),
          ("tokens",), owner=BENCH, skip={(0, "5"): "one int is accepted"}),
    Entry("KVCacheManager", nothing, lambda _, n, bs: kv_cache_manager.KVCacheManager(n, bs), (8, 4),
          ("positive", "positive"), owner=BENCH, skip={(0, "10**30"): "", (1, "10**30"): ""}),
    Entry("KVCacheManager.allocate_slots", manager, lambda c, r, n: c[0].allocate_slots(fresh_request() if r == "ok" else r, n),
          ("ok", 6), ("any", "count"), owner=BENCH),
    Entry("KVCacheManager.get_computed_blocks", manager, lambda c, r: c[0].get_computed_blocks(c[1] if r == "ok" else r),
          ("ok",), ("any",), owner=BENCH),
    Entry("KVCacheManager.free", manager, lambda c, r: c[0].free(c[1] if r == "ok" else r), ("ok",), ("any",), owner=BENCH),
    Entry("KVCacheManager.get_block_ids", manager, lambda c, r: c[0].get_block_ids(r), ("a",), ("any",), owner=BENCH),
    Entry("kv_cache_manager.cdiv", nothing, lambda _, a, b: kv_cache_manager.cdiv(a, b), (7, 2), ("int", "positive"),
          owner=BENCH),
]

# ---------------------------------------------------------------- hashing (hash helper)
HASHING = [
    Entry("fast_hashing.hash_request_tokens", nothing, lambda _, t, bs: fast_hashing.hash_request_tokens(t, bs),
          (list(range(8)), 4), ("tokens", "positive"), owner=HASH, skip={(1, "10**30"): ""}),
    Entry("hashing.request_block_hashes", nothing, lambda _, t, bs, a: hashing.request_block_hashes(t, bs, a),
          (list(range(8)), 4, "sha256"), ("tokens", "positive", "name"), owner=HASH, skip={(1, "10**30"): ""}),
    Entry("hashing.hash_block_tokens", nothing,
          lambda _, p, t: hashing.hash_block_tokens(hashing.sha256, p, t), (None, [1, 2]), ("any", "tokens"),
          owner=HASH, skip={(0, "None"): "no parent"},
          cases=((0, "parent", "accept: vLLM hashes whatever parent it is given (01, Hashing one block)"),
                 (0, b"", "accept: vLLM reads a falsy parent as NONE_HASH (01)"))),
    Entry("fast_hashing.hash_request_tokens mm_items", nothing,
          lambda _, m: fast_hashing.hash_request_tokens(list(range(8)), 4, mm_items=m), ([hashing.MultiModalItem("a", 0, 2)],),
          ("seq",), owner=HASH, skip={(0, "None"): "no items"},
          cases=((0, [hashing.MultiModalItem("b", 4, 2), hashing.MultiModalItem("a", 0, 2)],
                  "accept: vLLM's input processor sorts a request's items by offset; kvref sorts them too (01)"),
                 (0, [hashing.MultiModalItem("a", 0, 4), hashing.MultiModalItem("b", 2, 2)], "refuse"),
                 (0, [hashing.MultiModalItem("a", 6, 4)], "refuse"))),
    Entry("hashing.get_hash_fn_by_name", nothing, lambda _, n: hashing.get_hash_fn_by_name(n), ("sha256",), ("name",),
          owner=HASH),
    Entry("hashing.init_none_hash", nothing, lambda _, n: hashing.init_none_hash(n), ("sha256",), ("name",), owner=HASH),
    Entry("hashing.block_hash_to_int64", nothing, lambda _, h: hashing.block_hash_to_int64(h), (b"x" * 32,), ("any",),
          owner=HASH),
    Entry("hashing.MultiModalItem", nothing, lambda _, o, n: hashing.MultiModalItem("i", o, n), (0, 2),
          ("count", "count"), owner=HASH),
    Entry("hashing.generate_block_hash_extra_keys", nothing,
          lambda _, s, e: hashing.generate_block_hash_extra_keys(s, e, cache_salt="x"), (0, 4), ("count", "count"),
          owner=HASH),
    Entry("hashing.load_vectors", nothing, lambda _, p: hashing.load_vectors(p),
          (ROOT / "golden" / "hashing" / "vllm-0.33-block-hashes.json",), ("path",), owner=HASH),
]

# ---------------------------------------------------------------- replay, conformance, nano (contract helper)
CONFIG_OP = {"op": "config", "num_blocks": 8, "block_size": 4}


def replayer():
    t = replay.TraceReplayer()
    t.apply(CONFIG_OP)
    return t


def driver():
    d = replay.TraceDriver(replay.kvref_factory())
    d.apply(CONFIG_OP)
    return d


def nano_adapter():
    a = nano.NanoAdapter({"num_blocks": 8, "block_size": 4})
    a.add("a", [1, 2, 3, 4, 5])
    return a


def trace_file():
    TMP.mkdir(parents=True, exist_ok=True)
    (TMP / "t.jsonl").write_text(json.dumps(CONFIG_OP) + "\n")
    return TMP / "t.jsonl"


CONTRACT_ENTRIES = [
    Entry("replay.validate_op", nothing, lambda _, o: replay.validate_op(o), (CONFIG_OP,), ("any",), owner=CONTRACT),
    Entry("TraceReplayer.apply", replayer, lambda t, o: t.apply(o), ({"op": "add", "id": "a", "prompt": [1, 2]},),
          ("any",), owner=CONTRACT),
    Entry("replay.load_trace", nothing, lambda _, p: replay.load_trace(p), (trace_file(),), ("path",), owner=CONTRACT),
    Entry("TraceDriver.apply", driver, lambda d, o: d.apply(o), ({"op": "add", "id": "a", "prompt": [1, 2]},), ("any",),
          owner=CONTRACT),
    Entry("conformance.check fields", nothing,
          lambda _, f: conformance.check(conformance.kvref_factory(), [CONFIG_OP], fields=f), (["num_free"],),
          ("seq",), owner=CONTRACT, skip={(0, "None"): "None compares every field of the trace's format"}),
    Entry("NanoAdapter.allocate", nano_adapter, lambda a, r, n, h: a.allocate(r, n, h), ("a", 5, 0),
          ("any", "count", "count"), owner=CONTRACT),
    Entry("NanoAdapter.add", nano_adapter, lambda a, r, p: a.add(r, p), ("b", [1, 2]), ("str", "tokens"),
          owner=CONTRACT, cases=((0, ["b"], "refuse"), (0, {"b": 1}, "refuse"))),  # request ids: str, named when not
    Entry("NanoAdapter.append", nano_adapter, lambda a, r, t: a.append(r, t), ("a", [7]), ("any", "tokens"),
          owner=CONTRACT),
    Entry("NanoBlockManager", nothing, lambda _, n, bs: nano.NanoBlockManager(n, bs), (8, 4), ("positive", "positive"),
          owner=CONTRACT, skip={(0, "10**30"): "", (1, "10**30"): ""}),
]

# ---------------------------------------------------------------- pictures (mine)
TRACE = [CONFIG_OP, {"op": "add", "id": "a", "prompt": [1, 2, 3, 4, 5]}, {"op": "schedule", "id": "a"},
         {"op": "free", "id": "a"}]


def follow_with(i, key, value):
    "follow() over TRACE and its replayed decisions, with op `i`'s `key` set to `value` (or the op itself replaced)."
    ops = json.loads(json.dumps(TRACE))
    decisions = list(replay.replay(ops))
    if key is None: ops[i] = value
    else: ops[i][key] = value
    return list(pictures.follow(ops, decisions))


def follow_dec(i, key, value):
    ops = json.loads(json.dumps(TRACE))
    decisions = list(replay.replay(ops))
    if key is None: decisions[i] = value
    else: decisions[i][key] = value
    return list(pictures.follow(ops, decisions))


PICTURES = [
    Entry("pictures.follow config.block_size", nothing, lambda _, v: follow_with(0, "block_size", v), (4,), ("positive",),
          skip={(0, "10**30"): ""}),
    Entry("pictures.follow add.prompt", nothing, lambda _, v: follow_with(1, "prompt", v), ([1, 2, 3, 4, 5],),
          ("tokens",), skip={(0, "[]"): "", (0, "[2**63]"): ""}),
    Entry("pictures.follow add.id", nothing, lambda _, v: follow_with(1, "id", v), ("a",), ("any",)),
    Entry("pictures.follow op", nothing, lambda _, v: follow_with(2, None, v), ({"op": "schedule", "id": "a"},),
          ("any",)),
    Entry("pictures.follow decision", nothing, lambda _, v: follow_dec(2, None, v),
          (list(replay.replay(TRACE))[2],), ("any",)),
    Entry("pictures.follow decision.block_ids", nothing, lambda _, v: follow_dec(2, "block_ids", v), ([1, 2],), ("seq",)),
    Entry("pictures.follow decision.hit_tokens", nothing, lambda _, v: follow_dec(2, "hit_tokens", v), (0,), ("count",),
          skip={(0, "10**30"): ""}),
    Entry("pictures.follow ops", nothing, lambda _, v: list(pictures.follow(v, list(replay.replay(TRACE)))), (TRACE,),
          ("any",)),
    Entry("pictures.rows_svg", nothing, lambda _, r: pictures.rows_svg(r), ({"a": [1, 2]},), ("any",)),
    Entry("pictures.progress", nothing, lambda _, t: list(pictures.progress([1], t, "x")), (1,), ("any",)),
    Entry("pictures.write_svgs", nothing, lambda _, d: pictures.write_svgs(TRACE[:1], d, TMP / "svg"),
          ([{"op": "config", "ok": True, "free_queue": []}],), ("any",)),
]

# ---------------------------------------------------------------- workloads, scheduler, traces (mine)
spec = lambda **kw: workloads.RequestSpec(**{"id": "a", "prompt": [1, 2, 3], "output": [4], **kw})


def sched():
    m = kv_cache_manager.KVCacheManager(16, 4, max_model_len=32)
    s = scheduler.Scheduler(m)
    s.add_request(workloads.RequestSpec("a", [1, 2, 3, 4, 5], [6, 7]))
    s.step()
    return s


def decoding():
    "A scheduler (no op trace) right after a decode-only step, and that step."
    s = scheduler.Scheduler(kv_cache_manager.KVCacheManager(16, 4), record_trace=False)
    for rid, prompt in (("a", [1, 2, 3, 4, 5]), ("b", [9, 8])): s.add_request(workloads.RequestSpec(rid, prompt, list(range(20, 28))))
    s.step()
    return s, s.step()


def queued():
    return scheduler.SchedulerRequest(kv_cache_manager.Request("q", [1, 2, 3]), 2)


def sched_state(s):
    return (snap_all(s.kv), snap_all(s.requests), [r.request_id for r in s.waiting],
            [r.request_id for r in s.running], list(s.trace), s.num_arrived)


def snap_all(x):
    from fuzz_support import snap
    return snap(x)


MOONCAKE = production_traces.MooncakeRequest(0, 20, 2, [1, 2])


def mooncake_file(text):
    TMP.mkdir(parents=True, exist_ok=True)
    p = TMP / "mc.jsonl"
    p.write_text(text)
    return p


WORKLOAD = workloads.adversarial_tiny_pool(4)
SCHEDULING = [
    Entry("workloads.RequestSpec prompt", nothing, lambda _, p: spec(prompt=p), ([1],), ("tokens",),
          skip={(0, "[]"): "", (0, "[2**63]"): ""}),
    Entry("workloads.RequestSpec output", nothing, lambda _, p: spec(output=p), ([1],), ("tokens",),
          skip={(0, "[]"): "", (0, "[2**63]"): ""}),
    Entry("workloads.RequestSpec id", nothing, lambda _, i: spec(id=i), ("a",), ("str",)),
    Entry("workloads.RequestSpec lora", nothing, lambda _, v: spec(lora=v), ({"name": "x", "path": "p"},), ("any",)),
    Entry("workloads.RequestSpec cache_salt", nothing, lambda _, v: spec(cache_salt=v), ("s",), ("str",)),
    Entry("workloads.RequestSpec priority", nothing, lambda _, v: spec(priority=v), (1,), ("int",)),
    Entry("workloads.Workload", nothing, lambda _, r, c: workloads.Workload("w", r, c),
          ([spec()], {"num_blocks": 8, "block_size": 4}), ("seq", "any")),
    Entry("workloads.shared_system_prompts", nothing, lambda _, n, bs: workloads.shared_system_prompts(n, 2, block_size=bs),
          (2, 4), ("positive", "positive"), skip={(0, "10**30"): "", (1, "10**30"): ""}),
    Entry("workloads.multi_turn_chat", nothing, lambda _, n, t: workloads.multi_turn_chat(n, t), (2, 2),
          ("positive", "positive"), skip={(0, "10**30"): "", (1, "10**30"): ""}),
    Entry("workloads.long_documents", nothing, lambda _, n, q: workloads.long_documents(n, q, 64), (1, 2),
          ("positive", "positive"), skip={(0, "10**30"): "", (1, "10**30"): ""}),
    Entry("workloads.adversarial_tiny_pool", nothing, lambda _, n, s: workloads.adversarial_tiny_pool(n, seed=s), (4, 0),
          ("positive", "int"), skip={(0, "10**30"): ""}),
    Entry("workloads.salted_tenants", nothing, lambda _, n: workloads.salted_tenants(n, 2), (2,), ("positive",),
          skip={(0, "10**30"): ""}),
    Entry("workloads.lora_mix", nothing, lambda _, n: workloads.lora_mix(n, 4), (2,), ("positive",),
          skip={(0, "10**30"): ""}),
    Entry("workloads.to_trace", nothing, lambda _, w, m: workloads.to_trace(w, m), (WORKLOAD, 2), ("any", "positive"),
          skip={(1, "10**30"): ""}),
    Entry("workloads.write_trace", nothing, lambda _, o, p: workloads.write_trace(o, p),
          ([CONFIG_OP], TMP / "written.jsonl"), ("any", "path")),  # its own file: t.jsonl is read by others
    Entry("workloads.replay_stats", nothing, lambda _, o, d: workloads.replay_stats(o, d),
          (TRACE, list(replay.replay(TRACE))), ("any", "any")),
    Entry("scheduler.FakeModel.next_token", nothing, lambda _, t: scheduler.FakeModel().next_token(t), ([1, 2],),
          ("tokens",), skip={(0, "[]"): "", (0, "[2**63]"): ""}),
    Entry("scheduler.Scheduler", nothing,
          lambda _, m, b, s: scheduler.Scheduler(kv_cache_manager.KVCacheManager(8, 4) if m == "ok" else m,
                                                 max_num_batched_tokens=b, max_num_seqs=s),
          ("ok", 64, 4), ("any", "positive", "positive"), skip={(1, "10**30"): "", (2, "10**30"): ""}),
    Entry("Scheduler.add_request", sched, lambda s, r, m: s.add_request(spec(id="b") if r == "ok" else r, m), ("ok", 4),
          ("any", "positive"), state=sched_state, skip={(1, "10**30"): "", (1, "None"): "no cap"}),
    Entry("Scheduler.add_request long", sched, lambda s, p: s.add_request(spec(id="b", prompt=p)), ([1] * 8,),
          ("tokens",), state=sched_state, skip={(0, "[2**63]"): ""}),
    Entry("Scheduler.queue", sched, lambda s, r: s.queue(queued() if r == "ok" else r), ("ok",), ("any",),
          state=sched_state),
    Entry("Scheduler.update_from_output", sched, lambda s, o: s.update_from_output(s.schedule() if o == "ok" else o), ("ok",), ("any",),
          state=sched_state),
    Entry("scheduler.run_workload", nothing, lambda _, w, b, n: scheduler.run_workload(w, behavior="vllm_0_33", max_num_batched_tokens=b, max_num_seqs=n),
          (WORKLOAD, 64, 4), ("any", "positive", "positive"), skip={(1, "10**30"): "", (2, "10**30"): ""}),
    Entry("event_replay.advance_decode", decoding, lambda c, h: event_replay.advance_decode(c[0], c[1], h), (3,), ("count",),
          state=lambda c: sched_state(c[0]), skip={(0, "None"): "None: no arrival is coming", (0, "10**30"): ""}),
    Entry("PrefixCacheStats.record", scheduler.PrefixCacheStats, lambda p, n, h, b: p.record(n, h, b), (4, 2, False),
          ("count", "count", "bool"), skip={(0, "10**30"): "", (1, "10**30"): ""}),
    Entry("production_traces.parse_mooncake_line", nothing,
          lambda _, t, l, h: production_traces.parse_mooncake_line(t, l, h),
          ('{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [1]}', 1, 4),
          ("any", "count", "positive"), skip={(2, "10**30"): ""}),
    Entry("production_traces.read_mooncake", nothing, lambda _, p, h: list(production_traces.read_mooncake(p, h)),
          (mooncake_file('{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [1]}\n'), 4),
          ("path", "positive"), skip={(1, "10**30"): ""}),
    Entry("production_traces.synthesize_prompt", nothing,
          lambda _, h, n, b: production_traces.synthesize_prompt(h, n, b), ([1, 2], 6, 4), ("tokens", "count", "positive"),
          skip={(1, "10**30"): "", (2, "10**30"): ""}),
    Entry("production_traces.synthesize_output", nothing, lambda _, i, n: production_traces.synthesize_output(i, n),
          (0, 3), ("count", "count"), skip={(1, "10**30"): "", (0, "10**30"): ""}),
    Entry("production_traces.mooncake_to_spec", nothing, lambda _, r, i: production_traces.mooncake_to_spec(r, i, 16),
          (MOONCAKE, 0), ("any", "count"), skip={(1, "10**30"): ""}),
    Entry("production_traces.block_hashes", nothing, lambda _, r, b: production_traces.block_hashes(r, b, 16),
          (MOONCAKE, 4), ("any", "positive"), skip={(1, "10**30"): ""}),
    Entry("production_traces.SyntheticTokenIds", nothing,
          lambda _, r, h: production_traces.SyntheticTokenIds(r, h)[0:4], (MOONCAKE, 16), ("any", "positive"),
          skip={(1, "10**30"): ""}),
    Entry("production_traces.replay_mooncake", nothing,
          lambda _, r, n, b: production_traces.replay_mooncake(r, n, b, hash_block_size=16), ([MOONCAKE], 16, 4),
          ("seq", "positive", "positive"), skip={(1, "10**30"): "", (2, "10**30"): ""}),
    Entry("production_traces.ideal_hit_rate", nothing, lambda _, r, b: production_traces.ideal_hit_rate(r, b, 16),
          ([MOONCAKE], 4), ("seq", "positive"), skip={(1, "10**30"): ""}),
    Entry("production_traces.sweep", nothing,
          lambda _, r, bl: production_traces.sweep(r, bl, 4, hash_block_size=16, jobs=1), ([MOONCAKE], [16]),
          ("seq", "seq"), skip={(1, "[10**30]"): "builds every block up front, like BlockPool"}),
    Entry("array_replay.replay_arrays", nothing,
          lambda _, r, n, b: array_replay.replay_arrays(r, n, b, hash_block_size=16), ([MOONCAKE], 16, 4),
          ("seq", "positive", "positive")),
    Entry("array_replay.TraceKeys", nothing, lambda _, r, b, h, t: array_replay.TraceKeys(r, b, h, t), ([MOONCAKE], 4, 16, 1 << 24),
          ("seq", "positive", "positive", "count")),
    Entry("array_replay.sweep_arrays", nothing,
          lambda _, r, bl: array_replay.sweep_arrays(r, bl, 4, hash_block_size=16, jobs=1), ([MOONCAKE], [16]), ("seq", "seq")),
    Entry("production_traces.format_results", nothing, lambda _, r, f: production_traces.format_results(r, f),
          ([], "table"), ("seq", "name")),
    Entry("sweep_grids.sweep_grid", nothing, lambda _, t, bl, g: sweep_grids.sweep_grid(t, bl, g, block_size=4, hash_block_size=16, jobs=1),
          ({"a": [MOONCAKE]}, [16], {"max_num_seqs": [1, 2]}), ("any", "seq", "any")),
    Entry("sweep_grids.format_grid", lambda: sweep_grids.sweep_grid({"a": [MOONCAKE]}, [16], block_size=4, hash_block_size=16, jobs=1),
          lambda rows, r, f: sweep_grids.format_grid(rows if r == "ok" else r, f), ("ok", "table"), ("seq", "name")),
]

# ---------------------------------------------------------------- sampling params, logits processors (mine)


def batch():
    b = logits_processors.PersistentBatch(4, logits_processors.build_logitsprocs(CFG, CPU, False, False), vocab_size=16)
    b.add_request("a", SP(min_p=0.1, logit_bias={3: 1.0}, min_tokens=2, stop_token_ids=[5]), [0], [])
    b.refresh()
    return b


def procs():
    lp = logits_processors.build_logitsprocs(CFG, CPU, False, False)
    for p in lp.all:
        p.update_state(logits_processors.BatchUpdate(
            1, [], [(0, SP(min_p=0.1, logit_bias={3: 1.0}, min_tokens=2, stop_token_ids=[5]), [0], [])], []))
    return lp


def one(kind):
    def make():
        return next(p for p in procs().all if isinstance(p, kind))
    return make


def bu(batch_size=1, removed=(), added=(), moved=()):
    return logits_processors.BatchUpdate(batch_size, list(removed), list(added), list(moved))


LOGITS = torch.zeros(2, 16)
SAMPLING = [
    Entry("SamplingParams temperature", nothing, lambda _, v: SP(temperature=v), (0.5,), ("float",),
          skip={(0, "True"): "", (0, "-1.0"): ""}),
    Entry("SamplingParams top_k", nothing, lambda _, v: SP(top_k=v), (3,), ("int",), skip={(0, "-1"): "vLLM: -1 is off"}),
    Entry("SamplingParams max_tokens", nothing, lambda _, v: SP(max_tokens=v), (3,), ("positive",),
          skip={(0, "None"): "no cap", (0, "10**30"): ""}),
    Entry("SamplingParams min_tokens", nothing, lambda _, v: SP(min_tokens=v), (3,), ("count",),
          skip={(0, "10**30"): ""}),
    Entry("SamplingParams stop_token_ids", nothing, lambda _, v: SP(stop_token_ids=v), ([3],), ("tokens",),
          skip={(0, "None"): "none", (0, "[]"): "", (0, "[2**63]"): ""}),
    Entry("SamplingParams logit_bias", nothing, lambda _, v: SP(logit_bias=v), ({3: 1.0},), ("any",)),
    Entry("SamplingParams thinking_token_budget", nothing, lambda _, v: SP(thinking_token_budget=v), (3,), ("int",),
          skip={(0, "None"): "none", (0, "-1"): "unlimited"}),
    Entry("SamplingParams.validate_for_vocab", lambda: SP(logit_bias={3: 1.0}, stop_token_ids=[5]),
          lambda p, v: p.validate_for_vocab(v), (16,), ("positive",), skip={(0, "10**30"): ""}),
    Entry("SamplingParams.update_from_generation_config", SP,
          lambda p, g, e: p.update_from_generation_config(g, e), ({"eos_token_id": [7]}, 2), ("any", "token"),
          skip={(1, "None"): "none", (1, "2**64"): ""}),
    Entry("logits_processors.PersistentBatch", nothing, lambda _, n, v: logits_processors.PersistentBatch(n, None, v),
          (4, 16), ("positive", "positive"), skip={(0, "10**30"): "", (1, "10**30"): "", (1, "None"): ""}),
    Entry("PersistentBatch.add_request", batch, lambda b, i, p, pr, o: b.add_request(i, p, pr, o),
          ("b", SP(), [1], []), ("str", "any", "tokens", "tokens"), skip={(2, "None"): "no prompt", (2, "[]"): ""}),
    Entry("PersistentBatch.remove_request", batch, lambda b, i: b.remove_request(i), ("a",), ("any",)),
    Entry("PersistentBatch.swap_states", batch, lambda b, i, j: b.swap_states(i, j), (0, 0), ("count", "count")),
    Entry("BatchUpdateBuilder.removed_append", logits_processors.BatchUpdateBuilder, lambda b, i: b.removed_append(i),
          (1,), ("count",), skip={(0, "10**30"): ""}),
    Entry("BatchUpdateBuilder.move", logits_processors.BatchUpdateBuilder,
          lambda b, i, j, d: b.move(i, j, d), (0, 1, logits_processors.MoveDirectionality.SWAP), ("count", "count", "any"),
          skip={(0, "10**30"): "", (1, "10**30"): ""}),
    Entry("BatchUpdateBuilder.get_and_reset", logits_processors.BatchUpdateBuilder, lambda b, n: b.get_and_reset(n), (1,),
          ("count",), skip={(0, "10**30"): ""}),
    Entry("validate_batch_update", nothing, lambda _, b, n: logits_processors.validate_batch_update(b, n),
          (bu(), 4), ("any", "positive"), skip={(1, "None"): "no cap", (1, "10**30"): ""}),
    Entry("MinPLogitsProcessor.update_state", one(logits_processors.MinPLogitsProcessor), lambda p, b: p.update_state(b),
          (None,), ("any",)),
    Entry("MinPLogitsProcessor.update_state added slot", one(logits_processors.MinPLogitsProcessor),
          lambda p, i: p.update_state(bu(2, added=[(i, SP(min_p=0.2), None, [])])), (1,), ("count",)),
    Entry("MinPLogitsProcessor.apply", one(logits_processors.MinPLogitsProcessor), lambda p, x: p.apply(x), (LOGITS[:1],),
          ("tensor",)),
    Entry("MinPLogitsProcessor.get_min_p_by_index", one(logits_processors.MinPLogitsProcessor),
          lambda p, i: p.get_min_p_by_index(i), (0,), ("count",)),
    Entry("LogitBiasLogitsProcessor.update_state added slot", one(logits_processors.LogitBiasLogitsProcessor),
          lambda p, i: p.update_state(bu(2, added=[(i, SP(logit_bias={1: 2.0}), None, [])])), (1,), ("count",)),
    Entry("LogitBiasLogitsProcessor.apply", one(logits_processors.LogitBiasLogitsProcessor), lambda p, x: p.apply(x),
          (LOGITS[:1],), ("tensor",)),
    Entry("MinTokensLogitsProcessor.apply", one(logits_processors.MinTokensLogitsProcessor), lambda p, x: p.apply(x),
          (LOGITS[:1],), ("tensor",)),
    Entry("MinTokensLogitsProcessor.update_state moved", one(logits_processors.MinTokensLogitsProcessor),
          lambda p, i: p.update_state(bu(2, moved=[(0, i, logits_processors.MoveDirectionality.UNIDIRECTIONAL)])), (1,),
          ("count",)),
    Entry("MinTokensLogitsProcessor.apply_with_spec_decode", one(logits_processors.MinTokensLogitsProcessor),
          lambda p, n: p.apply_with_spec_decode(torch.zeros(2, 16), n), ([2],), ("seq",)),
    Entry("sample_logits", procs, lambda lp, x, t: logits_processors.sample_logits(x, lp, t),
          (torch.zeros(1, 16), torch.ones(1)), ("tensor", "tensor")),
    Entry("apply_top_k_top_p", nothing, lambda _, x, k, p: logits_processors.apply_top_k_top_p(x, k, p),
          (torch.zeros(2, 8), torch.tensor([2, 3]), torch.tensor([0.5, 0.9])), ("tensor", "tensor", "tensor"),
          skip={(1, "None"): "off", (2, "None"): "off"}),
    Entry("load_logitsprocs_by_fqcns", nothing, lambda _, f: logits_processors.load_logitsprocs_by_fqcns(f), ([],),
          ("seq",), skip={(0, "None"): "none"}),
    Entry("build_logitsprocs", nothing, lambda _, c, p: logits_processors.build_logitsprocs(CFG, CPU, False, p, c),
          ((), False), ("seq", "bool"), skip={(0, "None"): "None: no custom processors, as in load_logitsprocs_by_fqcns"}),
    Entry("process_dict_updates", dict, lambda d, b: logits_processors.process_dict_updates(d, b, lambda *a: 1),
          (bu(1, added=[(0, SP(), None, [])]),), ("any",)),
]

# ---------------------------------------------------------------- thinking budget (mine)


def holder(cls):
    def make():
        h = cls(RC, 4, 1)
        out = [1]
        h.sync_batch(bu(1, added=[(0, SP(thinking_token_budget=2), [1], out)]))
        h.update_state([out], [[]])
        return h
    return make


def hstate(h):
    from fuzz_support import snap
    return snap(vars(h) if hasattr(h, "__dict__") else h)


THINKING = [
    Entry("thinking_budget.ReasoningConfig", nothing, lambda _, s, e: thinking_budget.ReasoningConfig(s, e),
          ([100], [200]), ("tokens", "tokens"), skip={(0, "[]"): "", (1, "[]"): "", (0, "[2**63]"): "", (1, "[2**63]"): "",
                                     (0, "None"): "None: no markers", (1, "None"): "None: no markers"}),
    Entry("thinking_budget.check_thinking_token_budget", nothing, lambda _, b: thinking_budget.check_thinking_token_budget(b),
          (3,), ("int",), skip={(0, "None"): "", (0, "-1"): ""}),
    Entry("thinking_budget.think_state", nothing, lambda _, t, b: thinking_budget.think_state(t, RC, b), ([1, 100, 3], 2),
          ("tokens", "int"), skip={(0, "[]"): "", (0, "[2**63]"): "", (1, "None"): "", (1, "-1"): "", (1, "10**30"): ""}),
    Entry("thinking_budget.contract_forcings", nothing,
          lambda _, p, o, d, b: thinking_budget.contract_forcings(p, o, d, RC, b), ([100], [1], [2], 2),
          ("tokens", "tokens", "tokens", "int"),
          skip={(0, "None"): "", (0, "[]"): "", (1, "[]"): "", (2, "[]"): "", (0, "[2**63]"): "", (1, "[2**63]"): "",
                (2, "[2**63]"): "", (3, "None"): "", (3, "-1"): "", (3, "10**30"): ""}),
    Entry("thinking_budget.force_index", nothing, lambda _, r, n: thinking_budget.force_index(r, n), (2, 3),
          ("int", "count"), skip={(0, "-1"): "", (0, "10**30"): "", (0, "-(10**30)"): "", (1, "10**30"): ""}),
    Entry("thinking_budget.ThinkingBudgetStateHolder", nothing,
          lambda _, n, s: thinking_budget.ThinkingBudgetStateHolder(RC, n, s), (4, 1), ("positive", "count")),
    Entry("ThinkingBudgetStateHolder.sync_batch", holder(thinking_budget.ThinkingBudgetStateHolder),
          lambda h, b: h.sync_batch(b), (None,), ("any",), state=hstate),
    Entry("ThinkingBudgetStateHolder.update_state", holder(thinking_budget.ThinkingBudgetStateHolder),
          lambda h, o, s: h.update_state(o, s), ([[1, 100]], [[]]), ("seq", "seq"), state=hstate,
          skip={(1, "None"): "no drafts"},
          cases=((0, [["a", "b"]], "accept: vLLM's holder reads the sampler's rows unchecked (09, What can go wrong)"),)),
    Entry("ThinkingBudgetStateHolder.apply_to_logits", holder(thinking_budget.ThinkingBudgetStateHolder),
          lambda h, x: h.apply_to_logits(x, False, [[]]), (torch.zeros(1, 256),), ("tensor",), state=hstate),
    Entry("VllmThinkingBudgetStateHolder.sync_batch", holder(thinking_budget_vllm.VllmThinkingBudgetStateHolder),
          lambda h, b: h.sync_batch(b), (None,), ("any",), state=hstate),
    Entry("VllmThinkingBudgetStateHolder.update_state", holder(thinking_budget_vllm.VllmThinkingBudgetStateHolder),
          lambda h, o, s: h.update_state(o, s), ([[1, 100]], [[]]), ("seq", "seq"), state=hstate,
          skip={(1, "None"): "no drafts"},
          cases=((0, [["a", "b"]], "accept: vLLM's holder reads the sampler's rows unchecked (09, What can go wrong)"),)),
    Entry("VllmThinkingBudgetStateHolder.apply_to_logits", holder(thinking_budget_vllm.VllmThinkingBudgetStateHolder),
          lambda h, x: h.apply_to_logits(x, False, [[]]), (torch.zeros(1, 256),), ("tensor",), state=hstate),
    Entry("thinking_budget_vllm.find_last", nothing, lambda _, t, m, lo: thinking_budget_vllm.find_last(t, m, lo),
          ([1, 2, 3], [2], 0), ("any", "any", "any")),  # a pure search over tokens the holder checked: only no crash
    Entry("thinking_budget.greedy_run", lambda: thinking_budget.ThinkingBudgetStateHolder(RC, 1),
          lambda h, p, w, b: thinking_budget.greedy_run(h, p, w, b), ([1], [100, 5, 6, 7], 2), ("tokens", "tokens", "int"),
          skip={(0, "[]"): "", (1, "[]"): "", (2, "None"): "", (2, "-1"): "", (2, "10**30"): "",
                (0, "None"): "None: no prompt", (1, "None"): "None: nothing wanted"}),
]

# ---------------------------------------------------------------- CUDA graphs (mine)


def dispatcher():
    d = cudagraph.CudagraphDispatcher([1, 2, 4, 8], 4)
    d.initialize_cudagraph_keys("FULL_AND_PIECEWISE")
    return d


CUDAGRAPHS = [
    Entry("cudagraph.as_mode", nothing, lambda _, m: cudagraph.as_mode(m), ("FULL",), ("name",)),
    Entry("cudagraph.min_cg_support", nothing, lambda _, b: cudagraph.min_cg_support(b), (["FlashAttention v2"],), ("seq",)),
    Entry("cudagraph.default_capture_sizes", nothing, lambda _, n: cudagraph.default_capture_sizes(n), (16,),
          ("positive",), skip={(0, "0"): "0: no graphs, as in vLLM"}),
    Entry("cudagraph.derive_capture_sizes", nothing, lambda _, s, t, n: cudagraph.derive_capture_sizes(s, t, n),
          (4, 64, 0), ("positive", "positive", "count"), skip={(1, "10**30"): "", (0, "10**30"): ""}),
    Entry("cudagraph.derive_capture_sizes sizes", nothing,
          lambda _, c: cudagraph.derive_capture_sizes(4, 64, 0, c), ([1, 2, 4],), ("seq",),
          skip={(0, "None"): "default"}),
    Entry("cudagraph.round_capture_sizes_for_spec_decode", nothing,
          lambda _, s, m, q: cudagraph.round_capture_sizes_for_spec_decode(s, m, q), ([1, 2, 4, 8], 8, 2),
          ("seq", "positive", "positive"), skip={(1, "10**30"): "", (2, "10**30"): ""}),
    Entry("cudagraph.resolve_cudagraph_mode", nothing, lambda _, m, s: cudagraph.resolve_cudagraph_mode(m, s),
          ("FULL", cudagraph.AttentionCGSupport.ALWAYS), ("name", "any")),
    Entry("cudagraph.resolve_cudagraph_mode_and_sizes", nothing,
          lambda _, s, t: cudagraph.resolve_cudagraph_mode_and_sizes("FULL", cudagraph.AttentionCGSupport.ALWAYS, s, t),
          (4, 64), ("positive", "positive"), skip={(0, "10**30"): "", (1, "10**30"): ""}),
    Entry("cudagraph.BatchDescriptor", nothing, lambda _, n, r: cudagraph.BatchDescriptor(n, r), (4, 2),
          ("count", "count"), skip={(1, "None"): "unknown", (0, "10**30"): "", (1, "10**30"): ""}),
    Entry("cudagraph.LoRASettings", nothing, lambda _, n: cudagraph.LoRASettings(n).cases(), (2,), ("positive",)),
    Entry("LoRASettings.effective_count", nothing, lambda _, n: cudagraph.LoRASettings(4).effective_count(n), (2,),
          ("count",)),
    Entry("cudagraph.CudagraphDispatcher", nothing, lambda _, s, n: cudagraph.CudagraphDispatcher(s, n), ([1, 2, 4], 4),
          ("seq", "positive")),
    Entry("CudagraphDispatcher.padded_size", dispatcher, lambda d, n: d.padded_size(n), (3,), ("positive",)),
    Entry("CudagraphDispatcher.initialize_cudagraph_keys", dispatcher,
          lambda d, m, q: d.initialize_cudagraph_keys(m, q), ("FULL", 1), ("name", "positive")),
    Entry("CudagraphDispatcher.dispatch", dispatcher, lambda d, n, u, a: d.dispatch(n, u, False, a), (3, False, 0),
          ("positive", "bool", "count")),
    Entry("cudagraph.set_forward_context", nothing,
          lambda _, m, b: cudagraph.set_forward_context(m, b).__enter__(), ("NONE", None), ("name", "any"),
          skip={(1, "None"): ""}),
    Entry("cudagraph.capture_cudagraphs", nothing,
          lambda _, d: cudagraph.capture_cudagraphs(lambda *a, **k: None, d), (dispatcher(),), ("any",)),
]

# ---------------------------------------------------------------- KV events (03a)
STORED = kv_events.BlockStored([1, 2], None, [1, 2, 3, 4], 2, None, "GPU", None)
BATCH = kv_events.KVEventBatch(0.0, [STORED], 0)
PAYLOAD = kv_events.encode_batch(BATCH)


def index():
    i = kv_events.KVIndex(2)
    i.apply("e", 0, PAYLOAD)
    return i


def stored(**kw):
    return kv_events.BlockStored(**{"block_hashes": [3], "parent_block_hash": 2, "token_ids": [5, 6], "block_size": 2,
                                    "lora_id": None, "medium": "GPU", "lora_name": None, **kw})


EVENTS = [
    Entry("kv_events.KVIndex", nothing, lambda _, bs, a, f, s: kv_events.KVIndex(bs, a, f, s),
          (2, "sha256", "int", None), ("positive", "name", "name", "str"), skip={(0, "10**30"): "", (3, "None"): "unset"}),
    Entry("KVIndex.apply", index, lambda i, st, sq, b: i.apply(st, sq, b), ("e", 1, kv_events.encode_batch(
          kv_events.KVEventBatch(0.0, [stored()], 0))), ("str", "count", "any")),
    Entry("KVIndex.apply event", index, lambda i, e: i.apply("e", 1, kv_events.KVEventBatch(0.0, [e], 0)), (stored(),),
          ("any",)),
    Entry("KVIndex.apply BlockStored.block_hashes", index, lambda i, v: i.apply("e", 1, kv_events.KVEventBatch(
          0.0, [stored(block_hashes=v)], 0)), ([3],), ("seq",), skip={(0, "[10**30]"): "", (0, "[-1]"): ""}),
    Entry("KVIndex.apply BlockStored.token_ids", index, lambda i, v: i.apply("e", 1, kv_events.KVEventBatch(
          0.0, [stored(token_ids=v)], 0)), ([5, 6],), ("tokens",)),
    Entry("KVIndex.apply BlockStored.block_size", index, lambda i, v: i.apply("e", 1, kv_events.KVEventBatch(
          0.0, [stored(block_size=v)], 0)), (2,), ("positive",)),
    Entry("KVIndex.apply BlockStored.lora_id", index, lambda i, v: i.apply("e", 1, kv_events.KVEventBatch(
          0.0, [stored(lora_id=v)], 0)), (None,), ("any",)),
    Entry("KVIndex.apply BlockRemoved", index, lambda i, v: i.apply("e", 1, kv_events.KVEventBatch(
          0.0, [kv_events.BlockRemoved(v, "GPU")], 0)), ([1],), ("seq",)),
    Entry("KVIndex.prompt_hashes", index, lambda i, p, s: i.prompt_hashes(p, cache_salt=s), ([1, 2, 3, 4], None),
          ("tokens", "str"), skip={(1, "None"): "no salt"}),
    Entry("KVIndex.cached_prefix", index, lambda i, h: i.cached_prefix(h), ([1, 2],), ("seq",)),
    Entry("KVIndex.longest_prefix", index, lambda i, p: i.longest_prefix(p), ([1, 2, 3, 4],), ("tokens",)),
    Entry("kv_events.decode_batch", nothing, lambda _, p, f: kv_events.decode_batch(p, f), (PAYLOAD, "int"),
          ("any", "name")),
    Entry("kv_events.encode_batch", nothing, lambda _, b: kv_events.encode_batch(b), (BATCH,), ("any",)),
    Entry("kv_events.encode_batch event", nothing, lambda _, e: kv_events.encode_batch(kv_events.KVEventBatch(0.0, [e])),
          (STORED,), ("any",)),
    Entry("kv_events.encode_batch ts", nothing, lambda _, t: kv_events.encode_batch(kv_events.KVEventBatch(t, [])),
          (0.0,), ("float",), skip={(0, "True"): "", (0, "-1.0"): "", (0, "inf"): "", (0, "1e+308"): ""}),
    Entry("kv_events.encode_batch rank", nothing, lambda _, r: kv_events.encode_batch(kv_events.KVEventBatch(0.0, [], r)),
          (0,), ("count",), skip={(0, "None"): "unset", (0, "10**30"): ""}),
    Entry("kv_events.external_block_hash", nothing, lambda _, d, f: kv_events.external_block_hash(d, f),
          (b"x" * 32, "int"), ("any", "name")),
    Entry("kv_events.event_from_json", nothing, lambda _, o, f: kv_events.event_from_json(o, f),
          (kv_events.event_to_json(STORED), "int"), ("any", "name")),
    Entry("kv_events.event_to_json", nothing, lambda _, e: kv_events.event_to_json(e), (STORED,), ("any",)),
    Entry("kv_events.wire_events", nothing, lambda _, e, f: kv_events.wire_events(e, f), ([], "int"), ("seq", "name")),
    Entry("kv_events.lora_id", dict, lambda d, n, p: kv_events.lora_id(d, n, p), ("x", "p"), ("str", "str")),
]

# ---------------------------------------------------------------- hybrid groups, Mamba (04a, 04b)
SPECS = [hybrid.FullAttentionSpec(4), hybrid.SlidingWindowSpec(4, 8)]


def hybrid_manager(specs=SPECS):
    def make():
        m = hybrid.HybridKVCacheManager(specs, 16, max_model_len=64)
        r = hybrid.HybridRequest("a", list(range(9)))
        m.allocate_slots(r, 9)
        return m, r
    return make


MAMBA_SPECS = [mamba.MambaSpec(4), hybrid.FullAttentionSpec(4)]
HYBRID_CONFIG = {"op": "config", "num_blocks": 16, "groups": [{"kind": "full", "block_size": 4}, {"kind": "sliding_window", "block_size": 4, "sliding_window": 8}]}


def hybrid_replayer():
    t = hybrid_replay.HybridTraceReplayer()
    t.apply(HYBRID_CONFIG)
    return t


def hybrid_driver():
    d = hybrid_replay.HybridTraceDriver(hybrid_replay.KVRefHybridAdapter)
    d.apply(HYBRID_CONFIG)
    return d


hreq = lambda: hybrid.HybridRequest("b", list(range(6)))
HYBRID = [
    Entry("hybrid.FullAttentionSpec", nothing, lambda _, b: hybrid.FullAttentionSpec(b), (4,), ("positive",),
          skip={(0, "10**30"): ""}),
    Entry("hybrid.SlidingWindowSpec", nothing, lambda _, b, w: hybrid.SlidingWindowSpec(b, w), (4, 8),
          ("positive", "positive"), skip={(0, "10**30"): "", (1, "10**30"): ""}),
    Entry("hybrid.ChunkedLocalAttentionSpec", nothing, lambda _, b, w: hybrid.ChunkedLocalAttentionSpec(b, w), (4, 8),
          ("positive", "positive"), skip={(0, "10**30"): "", (1, "10**30"): ""}),
    Entry("hybrid.HybridKVCacheManager", nothing, lambda _, s, n: hybrid.HybridKVCacheManager(s, n), (SPECS, 16),
          ("seq", "positive"), skip={(1, "10**30"): "builds every block up front, like BlockPool"}),
    Entry("hybrid.HybridKVCacheManager events", nothing,
          lambda _, e: hybrid.HybridKVCacheManager(SPECS, 16, enable_kv_cache_events=e), (True,), ("bool",)),
    Entry("hybrid.HybridBlockPool", nothing, lambda _, n, c, e: hybrid.HybridBlockPool(n, c, e), (8, True, True),
          ("positive", "bool", "bool"), skip={(0, "10**30"): "builds every block up front, like BlockPool"}),
    Entry("HybridKVCacheManager.allocate_slots", hybrid_manager(),
          lambda c, r, n: c[0].allocate_slots(hreq() if r == "ok" else r, n), ("ok", 6), ("any", "count")),
    Entry("HybridKVCacheManager.allocate_slots computed", hybrid_manager(),
          lambda c, n: c[0].allocate_slots(hreq(), 2, n), (0,), ("count",)),
    Entry("HybridKVCacheManager.allocate_slots blocks", hybrid_manager(),
          lambda c, b: c[0].allocate_slots(hreq(), 2, 0, b), ([[], []],), ("seq",), skip={(0, "None"): "none"}),
    Entry("HybridKVCacheManager.get_computed_blocks", hybrid_manager(),
          lambda c, r: c[0].get_computed_blocks(hreq() if r == "ok" else r), ("ok",), ("any",)),
    Entry("HybridKVCacheManager.free", hybrid_manager(), lambda c, r: c[0].free(c[1] if r == "ok" else r), ("ok",),
          ("any",)),
    Entry("HybridKVCacheManager.get_block_ids", hybrid_manager(), lambda c, r: c[0].get_block_ids(r), ("a",), ("any",)),
    Entry("HybridKVCacheManager.from_config", nothing, lambda _, c: hybrid.HybridKVCacheManager.from_config(c),
          (HYBRID_CONFIG,), ("any",)),
    Entry("hybrid.HybridRequest", nothing, lambda _, i, t: hybrid.HybridRequest(i, t), ("a", [1, 2]), ("str", "tokens")),
    Entry("hybrid.resolve_block_sizes", nothing, lambda _, b: hybrid.resolve_block_sizes(b), ([4, 8],), ("seq",)),
    Entry("hybrid.group_block_hashes", nothing, lambda _, h, a, b: hybrid.group_block_hashes(h, a, b),
          ([b"a" * 32, b"b" * 32], 4, 8), ("seq", "positive", "positive"), skip={(1, "10**30"): "", (2, "10**30"): ""}),
    Entry("hybrid.hash_with_group_id", nothing, lambda _, h, g: hybrid.hash_with_group_id(h, g), (b"a" * 32, 1),
          ("any", "count"), skip={(1, "10**30"): ""}),
    Entry("hybrid.split_spec_groups", nothing, lambda _, s: hybrid.split_spec_groups(s), (SPECS,), ("seq",)),
    Entry("hybrid.max_admission_blocks_per_request", nothing,
          lambda _, s, t, m: hybrid.max_admission_blocks_per_request(s, t, m), (SPECS[1], 16, 64),
          ("any", "positive", "positive"), skip={(1, "10**30"): "", (2, "10**30"): ""}),
    Entry("hybrid.spec_from_group", nothing, lambda _, g: hybrid.spec_from_group(g, 0), (HYBRID_CONFIG["groups"][1],),
          ("any",)),
    Entry("hybrid_replay.validate_hybrid_op", nothing, lambda _, o: hybrid_replay.validate_hybrid_op(o),
          ({"op": "add", "id": "a", "prompt": [1, 2]},), ("any",)),
    Entry("HybridTraceReplayer.apply", hybrid_replayer, lambda t, o: t.apply(o),
          ({"op": "add", "id": "a", "prompt": [1, 2]},), ("any",)),
    Entry("HybridTraceReplayer.apply config", hybrid_replay.HybridTraceReplayer, lambda t, o: t.apply(o), (HYBRID_CONFIG,),
          ("any",)),
    Entry("hybrid_replay.replay_hybrid", nothing, lambda _, o: hybrid_replay.replay_hybrid(o), ([HYBRID_CONFIG],), ("any",)),
    Entry("HybridTraceDriver.apply", hybrid_driver, lambda d, o: d.apply(o), ({"op": "add", "id": "a", "prompt": [1, 2]},),
          ("any",)),
    Entry("hybrid_replay.hybrid_replay_stats", nothing, lambda _, o: hybrid_replay.hybrid_replay_stats(o), ([HYBRID_CONFIG],),
          ("seq",)),
    Entry("conformance.check_recorded", nothing, lambda _, d: conformance.check_recorded(d, [HYBRID_CONFIG]),
          ([{"op": "config", "free_queue": list(range(1, 16)), "num_free": 15}],), ("seq",)),
    Entry("mamba.MambaSpec", nothing, lambda _, b, a, m: mamba.MambaSpec(b, a, m), (4, None, "align"),
          ("positive", "positive", "name"), skip={(0, "10**30"): "", (1, "10**30"): "", (1, "None"): "no checkpoint",
                                                  (2, "None"): "unset: align"}),
    Entry("HybridKVCacheManager(Mamba).allocate_slots", hybrid_manager(MAMBA_SPECS),
          lambda c, r, n: c[0].allocate_slots(hreq() if r == "ok" else r, n), ("ok", 6), ("any", "count")),
    Entry("HybridKVCacheManager(Mamba).get_computed_blocks", hybrid_manager(MAMBA_SPECS),
          lambda c, r: c[0].get_computed_blocks(hreq() if r == "ok" else r), ("ok",), ("any",)),
    Entry("HybridKVCacheManager(Mamba).free", hybrid_manager(MAMBA_SPECS), lambda c, r: c[0].free(c[1] if r == "ok" else r),
          ("ok",), ("any",)),
]

# ---------------------------------------------------------------- hybrid hits (issue 32): a hit is what a lookup finds now
HIT_MANAGERS = {  # each with the prompt length at which it caches a state a longer prompt hits
    "hybrid": (lambda: hybrid.HybridKVCacheManager([hybrid.SlidingWindowSpec(4, 8), hybrid.FullAttentionSpec(4)], 24), 17),
    "mamba": (lambda: hybrid.HybridKVCacheManager([mamba.MambaSpec(4), hybrid.FullAttentionSpec(4)], 24,
                                                  retention_interval=8), 16),
    "mamba-checkpoints": (lambda: hybrid.HybridKVCacheManager([mamba.MambaSpec(8, 8), hybrid.FullAttentionSpec(8)], 24,
                                                              prefix_match_unit=2), 17),
}


def hit_context(kind):
    "`a` computed and cached its prompt, `u` holds blocks never cached, `o` another prompt's; `b` extends `a`'s prompt."
    def make():
        build, length = HIT_MANAGERS[kind]
        m, a = build(), hybrid.HybridRequest("a", list(range(length)))
        m.allocate_slots(a, length); a.num_computed_tokens = length
        m.new_step_starts()  # a Mamba state cached in this step is hit from the next one
        m.allocate_slots(hybrid.HybridRequest("u", [900, 901, 902]), 3)
        m.allocate_slots(hybrid.HybridRequest("o", [500 + i for i in range(17)]), 17)
        b = hybrid.HybridRequest("b", a.all_token_ids + [5])
        return m, b, *m.get_computed_blocks(b)[:2]
    return make


def with_first_hit(hits, block):
    "The hits with the first real block of the group that has one replaced by `block`."
    g = next(g for g, group in enumerate(hits) if any(not x.is_null for x in group))
    i = next(i for i, x in enumerate(hits[g]) if not x.is_null)
    return [list(group) if k != g else group[:i] + [block] + group[i + 1:] for k, group in enumerate(hits)]


def hit_call(ctx, how):
    "allocate_slots for `b` with its true hits, or with them corrupted as `how` says."
    m, b, hits, n = ctx
    held = {x for t in m.coordinator.single_type_managers for r in ("a", "u") for x in t.req_to_blocks.get(r, ())}
    if how == "ok": return m.allocate_slots(b, b.num_tokens - n, n, hits)
    if how == "fresh hit tokens": return m.allocate_slots(hybrid.HybridRequest("f", [700 + i for i in range(17)]), 1, 8)
    if how == "twice":
        g = next(g for g, group in enumerate(hits) if sum(not x.is_null for x in group) >= 2)
        return m.allocate_slots(b, 1, n, [list(x) if k != g else [x[0]] * len(x) for k, x in enumerate(hits)])
    if how == "no blocks": return m.allocate_slots(b, 1, n, None)
    if how == "no tokens": return m.allocate_slots(b, 1, 0, hits)
    block = {"never cached": m.block_pool.free_block_queue.fake_tail.prev_free_block,
             "another request's": next(x for x in m.block_pool.blocks if x.block_hash is not None and x not in held),
             "unhashed of another": m.block_pool.blocks[m.get_block_ids("u")[-1][0]]}[how]
    return m.allocate_slots(b, 1, n, with_first_hit(hits, block))


HIT_CASES = tuple((0, how, "refuse") for how in ("never cached", "another request's", "twice", "unhashed of another",
                                                 "no blocks", "no tokens", "fresh hit tokens"))
HYBRID_HITS = [Entry(f"HybridKVCacheManager({kind}).allocate_slots hits", hit_context(kind), hit_call, ("ok",), (None,),
                     cases=HIT_CASES) for kind in HIT_MANAGERS]

# ---------------------------------------------------------------- vLLM releases (05a)
P033 = releases.profile_for_version("0.33.0")
VECTORS = ROOT / "golden" / "versions" / "0.33.0" / "block-hashes.json"


def release_trace_file():
    "A release trace of its own (another entry rewrites `t.jsonl` with bad ops)."
    TMP.mkdir(parents=True, exist_ok=True)
    (TMP / "release.jsonl").write_text(json.dumps(CONFIG_OP) + "\n")


RELEASES = [
    Entry("releases.parse_version", nothing, lambda _, v: releases.parse_version(v), ("0.19.1",), ("name",)),
    Entry("releases.profile_for_version", nothing, lambda _, v: releases.profile_for_version(v), ("0.19.1",), ("name",)),
    Entry("releases.siphash13", nothing, lambda _, a, b, d: releases.siphash13(a, b, d), (1, 2, b"x"),
          ("count", "count", "any")),
    Entry("releases.python_hash", nothing, lambda _, o, s: releases.python_hash(o, s), ((1, 2), 0), ("any", "count")),
    Entry("releases.release_hash_fn", nothing, lambda _, p, a, s: releases.release_hash_fn(p, a, s), (P033, "sha256", "0"),
          ("any", "name", "str")),
    Entry("releases.release_none_hash", nothing, lambda _, p, a, s: releases.release_none_hash(p, a, s),
          (P033, "sha256", None), ("any", "name", "str"), skip={(2, "None"): "unset"}),
    Entry("releases.release_block_hashes", nothing, lambda _, p, t, b, a: releases.release_block_hashes(p, t, b, a),
          (P033, list(range(8)), 4, "sha256"), ("any", "tokens", "positive", "name"),
          skip={(2, "10**30"): "", (3, "None"): "the release default"}),
    Entry("releases.release_block_hashes salt", nothing,
          lambda _, s, n: releases.release_block_hashes(P033, list(range(8)), 4, cache_salt=s, num_prompt_tokens=n),
          ("s", None), ("str", "count"), skip={(0, "None"): "no salt", (1, "None"): "all prompt", (1, "10**30"): ""}),
    Entry("releases.release_extra_keys", nothing, lambda _, s, e: releases.release_extra_keys(P033, s, e, cache_salt="x"),
          (0, 4), ("count", "count"), skip={(0, "10**30"): "", (1, "10**30"): ""}),
    Entry("releases.release_event_block_hashes", nothing, lambda _, p, h: releases.release_event_block_hashes(p, h),
          (P033, [b"a" * 32]), ("any", "seq")),
    Entry("releases.ReleaseKVCacheManager", nothing, lambda _, n, b, p: releases.ReleaseKVCacheManager(n, b, p),
          (8, 4, P033), ("positive", "positive", "any"), skip={(0, "10**30"): "", (1, "10**30"): ""}),
    Entry("releases.replay_release", nothing, lambda _, o, v: list(releases.replay_release(o, v)), (TRACE, "0.19.1"),
          ("any", "name")),
    Entry("releases.check_release_vectors", nothing, lambda _, p: releases.check_release_vectors(p), (VECTORS,),
          ("path",)),
    Entry("releases.diagnose", nothing, lambda _, p: releases.diagnose(p), (VECTORS,), ("path",)),
    Entry("releases.load_release_trace", release_trace_file, lambda _, p: releases.load_release_trace(p),
          (TMP / "release.jsonl",), ("path",)),
]

# ---------------------------------------------------------------- router conformance (07d)
ROUTER_TRACE = [CONFIG_OP, {"op": "add", "id": "a", "prompt": list(range(9))}, {"op": "schedule", "id": "a"}]
ENDPOINTS = itertools.count()


def publisher(rank, buffer_steps, hwm):
    "An EventPublisher on a fresh in-process endpoint (no port bound), closed again."
    router_conformance.EventPublisher(f"inproc://kvref-fuzz-{next(ENDPOINTS)}", None, rank, "", buffer_steps, hwm).close()


ROUTER = [
    Entry("router_conformance.op_batches", nothing, lambda _, t, f, r: list(router_conformance.op_batches(t, f, r)),
          (ROUTER_TRACE, "int", None), ("any", "name", "count"), skip={(2, "None"): "unset", (2, "10**30"): ""}),
    Entry("router_conformance.event_records", nothing, lambda _, t: list(router_conformance.event_records(t)),
          (ROUTER_TRACE,), ("any",)),
    Entry("router_conformance.offset_endpoint_port", nothing,
          lambda _, e, r: router_conformance.offset_endpoint_port(e, r), ("tcp://*:5557", 1), ("str", "count"),
          skip={(1, "10**30"): ""}),
    Entry("router_conformance.EventPublisher", nothing,
          lambda _, r, b, h: publisher(r, b, h),
          (0, 10, 10), ("count", "count", "count"), skip={(0, "10**30"): "", (1, "10**30"): "", (2, "10**30"): ""}),
    Entry("router_conformance.check_router", nothing, lambda _, f, t, fm: router_conformance.check_router(f, t, fm),
          (router_conformance.ExampleRouter, [ROUTER_TRACE], "int"), ("any", "any", "name")),
    Entry("router_conformance.check_router prompts", nothing,
          lambda _, p: router_conformance.check_router(router_conformance.ExampleRouter, [ROUTER_TRACE], "int", p),
          (None,), ("seq",), skip={(0, "None"): "every prompt"}),
    Entry("router_conformance.trace_prompts", nothing, lambda _, s, o: router_conformance.trace_prompts(s, o),
          ("e", ROUTER_TRACE), ("str", "any")),
    Entry("router_conformance.reference_router", nothing, lambda _, c: router_conformance.reference_router(c),
          ({"block_size": 4},), ("any",)),
    Entry("router_conformance.ExampleRouter", nothing, lambda _, c: router_conformance.ExampleRouter(c),
          ({"block_size": 4},), ("any",)),
]

# ---------------------------------------------------------------- wire layouts (03a, 05a) and the live audit (07e)
W032 = releases.wire_schema("0.32.0")
AUDIT_STREAM = ROOT / "golden" / "events" / "audit" / "engine-a.jsonl"


def engine_audit():
    return live_audit.EngineAudit(live_audit.EngineConfig("a", "0.33.0", "sha256", 4))


WIRE = [
    Entry("releases.wire_schema", nothing, lambda _, v: releases.wire_schema(v), ("0.32.0",), ("name",)),
    Entry("kv_events.encode_batch schema", nothing, lambda _, b, w: kv_events.encode_batch(b, w), (BATCH, W032), ("any", "any")),
    Entry("kv_events.decode_batch schema", nothing, lambda _, p, w: kv_events.decode_batch(p, "int", "b", w),
          (kv_events.encode_batch(BATCH, W032), W032), ("any", "any"), skip={(1, "None"): "0.33's layout, lenient"}),
    Entry("live_audit.EngineConfig", nothing, lambda _, n, v, a, b, s: live_audit.EngineConfig(n, v, a, b, s),
          ("a", "0.33.0", "sha256", 4, None), ("str", "name", "name", "positive", "str"),
          skip={(0, "3"): "", (4, "None"): "unset"}),
    Entry("EngineAudit.check", engine_audit, lambda e, q, p: e.check(q, p), (0, next(live_audit.read_stream(AUDIT_STREAM))[1]),
          ("count", "any"), state=lambda e: (dict(e.counts), dict(e.findings), e.next_seq)),
    Entry("live_audit.read_stream", nothing, lambda _, p: list(live_audit.read_stream(p)), (AUDIT_STREAM,), ("path",)),
    Entry("live_audit.sharing_causes", nothing, lambda _, a, b: live_audit.sharing_causes(a, b),
          (live_audit.EngineConfig("a", "0.33.0", "sha256", 4),) * 2, ("any", "any")),
]

ENTRIES = (ALLOCATOR + HASHING + CONTRACT_ENTRIES + PICTURES + SCHEDULING + SAMPLING + THINKING + CUDAGRAPHS + EVENTS
           + HYBRID + HYBRID_HITS + RELEASES + ROUTER + WIRE)
