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

Run as a script to record: `PYTHONPATH=$PWD VENV/bin/python tests/scheduler_vllm_support.py WORKLOADS.jsonl OUT_DIR`
writes `OUT_DIR/NAME.jsonl` for each workload (PYTHONHASHSEED plays no part here)."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from kvref.scheduler import FakeModel

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
        from vllm.v1.request import Request
        from vllm.v1.structured_output import StructuredOutputManager
    except Exception as e:  # any import failure means: no usable vLLM here
        raise ImportError(f"vLLM 0.33 is not importable here ({type(e).__name__}: {e})") from e
    if not vllm.__version__.startswith("0.33."): raise ImportError(f"needs vLLM 0.33.x, found {vllm.__version__}")
    return SimpleNamespace(**{k: v for k, v in locals().items()})


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
    config = v.VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache, device_config=v.DeviceConfig("cpu"))
    spec = v.FullAttentionSpec(block_size=c["block_size"], num_kv_heads=1, head_size=1, dtype=v.torch.float32)
    kv_config = v.KVCacheConfig(num_blocks=c["num_blocks"], kv_cache_tensors=[],
                                kv_cache_groups=[v.KVCacheGroupSpec(["layers.0"], spec)])
    cls = v.AsyncScheduler if c.get("async_scheduling") else v.Scheduler
    return cls(vllm_config=config, kv_cache_config=kv_config, structured_output_manager=v.StructuredOutputManager(config),
               block_size=c["block_size"], log_stats=True)


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
    busy = (lambda: s.has_requests() or bool(batch_queue)) if asynchronous else (lambda: bool(live))
    while due or busy():
        if not busy() and min(due.values()) > t: t = min(due.values())
        arrived = sorted((rid for rid, d in due.items() if d <= t), key=lambda rid: (due[rid], order[rid]))
        for rid in arrived:
            del due[rid]; live.add(rid)
            s.add_request(_request(v, by_id[rid], arrivals, hasher)); arrivals += 1
        rec = {"step": t, "arrived": arrived}
        if asynchronous: _async_call(v, s, batch_queue, rec, by_id, outputs, model, t)
        else:
            out = s.schedule()
            rec.update(_scheduled(s, out))
            rec.update(_update(v, s, out, by_id, outputs, model))
        rec.setdefault("sched", []); rec.setdefault("preempted", []); rec.setdefault("finished", [])
        rec.setdefault("tokens", {})
        rec["stats"] = _stats(rec.pop("_stats", None))
        rec.setdefault("free_sched", s.kv_cache_manager.block_pool.get_num_free_blocks())
        rec["free"] = s.kv_cache_manager.block_pool.get_num_free_blocks()
        rec["usage"] = round(s.kv_cache_manager.usage, 9)
        rec["running"], rec["waiting"] = s.get_request_counts()
        for rid in rec["finished"]:
            live.discard(rid)
            for nxt in waiting_on.pop(rid, []): due[nxt["id"]] = max(nxt["arrival"], t + 1 + nxt.get("think", 0))
        if "processed" in rec: rec["processed"] = rec.pop("processed")  # last, as kvref writes it
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


def _update(v, s, out, by_id, outputs, model) -> dict:
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
                              sampled_token_ids=sampled)
    result = s.update_from_output(out, mro)
    finished = [o.request_id for outs in result.values() for o in outs.outputs if o.finish_reason is not None]
    stats = next((o.scheduler_stats for o in result.values() if o.scheduler_stats is not None), None)
    return {"tokens": tokens, "finished": finished, "_stats": stats and stats.prefix_cache_stats}


if __name__ == "__main__":
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    dst.mkdir(parents=True, exist_ok=True)
    v = load_vllm()
    for line in src.read_text().splitlines():
        w = json.loads(line)
        recs = run(w, v)
        (dst / f"{w['name']}.jsonl").write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs))
        print(w["name"], len(recs))


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
