"""Runs inside one vLLM release's interpreter (0.8.5 to 0.33) and answers with that release's own code, on CPU.

Reads one JSON object on stdin and prints one JSON object:
- `{"kind": "info"}`: the release's version, hash algorithms, default algo and whether it has KV events.
- `{"kind": "hash", "cases": [...]}`: per case (`algo`, `block_size`, `prompt_token_ids`, `output_token_ids`, `cache_salt`,
  `lora` {name, path, int_id}, `mm` [{identifier, offset, length}]), the release's NONE_HASH, the hash of every full
  block and the extra keys it hashed, and what its `BlockStored` KV events carry, all from driving the release's own
  `Request` and `KVCacheManager` through a prefill and one decode step per output token (the scheduler's order). The
  process's PYTHONHASHSEED is the caller's: releases up to 0.10.0 read it once at import.
- `{"kind": "trace", "ops": [...]}`: the decisions of an allocator trace (the format of `golden/versions/*/traces`),
  with kvref's `TraceDriver` acting as the scheduler over the release's `KVCacheManager`; `{"kind": "traces",
  "traces": [[...], ...]}`: the same for several traces, one list of decisions each.

Nothing of vLLM is edited or re-implemented; only a missing `torch.compile` on CPU is not needed here. Used by
`tests/release_vllm_support.py`."""
from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys


def _quiet() -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


_quiet()
import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.v1.core import kv_cache_utils as kcu  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1 import kv_cache_interface as kci  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.multimodal import inputs as mm_inputs  # noqa: E402

VERSION = tuple(int(x) for x in vllm.__version__.split("+")[0].split(".")[:3] if x.isdigit())
MANAGER_PARAMS = inspect.signature(KVCacheManager.__init__).parameters
REQUEST_PARAMS = inspect.signature(Request.__init__).parameters
INT_HASHES = hasattr(kcu, "BlockHashType") or (hasattr(kcu, "BlockHash") and hasattr(kcu.BlockHash, "_fields"))


def _hash_fns() -> dict:
    "name -> hash function, as `--prefix-caching-hash-algo` offers them."
    try: from vllm.utils.hashing import get_hash_fn_by_name
    except ImportError:
        try: from vllm.utils import get_hash_fn_by_name
        except ImportError: get_hash_fn_by_name = None
    if get_hash_fn_by_name is None:  # 0.8.5-0.10.0: the manager picks builtin hash(), sha256 (or sha256_cbor_64bit)
        import vllm.utils as utils
        return {"builtin": hash, "sha256": utils.sha256,
                **({"sha256_cbor_64bit": utils.sha256_cbor_64bit} if hasattr(utils, "sha256_cbor_64bit") else {})}
    names = ("builtin", "sha256", "sha256_cbor_64bit", "sha256_cbor", "xxhash", "xxhash_cbor")
    fns = {}
    for name in names:
        try: fns[name] = get_hash_fn_by_name(name)
        except (ValueError, ImportError): pass
    return fns


HASH_FNS = _hash_fns()


def _default_algo() -> str:
    from vllm.config import CacheConfig
    field = {f.name: f for f in dataclasses.fields(CacheConfig)}["prefix_caching_hash_algo"]
    return field.default


def _dataclass(cls, **values):
    "An instance of `cls` from the values its fields accept (fields vary between releases)."
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def _kv_config(num_blocks: int, block_size: int):
    spec = _dataclass(kci.FullAttentionSpec, block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32,
                      use_mla=False)
    group = kci.KVCacheGroupSpec(["layer.0"], spec)
    return _dataclass(kci.KVCacheConfig, num_blocks=num_blocks, tensors={}, kv_cache_tensors=[], kv_cache_groups=[group])


def _hasher(algo: str):
    "(hash_fn, calls): the release's hash function wrapped to note every (parent, tokens, extra_keys) it hashes."
    fn, calls = HASH_FNS[algo], {}
    def wrapped(obj):
        h = fn(obj)
        if isinstance(obj, tuple) and len(obj) == 3: calls[h] = obj[2]
        return h
    return wrapped, calls


class Release:
    "One KV cache manager of the release, with the release's `Request`s."
    def __init__(self, num_blocks: int, block_size: int, algo: str, enable_caching: bool = True, events: bool = False,
                 max_model_len: int = 65536):
        self.block_size, self.algo = block_size, algo
        self.hash_fn, self.calls = _hasher(algo)
        if hasattr(kcu, "init_none_hash"): kcu.init_none_hash(self.hash_fn)
        kwargs = dict(kv_cache_config=_kv_config(num_blocks, block_size), max_model_len=max_model_len,
                      enable_caching=enable_caching, caching_hash_algo=algo, enable_kv_cache_events=events,
                      hash_block_size=block_size, scheduler_block_size=block_size)
        self.manager = KVCacheManager(**{k: v for k, v in kwargs.items() if k in MANAGER_PARAMS})
        if "caching_hash_algo" in MANAGER_PARAMS: self._wrap_manager_hash()
        self.block_hasher = (kcu.get_request_block_hasher(block_size, self.hash_fn)
                             if "block_hasher" in REQUEST_PARAMS else None)
        self.lora_ids: dict[str, int] = {}

    def _wrap_manager_hash(self) -> None:
        "Up to 0.10.0 the manager (and its coordinator's managers) hold the hash function: wrap it there."
        objects = [self.manager, getattr(self.manager, "coordinator", None), getattr(self.manager, "specialized_manager", None)]
        objects += list(getattr(objects[1], "single_type_managers", ()) or ())
        for obj in objects:
            if obj is not None and hasattr(obj, "caching_hash_fn"): obj.caching_hash_fn = self.hash_fn

    def request(self, request_id: str, prompt: list[int], cache_salt=None, lora=None, mm=()):
        lora_request = None
        if lora:
            int_id = lora.get("int_id") or self.lora_ids.setdefault(lora["name"], len(self.lora_ids) + 1)
            lora_request = LoRARequest(lora["name"], int_id, lora["path"])
        kwargs = dict(request_id=request_id, prompt_token_ids=list(prompt), sampling_params=SamplingParams(max_tokens=1 << 20),
                      eos_token_id=None, arrival_time=0.0, lora_request=lora_request, pooling_params=None)
        if "cache_salt" in REQUEST_PARAMS: kwargs["cache_salt"] = cache_salt
        if "block_hasher" in REQUEST_PARAMS: kwargs["block_hasher"] = self.block_hasher
        items = list(mm or ())
        if "mm_features" in REQUEST_PARAMS:
            kwargs["mm_features"] = [_dataclass(mm_inputs.MultiModalFeatureSpec, data=None, modality="image",
                                                identifier=i["identifier"], mm_hash=i["identifier"],
                                                mm_position=mm_inputs.PlaceholderRange(i["offset"], i["length"]))
                                     for i in items] or None
        else:
            placeholders = [mm_inputs.PlaceholderRange(offset=i["offset"], length=i["length"]) for i in items]
            kwargs["multi_modal_hashes"] = [i["identifier"] for i in items] or None
            kwargs["multi_modal_placeholders"] = placeholders or None
            key = "multi_modal_kwargs" if "multi_modal_kwargs" in REQUEST_PARAMS else "multi_modal_inputs"
            kwargs[key] = [None] * len(items) or None
        return Request(**{k: v for k, v in kwargs.items() if k in REQUEST_PARAMS})

    def lookup(self, request):
        blocks, num_tokens = self.manager.get_computed_blocks(request)[:2]
        return blocks, num_tokens

    def allocate(self, request, num_new_tokens: int, num_hit_tokens: int, hits):
        params = inspect.signature(self.manager.allocate_slots).parameters
        if "num_tokens" in params:  # 0.8.5: allocate_slots(request, num_tokens, new_computed_blocks)
            return self.manager.allocate_slots(request, num_new_tokens, hits if num_hit_tokens else None)
        return self.manager.allocate_slots(request, num_new_tokens, num_hit_tokens, hits if num_hit_tokens else None)

    def block_hashes(self, request) -> list:
        "The request's block hashes as the release keeps them (manager-side up to 0.10.0)."
        if hasattr(request, "block_hashes"): return list(request.block_hashes)
        return list(self.manager.req_to_block_hashes[request.request_id])

    def take_events(self) -> list:
        take = getattr(self.manager, "take_events", None) or self.manager.block_pool.take_events
        return take()


def _encode(value) -> str:
    if isinstance(value, bytes): return value.hex()
    return str(value)


def _jsonable(obj):
    if isinstance(obj, tuple) or isinstance(obj, list): return [_jsonable(x) for x in obj]
    if isinstance(obj, bytes): return obj.hex()
    return obj


def _run_case(case: dict, events: bool):
    "Prefill, then one decode step per output token; the release, the request, and the events taken."
    size = case["block_size"]
    prompt, outputs = case["prompt_token_ids"], case.get("output_token_ids") or []
    num_blocks = (len(prompt) + len(outputs)) // size + 4
    release = Release(num_blocks, size, case["algo"], events=events)
    request = release.request("c", prompt, case.get("cache_salt"), case.get("lora"), case.get("mm"))
    taken = []
    hits, num_hit = release.lookup(request)
    assert num_hit == 0
    assert release.allocate(request, len(prompt), 0, hits) is not None
    request.num_computed_tokens = len(prompt)
    if events: taken += release.take_events()
    for token in outputs:
        request.append_output_token_ids(token)
        assert release.allocate(request, 1, 0, None) is not None
        request.num_computed_tokens += 1
        if events: taken += release.take_events()
    return release, request, taken


def _stored_hashes(events: list) -> list[str]:
    return [_encode(h) for e in events if type(e).__name__ == "BlockStored" for h in e.block_hashes]


def hash_case(case: dict) -> dict:
    "What the release computes for one case."
    release, request, _ = _run_case(case, events=False)
    hashes = release.block_hashes(request)
    if INT_HASHES:
        values = [h.hash_value for h in hashes]
        keys = [h.extra_keys for h in hashes]
    else:
        values, keys = hashes, [release.calls[h] for h in hashes]
    answer = dict(none_hash=_encode(kcu.NONE_HASH), block_hashes=[_encode(v) for v in values],
                  extra_keys=_jsonable(keys))
    if hasattr(kcu, "NONE_HASH") and hasattr(kcu, "get_none_hash_seed"): answer["none_hash_seed"] = kcu.get_none_hash_seed()
    if "enable_kv_cache_events" in MANAGER_PARAMS:
        try: answer["event_block_hashes"] = _stored_hashes(_run_case(case, events=True)[2])
        except Exception as e: answer["event_block_hashes"] = {"error": f"{type(e).__name__}: {e}"}
    return answer


class TraceAdapter:
    "The release's `KVCacheManager` behind kvref's adapter protocol 2, acting as the release's scheduler does."
    protocol_version = 2
    def __init__(self, config: dict):
        algo = config["hash_algo"] if config["hash_algo"] in HASH_FNS else _default_algo()
        self.release = Release(config["num_blocks"], config["block_size"], algo, config["enable_caching"],
                               max_model_len=config["max_model_len"] or 65536)
        self.manager, self.hash_algo_used = self.release.manager, algo
        self.requests, self._hits = {}, {}

    def add(self, request_id, prompt, *, cache_salt=None, lora=None, mm_items=()):
        mm = [dict(identifier=i["identifier"], offset=i["offset"], length=i["length"]) for i in mm_items]
        self.requests[request_id] = self.release.request(request_id, prompt, cache_salt, lora, mm)

    def lookup(self, request_id):
        self._hits[request_id], num_tokens = self.release.lookup(self.requests[request_id])
        return num_tokens

    def allocate(self, request_id, num_new_tokens, num_hit_tokens, *, num_computed_tokens=0, num_lookahead_tokens=0):
        request, hits = self.requests[request_id], self._hits.pop(request_id, None)
        request.num_computed_tokens = num_computed_tokens
        return self.release.allocate(request, num_new_tokens, num_hit_tokens, hits) is not None

    def append(self, request_id, tokens):
        for token in tokens: self.requests[request_id].append_output_token_ids(token)

    def preempt(self, request_id):
        self.manager.free(self.requests[request_id])
        self.requests[request_id].num_computed_tokens = 0

    def free(self, request_id):
        request = self.requests.pop(request_id)
        self.manager.free(request)
        if hasattr(self.manager, "free_block_hashes"): self.manager.free_block_hashes(request)  # up to 0.10.0

    def reset_prefix_cache(self): return self.manager.reset_prefix_cache()

    def block_ids(self, request_id):
        if hasattr(self.manager, "get_block_ids"): return list(self.manager.get_block_ids(request_id)[0])
        return [b.block_id for b in self.manager.req_to_blocks.get(request_id, ())]  # 0.8.5

    def num_free(self): return self.manager.block_pool.get_num_free_blocks()

    def free_queue(self): return [b.block_id for b in self.manager.block_pool.free_block_queue.get_all_free_blocks()]


def trace_decisions(ops: list[dict]) -> list[dict]:
    "The release's decision for each op of an allocator trace (kvref's `TraceDriver` as the scheduler)."
    from kvref.oracle.replay import TraceDriver

    class Driver(TraceDriver):
        def _config(self, op):
            TraceDriver._config(self, op)
            return {"hash_algo_used": self.adapter.hash_algo_used}

        def _schedule(self, op):
            try: return TraceDriver._schedule(self, op)
            except Exception as e: return {"error": f"{type(e).__name__}: {e}"}

    driver = Driver(TraceAdapter)
    return [driver.apply(op) for op in ops]


def info() -> dict:
    return dict(vllm_version=vllm.__version__, hash_algos=sorted(HASH_FNS), default_hash_algo=_default_algo(),
                kv_events="enable_kv_cache_events" in MANAGER_PARAMS, cache_salt="cache_salt" in REQUEST_PARAMS,
                python=sys.version.split()[0])


def main() -> None:
    query = json.load(sys.stdin)
    if query["kind"] == "info": out = info()
    elif query["kind"] == "hash": out = [hash_case(c) for c in query["cases"]]
    elif query["kind"] == "trace": out = trace_decisions(query["ops"])
    elif query["kind"] == "traces": out = [trace_decisions(ops) for ops in query["traces"]]
    else: raise ValueError(f"unknown kind {query['kind']!r}")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
