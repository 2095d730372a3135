"""Write kvref's own versioned block-hash vectors: `golden/hashing/kvref-block-hashes-v1.json`.

Run `.venv/bin/python golden/hashing/make_vectors.py` from the project root. The output is deterministic (fixed
random seed, explicit NONE_HASH seeds), covers every reproducible algorithm (sha256, sha256_cbor, xxhash,
xxhash_cbor; `builtin` is left out because no two processes agree on it), every extra-key kind (cache salt, LoRA,
multimodal items including ones that span blocks and sit at negative relative offsets, prompt embeddings, all
together, the LoRA-name/salt pair "X"/"X"), block sizes 1 to 32, empty, sub-block, exact and multi-block prompts,
token ids at every CBOR/pickle integer width, and the 64-bit ids of KV events. Same format as
`vllm-0.33-block-hashes.json`, plus `prompt_embeds` ({"dtype", "rows"}) and `block_ids_int64`.
`kvref hash --check golden/hashing/kvref-block-hashes-v1.json` verifies it.
"""
from __future__ import annotations
import json, random, sys
from pathlib import Path

import numpy as np

from kvref.core.hashing import LoRARequest, MultiModalItem, block_hash_to_int64
from kvref.core.fast_hashing import hash_request_tokens

VERSION = 1
OUT = Path(__file__).with_name(f"kvref-block-hashes-v{VERSION}.json")
ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
KINDS = ("plain", "salt", "lora", "mm", "prompt_embeds", "all", "lora_x", "salt_x")
EDGE_TOKENS = (0, 1, 23, 24, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 1)
SALTS = ("tenant-a", "sålt-ü", "X", "")


def _prompt_length(rng: random.Random, block_size: int, shape: str) -> int:
    return {"empty": 0, "partial": rng.randrange(0, block_size), "exact": block_size,
            "multi": block_size * rng.randint(2, 5) + rng.randrange(0, block_size)}[shape]


def _mm_items(rng: random.Random, num_tokens: int) -> list[dict]:
    "Up to three disjoint placeholder ranges inside the prompt, some longer than a block."
    items, cursor = [], rng.randrange(0, 3)
    for k in range(rng.randint(1, 3)):
        length = rng.randint(1, max(1, num_tokens // 3))
        if cursor + length > num_tokens: break
        items.append({"identifier": f"img{rng.randrange(10**6):06d}", "offset": cursor, "length": length})
        cursor += length + rng.randrange(0, 4)
    return items


def _vector(rng: random.Random, algo: str, block_size: int, kind: str, shape: str) -> dict:
    n = _prompt_length(rng, block_size, shape)
    tokens = [rng.choice(EDGE_TOKENS) if rng.random() < 0.15 else rng.randrange(200_000) for _ in range(n)]
    v = {"algo": algo, "block_size": block_size, "prompt_token_ids": tokens, "cache_salt": None, "lora": None,
         "mm": None, "none_hash_seed": rng.choice(("vllm-none-hash", "vllm-none-hash", "0", "42"))}
    if kind in ("salt", "all"): v["cache_salt"] = rng.choice(SALTS)
    if kind in ("lora", "all"): v["lora"] = {"name": "sql", "path": "/adapters/sql-v2"}
    if kind == "lora_x": v["lora"] = {"name": "X", "path": "/adapters/x"}
    if kind == "salt_x": v["cache_salt"] = "X"
    if kind in ("mm", "all") and n: v["mm"] = _mm_items(rng, n) or None
    if kind in ("prompt_embeds", "all"):
        rows = [[rng.randrange(-64, 64) / 8 for _ in range(4)] for _ in range(n)]
        v["prompt_embeds"] = {"dtype": "float32", "rows": rows}
    return v


def _fill(v: dict) -> dict:
    embeds = v.get("prompt_embeds")
    hashes = hash_request_tokens(
        v["prompt_token_ids"], v["block_size"], v["algo"], cache_salt=v["cache_salt"], seed=v["none_hash_seed"],
        lora=LoRARequest(**v["lora"]) if v["lora"] else None,
        mm_items=[MultiModalItem(**m) for m in v["mm"] or ()],
        prompt_embeds=None if embeds is None else np.asarray(embeds["rows"], dtype=embeds["dtype"]))
    v["block_hashes"] = [h.hex() for h in hashes]
    v["block_ids_int64"] = [block_hash_to_int64(h) for h in hashes]
    return v


def build_vectors() -> dict:
    "kvref's vector file as a dict (deterministic)."
    rng = random.Random(20261122)
    shapes = ("empty", "partial", "exact", "multi")
    vectors = []
    for algo in ALGOS:
        for block_size in range(1, 33):
            kind = KINDS[(block_size + ALGOS.index(algo)) % len(KINDS)]
            shape = "multi" if block_size % 2 else shapes[(block_size // 2) % len(shapes)]
            vectors.append(_fill(_vector(rng, algo, block_size, kind, shape)))
        for kind in KINDS:  # every kind at the common block size 16, multi-block
            vectors.append(_fill(_vector(rng, algo, 16, kind, "multi")))
    return {"source": "kvref golden/hashing/make_vectors.py", "format": "vllm-0.33-block-hashes",
            "kvref_vectors_version": VERSION,
            "notes": "NONE_HASH = hash(none_hash_seed); block_ids_int64 = last 8 bytes of each hash, big-endian, unsigned",
            "vectors": vectors}


def dumps(data: dict) -> str:
    "One vector per line: diffs stay readable."
    head = {k: v for k, v in data.items() if k != "vectors"}
    lines = ",\n".join("  " + json.dumps(v, ensure_ascii=False) for v in data["vectors"])
    return json.dumps(head, ensure_ascii=False)[:-1] + ', "vectors": [\n' + lines + "\n]}\n"


if __name__ == "__main__":
    OUT.write_text(dumps(build_vectors()), encoding="utf-8")
    print(f"wrote {OUT} ({len(build_vectors()['vectors'])} vectors)", file=sys.stderr)
