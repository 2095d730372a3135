"""Record `golden/events/wire/<version>.jsonl`: KV event batches encoded by each vLLM release's own classes.

Where the releases live: `KVREF_VLLM_SOURCES` names a folder with one entry per release, named by its version, each
holding that release's Python sources as its PyPI wheel ships them (`vllm/distributed/kv_events.py` is all that is
read). The release's module is executed as it is, with msgspec and pyzmq installed; its imports of other vLLM modules
(`vllm.config`, `vllm.logger`, `vllm.v1.core.kv_cache_utils`, `vllm.utils.network_utils`) get stand-ins, since the
event classes use them only in annotations and in the publisher's methods. Each release runs in its own process.

Run: `KVREF_VLLM_SOURCES=DIR python tests/wire_vllm_support.py [VERSION...]` (default: every release in DIR).
"""
from __future__ import annotations

import base64
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "golden" / "events" / "wire"
TYPES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")


def cases() -> list[dict]:
    "The batches every release encodes: kvref's 0.33 JSON form (every field), cut to each release's fields."
    recorded = [json.loads(line) for line in (ROOT / "golden/events/design-doc-example.events.jsonl").open()]
    design = [r["events"] for r in recorded if r["events"]]
    digests = [json.loads(line) for line in (ROOT / "golden/events/trace-11-0.events.bytes.jsonl").open()]
    byte_batch = next(r["events"] for r in digests if len(r["events"]) > 1)
    stored = dict(type="BlockStored", block_hashes=[1, 2], parent_block_hash=None, token_ids=[5, 6, 7, 8, 9, 10, 11, 12],
                  block_size=4, lora_id=None, medium="GPU", lora_name=None, extra_keys=None, group_idx=None,
                  kv_cache_spec_kind=None, kv_cache_spec_sliding_window=None, locality=None, ownership=None,
                  session_id=None, lookahead_token_ids=None)
    every = dict(stored, block_hashes=[2**64 - 1, 2**63], parent_block_hash=7, lora_id=3, lora_name="sql",
                 extra_keys=[["sql", ["img-0", -2], "tenant-ü"], ["sql"]], group_idx=1, kv_cache_spec_kind="sliding_window",
                 kv_cache_spec_sliding_window=128, locality="LOCAL", ownership="tier-1", session_id="s1",
                 lookahead_token_ids=[[13, 14], [15]])
    removed = dict(type="BlockRemoved", block_hashes=[7], medium="GPU", group_idx=None, locality=None, ownership=None)
    return [
        *({"name": f"design-doc-example-{n}", "ts": 0.0, "events": events, "data_parallel_rank": 0}
          for n, events in enumerate(design)),
        {"name": "rank-unset", "ts": 0.0, "events": design[0], "data_parallel_rank": None},
        {"name": "rank-3-ts", "ts": 1767225600.25, "events": design[1], "data_parallel_rank": 3},
        {"name": "digests", "ts": 0.0, "events": byte_batch, "data_parallel_rank": 0, "hash_form": "bytes"},
        {"name": "every-field", "ts": 0.0, "data_parallel_rank": 0,
         "events": [every, dict(removed, group_idx=1, locality="REMOTE", ownership="tier-1"), {"type": "AllBlocksCleared"}]},
        {"name": "nones", "ts": 0.0, "data_parallel_rank": 0,
         "events": [dict(stored, medium=None), dict(removed, medium=None)]},
        {"name": "signed-hashes", "ts": 0.0, "data_parallel_rank": 0,
         "events": [dict(stored, block_hashes=[-5, -(2**63)], parent_block_hash=-1)]},
        {"name": "long", "ts": 0.0, "data_parallel_rank": 0,
         "events": [dict(stored, block_hashes=list(range(100, 120)), token_ids=list(range(80)), block_size=4)]
                   + [dict(removed, block_hashes=[h]) for h in range(100, 117)]},
        {"name": "empty", "ts": 0.0, "events": [], "data_parallel_rank": 0},
    ]


class _StandIn:
    "Whatever the module needs at import time from another vLLM module (a logger, a config class): does nothing."
    def __init__(self, *args, **kwargs): pass
    def __getattr__(self, name): return lambda *args, **kwargs: None


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    "Any `vllm.*` module but the one under test: every attribute is `_StandIn` (`ExternalBlockHash`: `bytes | int`)."
    def find_spec(self, name, path=None, target=None):
        if name == "vllm" or (name.startswith("vllm.") and name != "vllm.distributed.kv_events"):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None
    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda attr: (bytes | int) if attr == "ExternalBlockHash" else _StandIn
        return module
    def exec_module(self, module): pass


def _release_module(source: Path):
    "The release's `vllm.distributed.kv_events`, executed from `source`."
    sys.meta_path.insert(0, _StandIns())
    spec = importlib.util.spec_from_file_location("vllm.distributed.kv_events", source / "vllm/distributed/kv_events.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _record(source: Path) -> list[dict]:
    "Each case as the release's classes encode it (in this process)."
    import msgspec
    module = _release_module(source)
    encoder = msgspec.msgpack.Encoder()  # as ZmqEventPublisher holds it
    batch_fields = module.KVEventBatch.__struct_fields__
    lines = []
    for case in cases():
        events = []
        for event in case["events"]:
            cls = getattr(module, event["type"])
            values = {f: event.get(f) for f in cls.__struct_fields__}
            if case.get("hash_form") == "bytes":
                values["block_hashes"] = [bytes.fromhex(h) for h in values["block_hashes"]]
                if values.get("parent_block_hash"): values["parent_block_hash"] = bytes.fromhex(values["parent_block_hash"])
            events.append((event["type"], cls(**values), values))
        args = {"ts": case["ts"], "events": [e for _, e, _ in events]}
        if "data_parallel_rank" in batch_fields: args["data_parallel_rank"] = case["data_parallel_rank"]
        payload = encoder.encode(module.KVEventBatch(**args))
        as_json = lambda v: v.hex() if isinstance(v, bytes) else [as_json(x) for x in v] if isinstance(v, list) else v
        lines.append({"name": case["name"], "hash_form": case.get("hash_form", "int"), "ts": case["ts"],
                      "events": [{"type": t, **{k: as_json(v) for k, v in values.items()}} for t, _, values in events],
                      **({"data_parallel_rank": case["data_parallel_rank"]} if "data_parallel_rank" in batch_fields else {}),
                      "payload_b64": base64.b64encode(payload).decode()})
    return lines


def _layout(source: Path) -> dict:
    "The release's struct fields and options, as read from its classes."
    module = _release_module(source)
    out = {}
    for name in (*TYPES, "KVEventBatch"):
        cls = getattr(module, name)
        config = cls.__struct_config__
        out[name] = {"fields": list(cls.__struct_fields__), "defaults": len(cls.__struct_defaults__),
                     "array_like": config.array_like, "omit_defaults": config.omit_defaults, "tag": config.tag}
    return out


def main(versions: list[str]) -> None:
    root = Path(os.environ["KVREF_VLLM_SOURCES"])
    versions = versions or sorted((p.name for p in root.iterdir() if (p / "vllm/distributed/kv_events.py").exists()),
                                  key=lambda v: [int(x) for x in v.split(".")])
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for version in versions:
        done = subprocess.run([sys.executable, __file__, "--one", str(root / version)], capture_output=True, text=True)
        if done.returncode: raise RuntimeError(f"{version}:\n{done.stderr[-3000:]}")
        answer = json.loads(done.stdout)
        meta = {"meta": {"vllm": version, "msgspec": answer["msgspec"], "layout": answer["layout"]}}
        lines = [meta] + answer["lines"]
        (GOLDEN / f"{version}.jsonl").write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
        print(version, len(answer["lines"]), "batches")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        import msgspec
        source = Path(sys.argv[2])
        print(json.dumps({"msgspec": msgspec.__version__, "layout": _layout(source), "lines": _record(source)}))
    else: main(sys.argv[1:])
