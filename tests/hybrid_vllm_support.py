"""Support for `test_hybrid_vs_vllm.py`: vLLM 0.33's own `KVCacheManager` (`vllm/v1/core/kv_cache_manager.py` at
v0.33.0, its `HybridKVCacheCoordinator` and single-type managers, on the CPU) driven by the ops of a hybrid trace,
answering each op with a decision in the recorded format; random hybrid workloads; kvref and vLLM in lockstep; and
a recorder that writes a run as a hybrid trace (`X.jsonl` + `X.vllm.jsonl`) for `golden/hybrid/`.

Run as a script to record: `PYTHONPATH=$PWD /work/venv-vllm/bin/python tests/hybrid_vllm_support.py SEED [OUT_DIR
[LAYOUT]]` writes `hybrid-LAYOUT-SEED.jsonl` and `hybrid-LAYOUT-SEED.vllm.jsonl` and prints where kvref first differs (if it
does). The vLLM side is the ground truth here; kvref's replayer is only compared with it."""
from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path
from types import SimpleNamespace


def load_vllm() -> SimpleNamespace:
    "The vLLM 0.33 pieces the driver needs; ImportError saying why they are not importable."
    try:
        import torch, vllm
        from vllm import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec, FullAttentionSpec, KVCacheConfig,
                                                KVCacheGroupSpec, MambaSpec, SlidingWindowSpec)
        from vllm.v1.request import Request, RequestStatus
        from vllm.lora.request import LoRARequest
        from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    except Exception as e:  # any import failure means: no usable vLLM here
        raise ImportError(f"vLLM 0.33 is not importable here ({type(e).__name__}: {e})") from e
    if not vllm.__version__.startswith("0.33."): raise ImportError(f"needs vLLM 0.33.x, found {vllm.__version__}")
    return SimpleNamespace(**{k: v for k, v in locals().items()})


def vllm_spec(v, group: dict):
    "vLLM's KV cache spec for one `config.groups` entry of a hybrid trace."
    common = dict(block_size=group["block_size"], num_kv_heads=1, head_size=1, dtype=v.torch.float32)
    kind = group["kind"]
    if kind == "full": return v.FullAttentionSpec(**common)
    if kind == "sliding_window": return v.SlidingWindowSpec(**common, sliding_window=group["sliding_window"])
    if kind == "chunked_local": return v.ChunkedLocalAttentionSpec(**common, attention_chunk_size=group["attention_chunk_size"])
    if kind == "mamba":
        alignment = group.get("checkpoint_alignment")
        return v.MambaSpec(block_size=group["block_size"], shapes=((1,),), dtypes=(v.torch.float32,),
                           mamba_cache_mode="align", num_prefill_checkpoint_blocks=int(alignment is not None),
                           prefill_checkpoint_alignment=alignment)
    raise ValueError(f"unknown group kind {kind!r}")


class VllmHybridReplayer:
    "Applies hybrid trace ops to vLLM's KVCacheManager the way kvref's `HybridTraceReplayer` (kvref.oracle.hybrid_replay) does; same decisions format."
    def __init__(self, v: SimpleNamespace | None = None, enable_kv_cache_events: bool = False):
        self.v, self.enable_kv_cache_events = v or load_vllm(), enable_kv_cache_events
        self.manager, self.requests, self.running, self.full_sequence_must_fit = None, {}, set(), False
        self.lora_ids: dict[str, int] = {}

    def apply(self, op: dict) -> dict:
        name = op["op"]
        decision = {"op": name, **({"id": op["id"]} if "id" in op else {})}
        decision.update(getattr(self, f"_{name}")(op) or {})
        decision["free_queue"] = [b.block_id for b in self.manager.block_pool.free_block_queue.get_all_free_blocks()]
        decision["num_free"] = self.manager.block_pool.get_num_free_blocks()
        return decision

    def _config(self, op: dict) -> None:
        v, groups = self.v, op["groups"]
        block_sizes = [g["block_size"] for g in groups]
        caching = op.get("enable_caching", True)
        self.scheduler_block_size = math.lcm(*block_sizes)
        self.hash_block_size = (op.get("prefix_match_unit") or math.gcd(*block_sizes)) if caching else self.scheduler_block_size
        config = v.KVCacheConfig(num_blocks=op["num_blocks"], kv_cache_tensors=[],
                                 kv_cache_groups=[v.KVCacheGroupSpec([f"layers.{i}"], vllm_spec(v, g)) for i, g in enumerate(groups)],
                                 prefix_cache_retention_interval=op.get("retention_interval", 0))
        self.max_model_len = op.get("max_model_len", 65536)
        self.manager = v.KVCacheManager(config, max_model_len=self.max_model_len,
                                        scheduler_block_size=self.scheduler_block_size, hash_block_size=self.hash_block_size,
                                        max_in_flight_tokens=op.get("max_in_flight_tokens"), enable_caching=caching,
                                        enable_kv_cache_events=self.enable_kv_cache_events)
        hash_fn = v.get_hash_fn_by_name(op.get("hash_algo", "sha256"))
        v.init_none_hash(hash_fn)
        self.block_hasher = v.get_request_block_hasher(self.hash_block_size, hash_fn)
        self.full_sequence_must_fit = op.get("full_sequence_must_fit", False)
        self.split = self._mamba_splitter(groups, caching)

    def _mamba_splitter(self, groups: list[dict], caching: bool):
        "vLLM's `Scheduler._mamba_block_aligned_split` bound to this configuration (None: no Mamba group)."
        mamba = [g for g in groups if g["kind"] == "mamba"]
        if not mamba: return None
        coordinator = self.manager.coordinator
        partial = caching and self.hash_block_size < self.scheduler_block_size and getattr(coordinator, "enable_partial_hash_hits", False)
        stub = SimpleNamespace(
            cache_config=SimpleNamespace(block_size=self.scheduler_block_size), block_size=self.scheduler_block_size,
            hash_block_size=self.hash_block_size,
            mamba_partial_cache_hit=partial, use_eagle_block_drop=False, num_hash_lookahead_tokens=0,
            mamba_has_prefill_checkpoint_blocks=all(g.get("checkpoint_alignment") is not None for g in mamba),
            mamba_prefill_checkpoint_alignment=mamba[0].get("checkpoint_alignment"),
            max_num_scheduled_tokens=1 << 20, scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
            mamba_shared_prefix_checkpoint=False)
        return lambda request, n, hit: self.v.Scheduler._mamba_block_aligned_split(stub, request, n, hit)

    def _add(self, op: dict) -> None:
        "A request as vLLM's front end builds it: LoRA adapter, image placeholders and cache salt feed its block hashes."
        v, lora = self.v, op.get("lora")
        lora_request = v.LoRARequest(lora["name"], self.lora_ids.setdefault(lora["name"], len(self.lora_ids) + 1),
                                     lora["path"]) if lora else None
        features = [v.MultiModalFeatureSpec(data=None, modality="image", identifier=item["identifier"],
                                            mm_position=v.PlaceholderRange(item["offset"], item["length"]))
                    for item in op.get("mm_items", ())]
        self.requests[op["id"]] = v.Request(op["id"], list(op["prompt"]), v.SamplingParams(max_tokens=1 << 20), None,
                                            mm_features=features or None, lora_request=lora_request,
                                            cache_salt=op.get("cache_salt"), block_hasher=self.block_hasher)

    def lookup(self, request):
        "What the scheduler does for a waiting request: look up, and keep the shared-prefix boundary on the request."
        blocks, hit, request.shared_prefix_boundary = self.manager.get_computed_blocks(request)
        return blocks, hit

    def chunk(self, request_id: str, budget: int | None) -> int:
        "The tokens the next `schedule` of this request computes with `budget`, cut as vLLM's scheduler cuts Mamba chunks."
        request = self.requests[request_id]
        hit = self.lookup(request)[1] if request_id not in self.running else 0
        num_new = request.num_tokens - request.num_computed_tokens - hit
        if budget is not None: num_new = min(num_new, budget)
        return self.split(request, num_new, hit) if self.split and num_new > 0 else num_new

    def _schedule(self, op: dict) -> dict:
        request, waiting = self.requests[op["id"]], op["id"] not in self.running
        blocks, hit = self.lookup(request) if waiting else (None, 0)
        num_new = request.num_tokens - request.num_computed_tokens - hit
        if op.get("budget") is not None: num_new = min(num_new, op["budget"])
        out = self.manager.allocate_slots(request, num_new, hit, blocks,
                                          full_sequence_must_fit=waiting and self.full_sequence_must_fit)
        if out is not None:
            request.num_computed_tokens += hit + num_new
            request.status = self.v.RequestStatus.RUNNING
            self.running.add(op["id"])
        return {"hit_tokens": hit, "num_new_tokens": num_new, "allocated": out is not None,
                "block_ids": [list(ids) for ids in self.manager.get_block_ids(op["id"])],
                "shared_prefix_boundary": request.shared_prefix_boundary}

    def _append(self, op: dict) -> None: self.requests[op["id"]].append_output_token_ids(list(op["tokens"]))

    def _preempt(self, op: dict) -> None:
        request = self.requests[op["id"]]
        self.manager.free(request)
        request.num_computed_tokens, request.status = 0, self.v.RequestStatus.PREEMPTED
        self.running.discard(op["id"])

    def _free(self, op: dict) -> None:
        self.manager.free(self.requests.pop(op["id"])); self.running.discard(op["id"])

    def _new_step(self, op: dict) -> dict:
        copies, retained = self.manager.take_kv_cache_block_copies()
        self.manager.block_pool.free_blocks(retained)
        self.manager.new_step_starts()
        return {"copies": [[c.src_block_id, c.dst_block_id] for c in copies]}

    def _reset_prefix_cache(self, op: dict) -> dict: return {"ok": self.manager.reset_prefix_cache()}

    def take_events(self) -> list[dict]:
        "The events vLLM's manager recorded since the last call, as JSON objects (kvref's `event_to_json` shape, int hashes)."
        import msgspec
        return json.loads(json.dumps([{"type": type(e).__name__, **msgspec.structs.asdict(e)} for e in self.manager.take_events()]))


# ---------------------------------------------------------------- random hybrid configurations and workloads

LAYOUTS = ("attention", "mamba", "sub_block")  # attention groups only; Mamba without / with sub-block hits


def random_config(rng: random.Random, layout: str | None = None) -> dict:
    "A random hybrid `config` op of a `LAYOUTS` kind (default: any): groups, sizes, pool, retention, gate that vLLM 0.33 and kvref both run."
    layout = layout or rng.choice(LAYOUTS)
    groups = []
    if layout != "attention":
        bs = rng.choice([4, 8, 8, 16] if layout == "sub_block" else [2, 4, 8, 8, 16])
        align = rng.choice([None, 1, 2, bs, bs])
        groups += [{"kind": "mamba", "block_size": bs, "checkpoint_alignment": align}] * rng.randint(1, 3)
        if rng.random() < 0.25: groups.append({"kind": "sliding_window", "block_size": bs, "sliding_window": rng.randint(2, 3 * bs)})
        if rng.random() < 0.9 or len(groups) == 1: groups.append({"kind": "full", "block_size": bs})
        if rng.random() < 0.3: rng.shuffle(groups)
        unit = rng.choice([2, bs // 2]) if layout == "sub_block" else None
    else:
        sizes = rng.choice([[2], [4], [8], [4, 8], [2, 4], [8, 4], [4, 16]])
        full_bs, other_bs = sizes[0], sizes[-1]
        for _ in range(rng.randint(1, 3)):
            kind = rng.choice(["sliding_window", "sliding_window", "chunked_local"])
            if kind == "sliding_window":
                spec = {"kind": kind, "block_size": other_bs, "sliding_window": rng.randint(2, 6 * other_bs)}
            else:
                lcm = math.lcm(*sizes)
                spec = {"kind": kind, "block_size": lcm, "attention_chunk_size": lcm * rng.randint(1, 4)}
            groups += [spec] * rng.choice([1, 1, 2, 3])
        if rng.random() < 0.9: groups.append({"kind": "full", "block_size": full_bs})
        if rng.random() < 0.3: rng.shuffle(groups)
        if len(groups) == 1: groups.append({"kind": "full", "block_size": full_bs})
        unit = None
        if rng.random() < 0.15 and math.gcd(*[g["block_size"] for g in groups]) > 2: unit = 2
    block_sizes = [g["block_size"] for g in groups]
    lcm = math.lcm(*block_sizes)
    sparse = any(g["kind"] in ("sliding_window", "mamba") for g in groups)
    retention = rng.choice([None, 0, 0] + ([lcm, 2 * lcm, 3 * lcm] if sparse else []))
    config = {"op": "config", "groups": groups, "num_blocks": rng.randint(len(groups) + 3, 12 * len(groups) + 10),
              "hash_algo": rng.choice(["sha256", "sha256_cbor"]), "max_model_len": rng.choice([65536, 65536, 8 * lcm]),
              "enable_caching": rng.random() < 0.95, "retention_interval": retention}
    if unit: config["prefix_match_unit"] = unit
    if rng.random() < 0.5:
        config["full_sequence_must_fit"] = True
        if rng.random() < 0.7: config["max_in_flight_tokens"] = rng.choice([lcm, 2 * lcm, 32])
    return config


def random_workload(rng: random.Random, vllm_side: VllmHybridReplayer, config: dict, num_ops: int):
    "Yield ops of a random workload, each applied to `vllm_side` first (Mamba chunks are cut as vLLM's scheduler cuts them)."
    lcm = math.lcm(*[g["block_size"] for g in config["groups"]])
    max_len = config["max_model_len"]
    prefixes = [[rng.randrange(1000) for _ in range(rng.randint(1, 5 * lcm))] for _ in range(3)]
    prompts, live, next_id, scheduled_this_step = [], [], 0, set()

    def emit(op):
        return op, vllm_side.apply(op)

    yield emit(config)
    for _ in range(num_ops):
        r = rng.random()
        if r < 0.22 or not live:
            if prompts and rng.random() < 0.2: prompt = list(rng.choice(prompts))            # exact resend
            elif prompts and rng.random() < 0.2: prompt = list(rng.choice(prompts)) + [rng.randrange(1000) for _ in range(rng.randint(1, 2 * lcm))]
            else: prompt = list(rng.choice(prefixes))[:rng.randint(1, 5 * lcm)] + [rng.randrange(1000) for _ in range(rng.randint(0, 4 * lcm))]
            prompt = prompt[:max_len - 4] or [1]
            prompts.append(prompt)
            rid = f"r{next_id}"; next_id += 1; live.append(rid)
            yield emit({"op": "add", "id": rid, "prompt": prompt})
            continue
        rid = rng.choice(live)
        request = vllm_side.requests[rid]
        if r < 0.62:
            if request.num_computed_tokens >= request.num_tokens:  # decode: a new token first
                if request.num_tokens + 2 > max_len: yield emit({"op": "free", "id": rid}); live.remove(rid); continue
                yield emit({"op": "append", "id": rid, "tokens": [rng.randrange(1000) for _ in range(rng.choice([1, 1, 1, 2]))]})
            if rid in scheduled_this_step or rng.random() < 0.3:
                scheduled_this_step.clear(); yield emit({"op": "new_step"})
            budget = rng.choice([None, 1, 2, 3, lcm, lcm + 1, 2 * lcm, 3 * lcm - 1, 5 * lcm])
            if vllm_side.split is not None:
                budget = vllm_side.chunk(rid, budget)
                if budget <= 0: continue
            scheduled_this_step.add(rid)
            yield emit({"op": "schedule", "id": rid, **({"budget": budget} if budget is not None else {})})
        elif r < 0.70 and rid in vllm_side.running:
            yield emit({"op": "preempt", "id": rid})
        elif r < 0.82:
            live.remove(rid); yield emit({"op": "free", "id": rid})
        elif r < 0.84:
            yield emit({"op": "reset_prefix_cache"})
        else:
            scheduled_this_step.clear(); yield emit({"op": "new_step"})


def lockstep(seed: int, num_ops: int = 60, v: SimpleNamespace | None = None, layout: str | None = None):
    "Drive one random workload through vLLM and kvref op by op; (ops, vLLM decisions, first divergence or None)."
    from kvref.oracle.hybrid_replay import HybridTraceReplayer
    import kvref.core.mamba  # noqa: F401  (registers the Mamba kind)
    rng = random.Random(seed)
    vllm_side, kvref_side = VllmHybridReplayer(v), HybridTraceReplayer()
    ops, decisions = [], []
    for op, want in random_workload(rng, vllm_side, random_config(rng, layout), num_ops):
        ops.append(op); decisions.append(want)
        got = kvref_side.apply(op)
        if got != want:
            diff = {k: (got.get(k), want.get(k)) for k in {**got, **want} if got.get(k) != want.get(k)}
            return ops, decisions, f"seed {seed}, op {len(ops) - 1} {json.dumps(op)[:200]}: kvref vs vLLM {diff}"
    return ops, decisions, None


def kvref_events(kvref_side, op: dict, lora_ids: dict) -> list[dict]:
    """The events kvref's hybrid manager recorded for `op` (applied last), as vLLM publishes them (int hashes), as JSON
    objects; `lora_ids` holds the adapters' ids, each given when a request first names it (as vLLM's front end does)."""
    from kvref.distributed.kv_events import event_to_json, lora_id, wire_events
    if op["op"] == "add" and op.get("lora"): lora_id(lora_ids, op["lora"]["name"], op["lora"]["path"])
    return json.loads(json.dumps([event_to_json(e) for e in wire_events(kvref_side.manager.take_events(), "int", lora_ids)]))


def first_event_difference(mine: list[dict], theirs: list[dict], where: str) -> str | None:
    "Where kvref's events for one op first differ from vLLM's, or None."
    if mine == theirs: return None
    at = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
    return f"{where}: event {at} kvref {json.dumps(mine[at:at + 1])[:600]} vs vLLM {json.dumps(theirs[at:at + 1])[:600]}"


def events_in_lockstep(ops: list[dict], v: SimpleNamespace | None = None) -> str | None:
    "Apply fixed hybrid ops to vLLM's and kvref's managers, events on; where the events first differ, or None."
    from kvref.oracle.hybrid_replay import HybridTraceReplayer
    import kvref.core.mamba  # noqa: F401  (registers the Mamba kind)
    vllm_side, kvref_side, lora_ids = VllmHybridReplayer(v, enable_kv_cache_events=True), HybridTraceReplayer(enable_kv_cache_events=True), {}
    for i, op in enumerate(ops):
        if vllm_side.apply(op) != kvref_side.apply(op): return f"op {i}: decisions differ"
        diff = first_event_difference(kvref_events(kvref_side, op, lora_ids), vllm_side.take_events(), f"op {i} {json.dumps(op)[:120]}")
        if diff: return diff
    return None


def lockstep_events(seed: int, num_ops: int = 60, v: SimpleNamespace | None = None, layout: str | None = None):
    "`lockstep`'s workload with KV events on in both managers; (ops, vLLM's events per op, first divergence or None)."
    from kvref.oracle.hybrid_replay import HybridTraceReplayer
    import kvref.core.mamba  # noqa: F401  (registers the Mamba kind)
    rng = random.Random(seed)
    vllm_side, kvref_side = VllmHybridReplayer(v, enable_kv_cache_events=True), HybridTraceReplayer(enable_kv_cache_events=True)
    ops, events, lora_ids = [], [], {}
    for op, want in random_workload(rng, vllm_side, random_config(rng, layout), num_ops):
        ops.append(op); events.append(vllm_side.take_events())
        got = kvref_side.apply(op)
        if got != want: return ops, events, f"seed {seed}, op {len(ops) - 1}: decisions differ (see lockstep)"
        diff = first_event_difference(kvref_events(kvref_side, op, lora_ids), events[-1], f"seed {seed}, op {len(ops) - 1} {json.dumps(op)[:120]}")
        if diff: return ops, events, diff
    return ops, events, None


def record(ops: list[dict], decisions: list[dict], out_dir: Path, name: str) -> None:
    "Write a run as a hybrid trace in the shared format: `name.jsonl` (ops) and `name.vllm.jsonl` (vLLM's decisions)."
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.jsonl").write_text("".join(json.dumps(op) + "\n" for op in ops))
    (out_dir / f"{name}.vllm.jsonl").write_text("".join(json.dumps(d) + "\n" for d in decisions))


def record_events(ops: list[dict], events: list[list[dict]], out_dir: Path, name: str) -> None:
    "Write a run with KV events: `name.jsonl` (ops) and `name.events.jsonl` (vLLM's events after each op, one list a line)."
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.jsonl").write_text("".join(json.dumps(op) + "\n" for op in ops))
    (out_dir / f"{name}.events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


if __name__ == "__main__":
    seed, layout = int(sys.argv[1]), sys.argv[3] if len(sys.argv) > 3 else None
    ops, decisions, diff = lockstep(seed, 60, layout=layout)
    record(ops, decisions, Path(sys.argv[2] if len(sys.argv) > 2 else "."), f"hybrid-{layout or 'random'}-{seed}")
    print(diff or f"seed {seed}: kvref agrees on all {len(ops)} ops")
