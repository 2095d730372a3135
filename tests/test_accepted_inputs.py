"""Issue 32, the accepted inputs: every bad-but-plausible value a public entry point of the model chapters takes
without an exception has a decided verdict, and each verdict holds.

The menu (`MENU`) is fixed: numpy integer scalars and arrays, whole floats (3.0), bools for counts, huge ints (10**18),
negative ints, strings of digits, bytes for a str, nested lists, empty containers, None. It is tried on every
argument of the entry points in `fuzz_table.py` that belong to the model chapters (hashing, free queue, block pool,
managers, hybrid, Mamba, scheduler, events, sampling, thinking budget, CUDA graphs) and on a few more (`EXTRA`).
A value that raises is fine (`test_public_api_fuzz.py` checks how). A value that goes through must have a verdict:

- "refused" rows are in `REFUSED`: each raises a named `TypeError`/`ValueError` and changes nothing;
- every other accepted value is "accepted as vLLM 0.33 does: <where the chapter says so>", or "in range: <why>" for
  a value inside the argument's documented domain (None as a documented default, an empty list, an int with no upper
  bound in vLLM either).

`test_every_accepted_input_has_a_verdict` fails on a value accepted with no verdict (a new accepted kind: decide it
against vLLM 0.33's source, then add a rule) and on a verdict that no longer applies.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from fuzz_support import ALIASES, Entry, snap
from fuzz_table import ENTRIES, SP
from kvref.core import block_pool, fast_allocator, hybrid, kv_cache_manager, scheduler
from kvref.distributed import kv_events
from kvref.kv_offload import OffloadConfig
from kvref.oracle import workloads
from kvref.sample import sampling_params

HUGE = 10**18
MENU: dict[str, list] = {
    "count": [np.int64(3), np.int32(3), 3.0, True, False, HUGE, -1, "3", None],
    "positive": [np.int64(3), np.int32(3), 3.0, True, HUGE, -1, "3", None],
    "int": [np.int64(3), 3.0, True, HUGE, "3", None],
    "token": [np.int64(3), 3.0, True, HUGE, -1, "3", None],
    "tokens": [[np.int64(3)], np.array([1, 2]), [3.0], [True], [[1]], [], (1, 2), "12", b"\x01\x02", None, [HUGE]],
    "str": [b"a", 3, np.int64(3), "", None, ["a"]],
    "name": [b"sha256", "SHA256", "", None],
    "bool": [0, 1, np.bool_(True), "True", None],
    "float": [np.float64(0.5), 1, True, "1.0", None, -1.0],
    "seq": [[], [[]], (), None, "ab"],
    "any": [None, [], np.int64(1), b"x"],
}

# The model chapters' entry points in the fuzz table (the oracle, CLI and pictures chapters are fuzzed elsewhere).
SCOPE = re.compile(r"^(free_queue|FreeKVCacheBlockQueue|BlockPool|kv_cache_manager|KVCacheManager|Request\.|hashing|"
                   r"fast_hashing|hybrid\.|HybridKVCacheManager|mamba|scheduler|Scheduler|kv_events|KVIndex|SamplingParams|"
                   r"logits_processors|PersistentBatch|BatchUpdateBuilder|validate_batch_update|MinP|LogitBias|MinTokens|"
                   r"sample_logits|apply_top_k_top_p|thinking_budget|ThinkingBudget|VllmThinking|cudagraph|LoRASettings|"
                   r"Cudagraph)")


def _sp(field): return lambda _, v: sampling_params.SamplingParams(**{field: v})


def _fast_manager(): return fast_allocator.FastKVCacheManager(16, 4, max_model_len=64)


EXTRA = [Entry(f"OffloadConfig.{f}", lambda: None, lambda _, v, f=f: OffloadConfig(**{"cpu_chunks": 4, f: v}), (4,), (k,))
         for f, k in (("cpu_chunks", "count"), ("store_threshold", "count"), ("max_tracker_size", "count"),
                      ("block_size", "positive"), ("offload_prompt_only", "bool"), ("eviction_policy", "name"),
                      ("worker", "name"))]
EXTRA += [Entry(f"SchedulerConfig.{f}", lambda: None, lambda _, v, f=f: scheduler.SchedulerConfig(**{f: v}), (d,), (k,))
          for f, d, k in (("max_num_batched_tokens", 64, "positive"), ("max_num_seqs", 4, "positive"),
                          ("long_prefill_token_threshold", 0, "count"), ("enable_chunked_prefill", True, "bool"),
                          ("scheduler_reserve_full_isl", True, "bool"), ("async_scheduling", False, "bool"),
                          ("policy", "fcfs", "name"))]
EXTRA += [
    Entry("FastKVCacheManager.allocate_slots", _fast_manager,
          lambda m, n, c, la: m.allocate_slots(kv_cache_manager.Request("b", list(range(6))), n, c, num_lookahead_tokens=la),
          (6, 0, 0), ("positive", "count", "count")),
    Entry("KVCacheManager max_model_len", lambda: None, lambda _, n: kv_cache_manager.KVCacheManager(16, 4, max_model_len=n),
          (64,), ("positive",)),
    *(Entry(f"SamplingParams.{f}", lambda: None, _sp(f), (d,), (k,)) for f, d, k in (
        ("top_p", 0.5, "float"), ("min_p", 0.5, "float"), ("presence_penalty", 0.5, "float"), ("n", 1, "positive"),
        ("seed", 1, "int"), ("max_tokens", 8, "positive"), ("min_tokens", 1, "count"))),
]



def _manager():
    m = kv_cache_manager.KVCacheManager(16, 4, max_model_len=64)
    m.allocate_slots(kv_cache_manager.Request("a", list(range(9))), 9)
    return m


def _hybrid():
    m = hybrid.HybridKVCacheManager([hybrid.FullAttentionSpec(4), hybrid.SlidingWindowSpec(4, 8)], 16, max_model_len=64)
    m.allocate_slots(hybrid.HybridRequest("a", list(range(9))), 9)
    return m


for _make, _cls, _name in ((_manager, kv_cache_manager.Request, "KVCacheManager"), (_fast_manager, kv_cache_manager.Request, "FastKVCacheManager"),
                           (_hybrid, hybrid.HybridRequest, "HybridKVCacheManager")):
    for _kw, _ok, _kind in (("num_new_tokens", 6, "positive"), ("num_lookahead_tokens", 0, "count"),
                            ("full_sequence_must_fit", False, "bool"), ("delay_cache_blocks", False, "bool"),
                            ("reserved_blocks", 0, "count")):
        if _name == "HybridKVCacheManager" and _kw in ("delay_cache_blocks", "reserved_blocks"): continue
        EXTRA.append(Entry(f"{_name}.allocate_slots {_kw}", _make,
                           lambda m, v, _kw=_kw, _cls=_cls: m.allocate_slots(_cls("b", list(range(6))), **{"num_new_tokens": 6, _kw: v}),
                           (_ok,), (_kind,), skip={(0, "10**30"): ""}))
for _field, _ok, _kind in (("cache_salt", "s", "str"), ("num_computed_tokens", 0, "count"), ("num_output_placeholders", 0, "count")):
    EXTRA.append(Entry(f"Request.{_field}", lambda: None,
                       lambda _, v, _f=_field: kv_cache_manager.Request("a", [1, 2, 3], **{_f: v}), (_ok,), (_kind,)))
    EXTRA.append(Entry(f"HybridRequest.{_field}", lambda: None,
                       lambda _, v, _f=_field: hybrid.HybridRequest("a", [1, 2, 3], **{_f: v}), (_ok,), (_kind,)))
EXTRA.append(Entry("HybridRequest.shared_prefix_boundary", lambda: None,
                   lambda _, v: hybrid.HybridRequest("a", [1, 2, 3], shared_prefix_boundary=v), (0,), ("count",)))


def _sched():
    s = scheduler.Scheduler(kv_cache_manager.KVCacheManager(16, 4, max_model_len=32))
    s.add_request(workloads.RequestSpec("a", [1, 2, 3, 4, 5], [6, 7]))
    s.step()
    return s


for _field, _ok, _kind in (("id", "b", "str"), ("prompt", [1, 2, 3], "tokens"), ("output", [4], "tokens"), ("cache_salt", "s", "str"),
                           ("after", "a", "str"), ("priority", 0, "int"), ("arrival", 0, "count"), ("think", 0, "count"),
                           ("max_tokens", 1, "positive")):
    EXTRA.append(Entry(f"Scheduler.add_request RequestSpec.{_field}", _sched,
                       lambda s, v, _f=_field: s.add_request(workloads.RequestSpec(**{"id": "b", "prompt": [1, 2, 3], "output": [4], _f: v})),
                       (_ok,), (_kind,)))

TARGETS = [e for e in ENTRIES if SCOPE.match(e.name) and "release" not in e.name and "replay" not in e.name] + EXTRA

# Verdicts by the kind of value, whichever entry point takes it (the reason says where the chapter says so).
NUMPY_TOKENS = ("accepted as vLLM 0.33 does: token ids are the ints they stand for (01 'Token ids'; 04 'Request'): "
                "vLLM's tokenizer hands its Request a list[int], and kvref converts numpy ids to that list")
BY_VALUE = {
    repr([np.int64(3)]): NUMPY_TOKENS, repr(np.array([1, 2])): NUMPY_TOKENS,
    repr((1, 2)): "in range: a sequence of ints, as vLLM's Sequence[int] (01 'Token ids')",
    repr([HUGE]): "in range: a token id in [0, 2**64), the range 01 checks",
    repr(HUGE): "in range: a count or size with no upper limit in vLLM 0.33 either",
    repr([]): "in range: empty (no tokens, items, events or sizes yet) is a value vLLM 0.33 takes too",
    repr(()): "in range: empty (no tokens, items, events or sizes yet) is a value vLLM 0.33 takes too",
}
HOLDER_ROWS = "accepted as vLLM 0.33 does: its holder reads the sampler's rows unchecked (09, What can go wrong)"
# Verdicts for one (entry, argument, value).
BY_CALL = {
    ("hashing.hash_block_tokens", 0, "np.int64(1)"): "accepted as vLLM 0.33 does: it hashes whatever parent it is given (01, Hashing one block)",
    ("hashing.hash_block_tokens", 0, "b'x'"): "accepted as vLLM 0.33 does: it hashes whatever parent it is given (01, Hashing one block)",
    ("BlockPool.get_cached_block", 0, "b'x'"): "in range: a bytes hash that no block has: a miss",
    ("SamplingParams temperature", 0, "np.float64(0.5)"): "accepted as vLLM 0.33 does: float settings kept as given (07b, What can go wrong)",
    ("SamplingParams temperature", 0, "1"): "accepted as vLLM 0.33 does: float settings kept as given (07b, What can go wrong)",
    ("SamplingParams.top_p", 0, "np.float64(0.5)"): "accepted as vLLM 0.33 does: float settings kept as given (07b, What can go wrong)",
    ("SamplingParams.min_p", 0, "np.float64(0.5)"): "accepted as vLLM 0.33 does: float settings kept as given (07b, What can go wrong)",
    ("SamplingParams.presence_penalty", 0, "np.float64(0.5)"): "accepted as vLLM 0.33 does: float settings kept as given (07b, What can go wrong)",
    ("SamplingParams.top_p", 0, "1"): "accepted as vLLM 0.33 does: float settings kept as given (07b, What can go wrong)",
    ("SamplingParams.min_p", 0, "1"): "accepted as vLLM 0.33 does: float settings kept as given (07b, What can go wrong)",
    ("SamplingParams.presence_penalty", 0, "1"): "accepted as vLLM 0.33 does: float settings kept as given (07b, What can go wrong)",
    ("SamplingParams.presence_penalty", 0, "-1.0"): "in range: vLLM 0.33 takes presence_penalty in [-2, 2]",
    ("SamplingParams logit_bias", 0, "None"): "in range: None is the default (no bias)",
    ("PersistentBatch.add_request", 0, "''"): "in range: vLLM 0.33 takes any str as a request id",
    ("MinPLogitsProcessor.update_state", 0, "None"): "in range: None is vLLM's 'batch unchanged'",
    ("ThinkingBudgetStateHolder.sync_batch", 0, "None"): "in range: None is vLLM's 'batch unchanged'",
    ("VllmThinkingBudgetStateHolder.sync_batch", 0, "None"): "in range: None is vLLM's 'batch unchanged'",
    ("kv_events.KVIndex", 3, "''"): "accepted as vLLM 0.33 does: an empty cache_salt is no salt (03a, Where vLLM differs)",
    ("KVIndex.prompt_hashes", 1, "''"): "accepted as vLLM 0.33 does: an empty cache_salt is no salt (03a, Where vLLM differs)",
    ("KVIndex.apply BlockStored.lora_id", 0, "None"): "in range: None is 'no LoRA'",
    ("kv_events.lora_id", 0, "''"): "in range: vLLM 0.33 takes any str as a LoRA name",
    ("kv_events.lora_id", 1, "''"): "in range: vLLM 0.33 takes any str as a LoRA path",
    ("kv_events.encode_batch ts", 0, "-1.0"): "accepted as vLLM 0.33 does: ts is any float (03a, Where vLLM differs)",
    ("hybrid.group_block_hashes", 0, "[[]]"): "accepted as vLLM 0.33 does: a view over the hashes, unchecked as BlockHashListWithBlockSize (04a); the managers check hashes",
    ("hybrid.hash_with_group_id", 0, "b'x'"): "accepted as vLLM 0.33 does: make_block_hash_with_group_id appends to any bytes",
    ("SamplingParams.seed", 0, repr(HUGE)): "in range: vLLM 0.33 takes any int seed",
    ("SamplingParams.seed", 0, "-1"): "in range: vLLM 0.33 takes any int seed",
    ("SamplingParams.seed", 0, "None"): "in range: None is the default (no seed)",
    ("SamplingParams.max_tokens", 0, "None"): "in range: None is 'up to max_model_len', as vLLM 0.33",
    ("OffloadConfig.block_size", 0, "None"): "in range: None is 'the GPU's block size'",
    ("KVCacheManager max_model_len", 0, "None"): "in range: None is 'no cap'",
}
SALT = "accepted as vLLM 0.33 does: an empty cache_salt is no salt (03a, Where vLLM differs)"
for _name in ("Request", "HybridRequest", "Scheduler.add_request RequestSpec"):
    BY_CALL[(f"{_name}.cache_salt", 0, "''")] = SALT
    BY_CALL[(f"{_name}.cache_salt", 0, "None")] = "in range: None is the default (no salt)"
BY_CALL[("Scheduler.add_request RequestSpec.after", 0, "None")] = "in range: None is the default (no dependency)"
BY_CALL[("Scheduler.add_request RequestSpec.after", 0, "''")] = (
    "in range: Scheduler.add_request admits at once; only run_workload reads `after`, and Workload.check refuses one "
    "that never runs")
BY_CALL[("Scheduler.add_request RequestSpec.max_tokens", 0, "None")] = "in range: None is 'as many as output scripts'"
for _name in ("KVCacheManager", "FastKVCacheManager", "HybridKVCacheManager"):
    BY_CALL[(f"{_name}.allocate_slots num_lookahead_tokens", 0, repr(HUGE))] = (
        "accepted as vLLM 0.33 does: the slots are capped at max_model_len (04, Allocating slots)")
BY_CALL[("FastKVCacheManager.allocate_slots", 2, repr(HUGE))] = BY_CALL[("KVCacheManager.allocate_slots num_lookahead_tokens", 0, repr(HUGE))]
for _name in ("Request", "HybridRequest"):
    BY_CALL[(f"{_name}.num_output_placeholders", 0, repr(HUGE))] = (
        "accepted as vLLM 0.33 does: a plain attribute its scheduler sets; slots run ahead at most to max_model_len (04, What can go wrong)")
BY_CALL[("HybridRequest.shared_prefix_boundary", 0, repr(HUGE))] = (
    "accepted as vLLM 0.33 does: a plain attribute its scheduler sets; past the prompt it is never reached (04a, allocate_slots)")
for _name in ("KVCacheManager", "FastKVCacheManager"):
    BY_CALL[(f"{_name}.allocate_slots reserved_blocks", 0, repr(HUGE))] = "in range: a load that does not fit: None, nothing changes"
for _name in ("ThinkingBudgetStateHolder.update_state", "VllmThinkingBudgetStateHolder.update_state"):
    for _i in (0, 1): BY_CALL.update({(_name, _i, v): HOLDER_ROWS for v in ("[[]]", "[]", "()")})
for _i in (0, 1, 2): BY_CALL.update({("thinking_budget_vllm.find_last", _i, v): "in range: a pure search over tokens the holder checked"
                                     for v in ("[]", "b'x'", "np.int64(1)")})

# Accepted before this round, refused now (a named TypeError/ValueError, nothing changed): the value would corrupt
# what a consumer reads later.
REFUSED = [
    (lambda v: kv_events.encode_batch(kv_events.KVEventBatch(0.0, [v])), (None, [], b"x"),
     TypeError, "KVEventBatch.events[0] must be a BlockStored, BlockRemoved or AllBlocksCleared"),  # no consumer decodes it
    (lambda v: hybrid.max_admission_blocks_per_request(v, 16, 64), (None, [], np.int64(1), b"x"),
     TypeError, "spec must be a KV cache spec"),  # returned None: a window group admitted with no cap
    (lambda v: block_pool.BlockPool(4).get_cached_block(v), (np.int64(1), None),
     TypeError, "block_hash must be bytes"),  # a miss where vLLM 0.33 raises; every pool keys blocks by bytes (03)
]

REFUSED_ARGS = {("kv_events.encode_batch event", 0), ("hybrid.max_admission_blocks_per_request", 0)}
NUMPY_SETTING = ("accepted as vLLM 0.33 does: its pydantic SchedulerConfig converts a numpy integer to int, and kvref "
                 "stores the int (06, Where vLLM differs)")
for _f in ("max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold"):
    BY_CALL.update({(f"SchedulerConfig.{_f}", 0, v): NUMPY_SETTING for v in ("np.int64(3)", "np.int32(3)")})
for _name in ("scheduler.Scheduler", "scheduler.run_workload"):  # max_num_batched_tokens, max_num_seqs: to SchedulerConfig
    BY_CALL.update({(_name, i, v): NUMPY_SETTING for i in (1, 2) for v in ("np.int64(3)", "np.int32(3)")})


def _prior(entry, i, value) -> str | None:
    "The verdict `fuzz_table.py` already gives (a skip's reason, or a case's), 10**18 read as its 10**30."
    r = repr(value)
    skips = {(j, ALIASES.get(x, x)): why for (j, x), why in entry.skip.items()}
    for cand in (r, *{repr(HUGE): (repr(10**30), repr(2**63)), repr([HUGE]): (repr([2**63]), repr([10**30]))}.get(r, ())):
        if (i, cand) in skips: return "in range: " + (skips[(i, cand)] or "no upper bound")
    return next((verdict for j, v, verdict in entry.cases if j == i and repr(v) == r), None)


def verdict(entry, i, value) -> str | None:
    return BY_CALL.get((entry.name, i, repr(value))) or _prior(entry, i, value) or BY_VALUE.get(repr(value))


def census():
    "(tried, [(entry, argument, value, verdict or None)] for every value accepted)."
    tried, accepted = 0, []
    for entry in TARGETS:
        for i, kind in enumerate(entry.kinds):
            for value in MENU.get(kind, ()) if kind else ():
                args = list(entry.args); args[i] = value
                tried += 1
                try: entry.call(entry.make(), *args)
                except Exception: continue  # how it refuses is test_public_api_fuzz.py's business
                accepted.append((entry.name, i, repr(value)[:40], verdict(entry, i, value)))
    return tried, accepted


def test_every_accepted_input_has_a_verdict():
    tried, accepted = census()
    undecided = [a for a in accepted if a[3] is None]
    assert not undecided, "accepted with no verdict:\n" + "\n".join(map(str, undecided))
    assert tried > 1500 and len(accepted) > 200  # the menu reached every target
    assert not [a for a in accepted if a[:2] in REFUSED_ARGS]  # what REFUSED names, the census sees refused too


def assert_refused(call, values, error, message) -> None:
    "Each of `values` is refused by `call` with `error` naming `message`, and left as it was."
    for value in values:
        before = snap(value)
        with pytest.raises(error, match=re.escape(message)): call(value)
        assert snap(value) == before


@pytest.mark.parametrize("row", range(len(REFUSED)))
def test_refused_by_name(row):
    assert_refused(*REFUSED[row])


def test_accepted_as_vllm_behave_as_vllm():
    "The executed checks behind the 'accepted as vLLM 0.33 does' rows (vLLM's own behaviour: see each chapter)."
    from kvref.core import fast_hashing, hashing
    # numpy token ids hash as the ints they stand for
    assert fast_hashing.hash_request_tokens(np.array([1, 2, 3, 4]), 2) == fast_hashing.hash_request_tokens([1, 2, 3, 4], 2)
    assert kv_cache_manager.Request("a", [np.int64(3)]).all_token_ids == [3]
    # float settings kept as given
    sp = SP(temperature=1, top_p=np.float64(0.5))
    assert (sp.temperature, type(sp.top_p)) == (1, np.float64)
    # an empty salt is no salt
    index = kv_events.KVIndex(2)
    assert index.prompt_hashes([1, 2, 3, 4], cache_salt="") == index.prompt_hashes([1, 2, 3, 4])
    # a negative ts goes out as msgspec writes it: float64 -1.0, no events, no rank
    assert kv_events.encode_batch(kv_events.KVEventBatch(-1.0, [])) == b"\x93\xcb\xbf\xf0" + bytes(6) + b"\x90\xc0"
    # a bytes key no block has is a miss; a numpy integer setting is the int it stands for (vLLM's pydantic converts it)
    assert block_pool.BlockPool(4).get_cached_block(b"x") is None
    cfg = scheduler.SchedulerConfig(max_num_batched_tokens=np.int64(64), max_num_seqs=np.int32(4))
    assert (cfg.max_num_batched_tokens, type(cfg.max_num_batched_tokens), type(cfg.max_num_seqs)) == (64, int, int)
    assert hybrid.hash_with_group_id(b"x", 1) == b"x\x00\x00\x00\x01"
