"""vLLM 0.33's own V1 `Scheduler` (`vllm/v1/core/sched/scheduler.py` at v0.33.0), or its `AsyncScheduler`, driven on
the CPU over a scheduler workload (the format of `golden/scheduler/workloads.jsonl`), one step record per step in the
format kvref's `SchedulerOutput.record()` writes. The model runner is the only stand-in: each step every scheduled
request whose tokens are all computed gets one token, its scripted `output[j]` or kvref's `FakeModel(model_seed)`.

Engine loop (the same as kvref's `run_steps`): at step t every request that is due is added, in (due step, workload
order); a request is due at its `arrival` step and, if it names `after`, not before `think` steps after that one
finished (finished at step s: due at s + 1 + think). An idle engine jumps to the next due step. Sync: schedule, then
update, each step. Async (`async_scheduling`): vLLM's engine core with a batch queue of two
(`EngineCore.step_with_batch_queue`): each call schedules a batch if there are requests and returns at once while the
queue has room, else processes the oldest batch's output; a step record is one call.

With `config.offload` (the format of `golden/offload/workloads.jsonl`) the scheduler gets vLLM 0.33's own
`OffloadingConnector` (CPU backend, LRU or ARC) and the engine steps while `Scheduler.has_requests()` (which includes
the connector's pending stores); each record then carries the connector's fields (`offload_fields` below). The worker
side of the connector is the second stand-in, `config.offload.worker`:
  "instant" (default): every load and store job of step t's `OffloadingConnectorMetadata` is reported complete in
      step t's own `ModelRunnerOutput.kv_connector_output` (`OffloadingWorkerMetadata(completed_jobs={job: 1})`, and
      `finished_recving` = the requests of step t's load jobs), i.e. before step t+1's schedule();
  "vllm": as vLLM's own worker (`OffloadingConnectorWorker`, whose `prepare_store_kv` defers a store job to the start of
      the next step): step t's loads and flushed jobs are reported at step t, its stores at step t+1.
The order in which vLLM handles several requests that finished in one step is that of a `set` of request ids, so it
depends on the string hash seed: `record()` re-runs itself with PYTHONHASHSEED=0 unless the variable is set.

Run as a script to record: `PYTHONPATH=$PWD VENV/bin/python tests/scheduler_vllm_support.py WORKLOADS.jsonl OUT_DIR`
writes `OUT_DIR/NAME.jsonl` for each workload (PYTHONHASHSEED=0 unless set)."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from kvref.kv_offload import _sorted_stored_runs, chunk_names
from kvref.core.scheduler import FakeModel

LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
                "num_hidden_layers": 1, "vocab_size": 1000, "max_position_embeddings": 1 << 20,
                "rms_norm_eps": 1e-5, "torch_dtype": "float32", "tie_word_embeddings": False}


def load_vllm() -> SimpleNamespace:
    "The vLLM 0.33 pieces the driver needs; ImportError saying why they are not importable."
    try:
        import torch, vllm
        from vllm import SamplingParams
        from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request, RequestStatus
        from vllm.config import KVEventsConfig, KVTransferConfig
        from vllm.v1.outputs import KVConnectorOutput
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
        from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
        from vllm.v1.structured_output import StructuredOutputManager
    except Exception as e:  # any import failure means: no usable vLLM here
        raise ImportError(f"vLLM 0.33 is not importable here ({type(e).__name__}: {e})") from e
    if not vllm.__version__.startswith("0.33."): raise ImportError(f"needs vLLM 0.33.x, found {vllm.__version__}")
    return SimpleNamespace(**{k: v for k, v in locals().items()})


def vllm_or_skip():
    "vLLM 0.33's pieces and a pytest mark that skips, with the reason, the tests that need them where it does not import."
    import pytest
    try: return load_vllm(), pytest.mark.skipif(False, reason="")
    except ImportError as e: return None, pytest.mark.skip(reason=str(e))


_MODEL_DIR: list[str] = []


def _model_dir() -> str:
    "A folder holding only a one-layer Llama's config.json (made once per process)."
    if not _MODEL_DIR:
        d = tempfile.mkdtemp(prefix="kvref-llama-")
        Path(d, "config.json").write_text(json.dumps(LLAMA_CONFIG))
        _MODEL_DIR.append(d)
    return _MODEL_DIR[0]


def make_scheduler(v: SimpleNamespace, c: dict):
    "vLLM's Scheduler (or AsyncScheduler) for a workload config."
    model = v.ModelConfig(model=_model_dir(), tokenizer=_model_dir(), skip_tokenizer_init=True, dtype="float32",
                          max_model_len=c["max_model_len"], seed=0)
    sched = v.SchedulerConfig(max_num_batched_tokens=c["max_num_batched_tokens"], max_num_seqs=c["max_num_seqs"],
                              enable_chunked_prefill=c["enable_chunked_prefill"],
                              long_prefill_token_threshold=c["long_prefill_token_threshold"], policy=c["policy"],
                              scheduler_reserve_full_isl=c["scheduler_reserve_full_isl"],
                              async_scheduling=c.get("async_scheduling", False),
                              max_model_len=c["max_model_len"], is_encoder_decoder=False)
    cache = v.CacheConfig(block_size=c["block_size"], enable_prefix_caching=c["enable_prefix_caching"],
                          prefix_caching_hash_algo=c.get("hash_algo", "sha256"))
    cache.num_gpu_blocks = c["num_blocks"]
    config = v.VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache, device_config=v.DeviceConfig("cpu"),
                          **_offload_configs(v, c))
    spec = v.FullAttentionSpec(block_size=c["block_size"], num_kv_heads=1, head_size=1, dtype=v.torch.float32)
    kv_config = v.KVCacheConfig(num_blocks=c["num_blocks"], kv_cache_tensors=[],
                                kv_cache_groups=[v.KVCacheGroupSpec(["layers.0"], spec)])
    cls = v.AsyncScheduler if c.get("async_scheduling") else v.Scheduler
    return cls(vllm_config=config, kv_cache_config=kv_config, structured_output_manager=v.StructuredOutputManager(config),
               block_size=c["block_size"], log_stats=True)


CHUNK_BYTES = 4096  # vLLM rounds a chunk's bytes up to this (CPUOffloadingSpec.BLOCK_SIZE_ALIGNMENT); ours are smaller


def _offload_configs(v: SimpleNamespace, c: dict) -> dict:
    "The `VllmConfig` arguments that give the scheduler vLLM's OffloadingConnector (none without `config.offload`)."
    o = c.get("offload")
    if not o: return {}
    extra = {"cpu_bytes_to_use": o["cpu_chunks"] * CHUNK_BYTES, "eviction_policy": o.get("policy", "lru"),
             "block_size": o.get("block_size", c["block_size"])}
    for key in ("store_threshold", "offload_prompt_only"):
        if key in o: extra[key] = o[key]
    return {"kv_transfer_config": v.KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                                     kv_connector_extra_config=extra),
            "kv_events_config": v.KVEventsConfig(enable_kv_cache_events=True, publisher="null")}


def _request(v: SimpleNamespace, spec: dict, arrival: int, hasher):
    sp = v.SamplingParams(max_tokens=spec["max_tokens"], ignore_eos=True)
    return v.Request(request_id=spec["id"], prompt_token_ids=list(spec["prompt"]), sampling_params=sp,
                     pooling_params=None, arrival_time=float(arrival), priority=spec.get("priority", 0),
                     cache_salt=spec.get("cache_salt"), block_hasher=hasher)


def _stats(st) -> dict:
    "A `PrefixCacheStats` as the record's dict (all zeros where no stats were made)."
    if st is None: return dict.fromkeys(("requests", "queries", "hits", "preempted_requests", "preempted_queries", "preempted_hits"), 0)
    return {"requests": st.requests, "queries": st.queries, "hits": st.hits, "preempted_requests": st.preempted_requests,
            "preempted_queries": st.preempted_queries, "preempted_hits": st.preempted_hits}


def run(workload: dict, v: SimpleNamespace | None = None, max_steps: int = 100_000) -> list[dict]:
    "vLLM's step records for one workload."
    v = v or load_vllm()
    c, specs = workload["config"], workload["requests"]
    v.init_none_hash(v.get_hash_fn_by_name(c.get("hash_algo", "sha256")))
    hasher = v.get_request_block_hasher(c["block_size"], v.get_hash_fn_by_name(c.get("hash_algo", "sha256")))
    s, model = make_scheduler(v, c), FakeModel(c.get("model_seed", 0))
    s._kvref_preempted = _observe_preemptions(s)
    order = {r["id"]: i for i, r in enumerate(specs)}
    due = {r["id"]: r["arrival"] for r in specs if r.get("after") is None}
    waiting_on = {}
    for r in specs:
        if r.get("after") is not None: waiting_on.setdefault(r["after"], []).append(r)
    outputs, live, records, t, arrivals = {r["id"]: [] for r in specs}, set(), [], 0, 0
    by_id = {r["id"]: r for r in specs}
    batch_queue: list = []
    asynchronous = bool(c.get("async_scheduling"))
    off = OffloadObserver(v, s, c) if c.get("offload") else None
    resets = sorted(c.get("resets", []), key=lambda r: r["step"])
    busy = (lambda: s.has_requests() or bool(batch_queue)) if asynchronous else s.has_requests if off else (lambda: bool(live))
    while due or busy():
        if not busy() and min(due.values()) > t: t = min(due.values())
        arrived = sorted((rid for rid, d in due.items() if d <= t), key=lambda rid: (due[rid], order[rid]))
        for rid in arrived:
            del due[rid]; live.add(rid)
            s.add_request(_request(v, by_id[rid], arrivals, hasher)); arrivals += 1
        rec = {"step": t, "arrived": arrived}
        while resets and resets[0]["step"] <= t: rec["reset"] = _reset(s, resets.pop(0))
        if asynchronous: _async_call(v, s, batch_queue, rec, by_id, outputs, model, t)
        else:
            out = s.schedule()
            rec.update(_scheduled(s, out))
            rec.update(_update(v, s, out, by_id, outputs, model, off and off.worker_output(out)))
        rec.setdefault("sched", []); rec.setdefault("preempted", []); rec.setdefault("finished", [])
        rec.setdefault("tokens", {})
        rec["stats"] = _stats(rec.pop("_stats", None))
        sched_stats = rec.pop("_sched_stats", None)
        rec.setdefault("free_sched", s.kv_cache_manager.block_pool.get_num_free_blocks())
        rec["free"] = s.kv_cache_manager.block_pool.get_num_free_blocks()
        rec["usage"] = round(s.kv_cache_manager.usage, 9)
        rec["running"], rec["waiting"] = s.get_request_counts()
        for rid in rec["finished"]:
            live.discard(rid)
            for nxt in waiting_on.pop(rid, []): due[nxt["id"]] = max(nxt["arrival"], t + 1 + nxt.get("think", 0))
        if "processed" in rec: rec["processed"] = rec.pop("processed")  # last, as kvref writes it
        if off:
            rec["stats"]["reset"] = bool(sched_stats and sched_stats.prefix_cache_stats.reset)
            rec["waiting"] = sched_stats.num_waiting_reqs
            rec.update(off.fields(sched_stats))
            rec = {k: rec[k] for k in RECORD_ORDER if k in rec}
        records.append(rec); t += 1
        if len(records) > max_steps: raise RuntimeError(f"workload {workload['name']!r} did not finish in {max_steps} steps")
    return records


def _observe_preemptions(s) -> list[str]:
    "A list that collects the ids vLLM preempts, in order (the output keeps only a set); behaviour unchanged."
    seen, preempt = [], s._preempt_request
    def observed(request, *args, **kwargs):
        seen.append(request.request_id); return preempt(request, *args, **kwargs)
    s._preempt_request = observed
    return seen


def _async_call(v, s, batch_queue, rec, by_id, outputs, model, t) -> None:
    "One call of vLLM's `EngineCore.step_with_batch_queue` (batch queue of two) as a step record."
    if s.has_requests():
        out = s.schedule(); out._kvref_step = t
        rec.update(_scheduled(s, out)); batch_queue.insert(0, out)
        if len(batch_queue) < 2 and (out.total_num_scheduled_tokens > 0 or s.has_requests()): return
    elif not batch_queue: return
    done = batch_queue.pop()
    rec["processed"] = done._kvref_step
    rec.update(_update(v, s, done, by_id, outputs, model))


def _scheduled(s, out) -> dict:
    "What one schedule() decided, in the record's fields."
    free_sched = s.kv_cache_manager.block_pool.get_num_free_blocks()
    preempted = list(s._kvref_preempted); s._kvref_preempted.clear()
    out._kvref_samples = {rid for rid in out.num_scheduled_tokens if not s.requests[rid].is_prefill_chunk}
    admitted = {r.req_id for r in out.scheduled_new_reqs} | set(out.scheduled_cached_reqs.resumed_req_ids)
    sched = []
    for rid, n in out.num_scheduled_tokens.items():
        req = s.requests[rid]
        kind = ("resumed" if req.num_preemptions else "new") if rid in admitted else "running"
        sched.append([rid, n, kind, req.num_computed_tokens - n])
    return {"sched": sched, "preempted": preempted, "free_sched": free_sched}


def _reset(s, r: dict) -> dict:
    "vLLM's reset_prefix_cache as a workload's `config.resets` entry asks; its result or its error."
    result = {"running": r["running"], "connector": r["connector"]}
    try: result["ok"] = s.reset_prefix_cache(reset_running_requests=r["running"], reset_connector=r["connector"])
    except Exception as e: result["error"] = f"{type(e).__name__}: {e}"
    return result


def _update(v, s, out, by_id, outputs, model, kv_connector_output=None) -> dict:
    "Sample one token for each scheduled request whose tokens are all computed; vLLM's update_from_output."
    req_ids, sampled, tokens = [], [], {}
    for rid in out.num_scheduled_tokens:
        req = s.requests.get(rid)
        req_ids.append(rid)
        if req is None or req.is_finished() or rid not in out._kvref_samples: sampled.append([]); continue
        script = by_id[rid].get("output")
        token = script[len(outputs[rid])] if script else model.next_token(list(req.all_token_ids))
        tokens[rid] = token; outputs[rid].append(token); sampled.append([token])
    mro = v.ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                              sampled_token_ids=sampled, kv_connector_output=kv_connector_output)
    result = s.update_from_output(out, mro)
    finished = [o.request_id for outs in result.values() for o in outs.outputs if o.finish_reason is not None]
    stats = next((o.scheduler_stats for o in result.values() if o.scheduler_stats is not None), None)
    return {"tokens": tokens, "finished": finished, "_stats": stats and stats.prefix_cache_stats, "_sched_stats": stats}


def random_workload(seed: int, async_scheduling: bool = False) -> dict:
    "A random scheduler workload that vLLM accepts (its config checks and input checks hold), in the vectors' format."
    import random
    rng = random.Random(seed)
    block_size = rng.choice([2, 4, 8, 16])
    chunked = rng.random() < 0.8
    max_model_len = rng.randint(2 * block_size, 12 * block_size)
    max_num_seqs = rng.choice([1, 2, 4, 8, 16])
    budget = rng.choice([4, 8, 16, 32, 64, 128])
    budget = max(budget, max_num_seqs, 0 if chunked else max_model_len)
    threshold = rng.choice([0, 0, rng.randint(1, max_model_len)])
    num_blocks = -(-max_model_len // block_size) + 1 + rng.randint(0, 3 * max_model_len // block_size)
    config = {"num_blocks": num_blocks, "block_size": block_size, "max_num_batched_tokens": budget,
              "max_num_seqs": max_num_seqs, "enable_chunked_prefill": chunked, "long_prefill_token_threshold": threshold,
              "policy": rng.choice(["fcfs", "priority"]), "enable_prefix_caching": rng.random() < 0.85,
              "max_model_len": max_model_len, "scheduler_reserve_full_isl": rng.random() < 0.6, "hash_algo": "sha256",
              "model_seed": rng.randint(0, 99), "async_scheduling": async_scheduling}
    prefixes = [[rng.randrange(1, 1000) for _ in range(rng.randint(1, max_model_len // 2))] for _ in range(3)]
    requests = []
    for i in range(rng.randint(1, 14)):
        prompt = (rng.choice(prefixes) if rng.random() < 0.6 else []) + [rng.randrange(1, 1000) for _ in range(rng.randint(1, max_model_len // 2))]
        prompt = prompt[:max_model_len - 1]
        max_tokens = rng.randint(1, max_model_len)
        scripted = rng.random() < 0.3
        after = requests[rng.randrange(len(requests))]["id"] if requests and rng.random() < 0.3 else None
        requests.append({"id": f"r{i}", "prompt": prompt, "max_tokens": max_tokens,
                         "output": [rng.randrange(1, 1000) for _ in range(max_tokens)] if scripted else None,
                         "arrival": rng.randint(0, 12), "after": after, "think": rng.randint(0, 3),
                         "priority": rng.randint(0, 3), "cache_salt": rng.choice([None, None, "a", "b"])})
    return {"name": f"random-{seed}", "kind": "random", "config": config, "requests": requests}


# ---------------------------------------------------------------- the CPU offload tier (config.offload)

RECORD_ORDER = ("step", "arrived", "sched", "preempted", "finished", "tokens", "stats", "free_sched", "free", "usage",
                "running", "waiting", "skipped", "fin_order", "kv_fetch", "loading", "lookups", "admitted", "loads",
                "stores", "store_fail", "evicted", "done", "events", "conn_pcs", "conn_stats", "cpu", "conn_info", "reset")


class OffloadObserver:
    "Watches vLLM's OffloadingConnector (scheduler side) through one run; behaviour unchanged. Plays the worker."
    def __init__(self, v: SimpleNamespace, s, c: dict):
        self.v, self.s, self.c = v, s, c
        self.o = c["offload"]
        self.conn = s.connector.connector_scheduler
        self.manager = self.conn.manager
        self.names: dict = {}  # vLLM block hash (and its event form) -> name
        self.by_name: dict = {}
        self.step: dict = {}
        self.pending_stores: list[int] = []  # "vllm" worker: store jobs reported at the next step
        self.last_order = None
        self.first = True
        self._wrap()

    def _name(self, h) -> str:
        return self.names[h]

    def name_keys(self) -> None:
        "Name every block hash of every request vLLM or the connector holds (asserting equal names <=> equal hashes)."
        reqs = {id(r): r for r in list(self.s.requests.values()) + [st.req for st in self.conn._req_status.values()]}
        for req in reqs.values():
            names = chunk_names(list(req.all_token_ids), self.c["block_size"], req.cache_salt)
            for h, name in zip(req.block_hashes, names):
                assert self.by_name.setdefault(name, bytes(h)) == bytes(h), name
                for form in (h, self.v.maybe_convert_block_hash(h)):
                    assert self.names.setdefault(form, name) == name, name

    def key(self, k) -> str:
        from vllm.v1.kv_offload.base import get_offload_block_hash
        return self.names[get_offload_block_hash(k)]

    def _wrap(self) -> None:
        conn, m, st = self.conn, self.manager, self.step
        def add(field, value): st.setdefault(field, []).append(value)
        lookup = conn.get_num_new_matched_tokens
        def get_num_new_matched_tokens(request, num_computed_tokens, *a, **kw):
            self.name_keys()
            ext, load_async = lookup(request, num_computed_tokens, *a, **kw)
            add("lookups", [request.request_id, num_computed_tokens, ext, load_async])
            st.setdefault("_gpu_hit", {})[request.request_id] = num_computed_tokens
            return ext, load_async
        conn.get_num_new_matched_tokens = get_num_new_matched_tokens
        s_conn = self.s.connector
        alloc = conn.update_state_after_alloc
        def update_state_after_alloc(request, blocks, num_external_tokens):
            add("admitted", [request.request_id, st.get("_gpu_hit", {}).get(request.request_id), num_external_tokens])
            return alloc(request, blocks, num_external_tokens)
        conn.update_state_after_alloc = update_state_after_alloc
        prepare_load = m.prepare_load
        def wrapped_prepare_load(keys, ctx):
            add("_load_keys", [ctx.req_id, [self.key(k) for k in keys]])
            return prepare_load(keys, ctx)
        m.prepare_load = wrapped_prepare_load
        prepare_store = m.prepare_store
        def wrapped_prepare_store(keys, ctx):
            self.name_keys()
            out = prepare_store(keys, ctx)
            if out is None: add("store_fail", ctx.req_id); return out
            if out.keys_to_store: add("stores", [ctx.req_id, [self.key(k) for k in out.keys_to_store]])
            for k in out.evicted_keys: add("evicted", self.key(k))
            return out
        m.prepare_store = wrapped_prepare_store
        for kind in ("load", "store"):
            def complete(keys, ctx, *a, _kind=kind, _f=getattr(m, f"complete_{kind}"), **kw):
                add("done", [_kind, ctx.req_id, len(keys)])
                return _f(keys, ctx, *a, **kw)
            setattr(m, f"complete_{kind}", complete)
        take_events = s_conn.take_events
        def wrapped_take_events():
            events = list(take_events())
            for e in events:
                if getattr(e, "medium", None) != "CPU": continue
                kind = "removed" if type(e).__name__ == "BlockRemoved" else "stored"
                add("events", [kind, [self._name(h) for h in e.block_hashes]])
            return events
        s_conn.take_events = wrapped_take_events
        get_stats = s_conn.get_kv_connector_stats
        def wrapped_get_stats():
            stats = get_stats()
            st["_conn_stats"] = stats
            return stats
        s_conn.get_kv_connector_stats = wrapped_get_stats

    def worker_output(self, out):
        "The worker stand-in's report for step `out` (a KVConnectorOutput)."
        meta = out.kv_connector_metadata
        done = {}
        reported = list(self.pending_stores); self.pending_stores = []
        later = self.o.get("worker", "instant") == "vllm"
        flushed = set(meta.jobs_to_flush or ())
        for jid in meta.load_jobs: reported.append(jid)
        for jid in meta.store_jobs:
            if later and jid not in flushed: self.pending_stores.append(jid)
            else: reported.append(jid)
        recving = {job.req_id for job in meta.load_jobs.values() if not job.sync}
        # the meta's loads: GPU block ids per load job, keys in prepare_load order
        loads = self.step.pop("_load_keys", [])
        for (rid, keys), job in zip(loads, meta.load_jobs.values()):
            self.step.setdefault("loads", []).append([rid, keys, [int(b) for b in job.dst_spec.block_ids]])
        if len(out.finished_req_ids) >= 2: self.step["fin_order"] = list(out.finished_req_ids)
        self.step["loading"] = [r.request_id for q in (self.s.kv_holding_waiting, self.s.waiting) for r in q
                                if r.status == self.v.RequestStatus.WAITING_FOR_REMOTE_KVS]
        if not reported and not recving: return None
        return self.v.KVConnectorOutput(finished_recving=recving or None,
                                        kv_connector_worker_meta=self.v.OffloadingWorkerMetadata(
                                            completed_jobs={jid: 1 for jid in reported}))

    def fields(self, sched_stats) -> dict:
        "This step's connector fields (and reset for the next)."
        st, rec = self.step, {}
        if sched_stats is not None:
            rec["skipped"] = sched_stats.num_skipped_waiting_reqs
            kv_fetch = {k: n for k, n in sched_stats.num_kv_fetch_reqs_by_stage.items() if n}
            if kv_fetch: rec["kv_fetch"] = kv_fetch
        for f in ("fin_order", "loading", "lookups", "admitted", "loads", "stores", "store_fail", "evicted", "done"):
            if st.get(f): rec[f] = st[f]
        if st.get("events") and self.o.get("record_events", True): rec["events"] = _sorted_stored_runs(st["events"])
        pcs = sched_stats and sched_stats.connector_prefix_cache_stats
        if pcs is not None:
            d = {k: getattr(pcs, k) for k in ("requests", "queries", "hits", "preempted_requests", "preempted_queries",
                                              "preempted_hits", "reset") if getattr(pcs, k)}
            if pcs.hits_by_source: d["hits_by_source"] = {src.value: n for src, n in pcs.hits_by_source.items()}
            if d: rec["conn_pcs"] = d
        stats, info = st.get("_conn_stats"), None
        if stats is not None:
            d = {}
            for name, values in sorted(stats.data.get("data", {}).items()):
                short = name.removeprefix("vllm:kv_offload_")
                if "delay" in short or "time" in short or () not in values: continue
                value = values[()]
                if value: d[short] = value
            if d: rec["conn_stats"] = d
            info = stats.data.get("info")
        rec["cpu"] = self.cpu()
        if info and self.first: rec["conn_info"] = dict(info[0])
        self.first = False
        self.step.clear()
        return rec

    def cpu(self) -> dict:
        "Resident and ready chunks; the eviction order when small and changed."
        p = self.manager._policy
        chunks = dict(p.chunks) if hasattr(p, "chunks") else {**p.t1, **p.t2}
        out = {"n": len(chunks), "ready": sum(c.ref_cnt >= 0 for c in chunks.values())}
        if len(chunks) <= 64:
            mark = lambda k: ("" if chunks[k].ref_cnt == 0 else "*") + self.key(k)
            if hasattr(p, "chunks"): order = [mark(k) for k in sorted(chunks, key=lambda k: p._ranks[k])]
            else: order = {"t1": [mark(k) for k in p.t1], "t2": [mark(k) for k in p.t2], "b1": len(p.b1),
                           "b2": len(p.b2), "target": p.target_t1_size}
            if order != self.last_order: out["order"] = order
            self.last_order = order
        return out


def reexec_with_hash_seed() -> None:
    "Re-run this process with PYTHONHASHSEED=0 unless it is set (vLLM's finish order follows a set of request ids)."
    import os
    if os.environ.get("PYTHONHASHSEED") is None:
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})


if __name__ == "__main__":
    reexec_with_hash_seed()
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    dst.mkdir(parents=True, exist_ok=True)
    v = load_vllm()
    for line in src.read_text().splitlines():
        w = json.loads(line)
        recs = run(w, v)
        (dst / f"{w['name']}.jsonl").write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs))
        print(w["name"], len(recs))


def random_offload_workload(seed: int) -> dict:
    "A random scheduler workload (sync) with a random CPU offload tier and, sometimes, prefix-cache resets."
    import random
    rng = random.Random(10_000 + seed)
    w = random_workload(seed)
    c = w["config"]
    c["offload"] = {"cpu_chunks": rng.choice([1, 2, 3, 4, 6, 8, 16, 64]), "policy": rng.choice(["lru", "arc"]),
                    "block_size": c["block_size"] * rng.choice([1, 1, 2, 4])}
    if rng.random() < 0.2: c["offload"]["store_threshold"] = rng.choice([1, 2, 3])
    if rng.random() < 0.3: c["offload"]["offload_prompt_only"] = False
    if rng.random() < 0.3: c["offload"]["worker"] = "vllm"
    if rng.random() < 0.25:
        c["resets"] = [{"step": rng.randint(0, 30), "running": rng.random() < 0.3, "connector": rng.random() < 0.7}
                       for _ in range(rng.randint(1, 2))]
    w["name"] = f"random-offload-{seed}"
    return w
