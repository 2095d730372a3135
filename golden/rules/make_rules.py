"""Write the rule vectors: for each rule an allocator must follow (docs/engine-authors.md), the shortest trace that
shows it and vLLM 0.33's decisions for it, as kvref's `vllm_0_33` allocator makes them.

Run from the repository root: `python golden/rules/make_rules.py`. The traces are below, one list of ops per rule.
"""
import json
from pathlib import Path

from kvref.oracle.replay import replay

RULES = {
    # A freed request's blocks go back last block first; those without a hash (the partial last block, lookahead
    # slots) to the head of the free queue as one group, the hashed ones to the tail.
    "free-unhashed-to-head": [
        {"op": "config", "num_blocks": 8, "block_size": 2, "version": 2},
        {"op": "add", "id": "r", "prompt": [0, 1, 2, 3, 4]},
        {"op": "schedule", "id": "r", "num_lookahead_tokens": 2},
        {"op": "free", "id": "r"},
    ],
    # Two requests computing the same block at once cache two copies under one hash; evicting the later copy leaves
    # the earlier one reachable (vLLM keeps every block under a hash; a map from a hash to one block id loses it).
    "duplicate-blocks-stay-reachable": [
        {"op": "config", "num_blocks": 7, "block_size": 2},
        {"op": "add", "id": "a", "prompt": [0, 1, 9]},
        {"op": "add", "id": "b", "prompt": [0, 1, 8]},
        {"op": "schedule", "id": "a", "budget": 1},
        {"op": "schedule", "id": "b", "budget": 1},
        {"op": "schedule", "id": "a"},
        {"op": "schedule", "id": "b"},
        {"op": "free", "id": "b"},
        {"op": "free", "id": "a"},
        {"op": "add", "id": "c", "prompt": [5, 5, 6, 6, 7, 7, 4, 4, 3]},
        {"op": "schedule", "id": "c"},
        {"op": "free", "id": "c"},
        {"op": "add", "id": "d", "prompt": [0, 1, 3]},
        {"op": "schedule", "id": "d"},
    ],
    # A LoRA adapter enters every block hash by its name and its path: the same name at another path shares nothing.
    "lora-name-and-path": [
        {"op": "config", "num_blocks": 8, "block_size": 2},
        {"op": "add", "id": "a", "prompt": [0, 1, 2], "lora": {"name": "sql", "path": "/adapters/sql-v1"}},
        {"op": "schedule", "id": "a"},
        {"op": "add", "id": "b", "prompt": [0, 1, 2], "lora": {"name": "sql", "path": "/adapters/sql-v2"}},
        {"op": "schedule", "id": "b"},
    ],
    # A block overlapping a multimodal item hashes its identifier and its offset from the block's first token: the
    # same image one token later is another block; a block the item does not overlap is shared.
    "mm-offset-in-block": [
        {"op": "config", "num_blocks": 8, "block_size": 4},
        {"op": "add", "id": "a", "prompt": [0, 1, 2, 3, 4, 5, 6, 7, 8], "mm_items": [{"identifier": "img", "offset": 4, "length": 2}]},
        {"op": "schedule", "id": "a"},
        {"op": "add", "id": "b", "prompt": [0, 1, 2, 3, 4, 5, 6, 7, 8], "mm_items": [{"identifier": "img", "offset": 5, "length": 2}]},
        {"op": "schedule", "id": "b"},
    ],
}


def jsonl(records) -> str: return "".join(json.dumps(r) + "\n" for r in records)


if __name__ == "__main__":
    here = Path(__file__).parent
    for name, ops in RULES.items():
        (here / f"{name}.jsonl").write_text(jsonl(ops))
        (here / f"{name}.vllm.jsonl").write_text(jsonl(replay(ops)))
        print(name, len(ops), "ops")
