"""kvref's `HybridKVCacheManager` against vLLM 0.33's own `KVCacheManager`, op by op, on random hybrid workloads
(`hybrid_vllm_support.py`): random mixes of full / sliding window / chunked local / Mamba groups, windows, chunk sizes,
block sizes (mixed included), tiny pools, shared prefixes and resends, chunked prefills (Mamba chunks cut as vLLM's
scheduler cuts them), decode appends, preemptions, frees, `new_step`, `reset_prefix_cache`, retention settings, the
admission gate, sub-block hits. Every decision is compared: hits, per-group block tables, refusals, shared-prefix
boundaries, copies, the free queue.

The lockstep tests skip where vLLM 0.33 does not import; the recorded divergences (`golden/hybrid/vllm-diff/`) replay
everywhere. `KVREF_SLOW=1` runs the bigger sweep."""
import json
from pathlib import Path

import pytest

from hybrid_vllm_support import LAYOUTS, VllmHybridReplayer, load_vllm, lockstep
from kvref.oracle.hybrid_replay import replay_hybrid
import kvref.core.mamba  # noqa: F401  (registers the Mamba kind)

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "hybrid"
DIFF = GOLDEN / "vllm-diff"


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def diff_traces() -> list:
    return sorted(p.name.removesuffix(".jsonl") for p in DIFF.glob("*.jsonl") if not p.name.endswith(".vllm.jsonl"))


@pytest.mark.parametrize("name", diff_traces())
def test_recorded_divergences_replay(name):
    "Runs vLLM decided differently from kvref before, recorded as golden traces."
    assert replay_hybrid(read(DIFF / f"{name}.jsonl")) == read(DIFF / f"{name}.vllm.jsonl")


@pytest.fixture(scope="module")
def vllm():
    try: return load_vllm()
    except ImportError as e: pytest.skip(str(e))


@pytest.mark.parametrize("path", sorted(p for p in GOLDEN.rglob("*.jsonl") if not p.name.endswith(".vllm.jsonl")
                                        and p.parent.name not in ("vllm-diff", "events")), ids=lambda p: p.stem)
def test_the_driver_reproduces_the_recorded_vllm_traces(vllm, path):
    "The vLLM side of the lockstep is trustworthy: it makes every recorded vLLM 0.33 decision of the shared traces."
    replayer = VllmHybridReplayer(vllm)
    for i, (op, want) in enumerate(zip(read(path), read(path.with_name(path.stem + ".vllm.jsonl")), strict=True)):
        assert replayer.apply(op) == want, f"op {i}: {op}"


def sweep(vllm, layout: str, seeds: range) -> list[str]:
    "The first divergence of every seed that has one."
    return [diff for seed in seeds if (diff := lockstep(seed, 60, vllm, layout)[2])]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_random_workloads_agree_with_vllm(vllm, layout):
    assert sweep(vllm, layout, range(150)) == []


def test_sub_block_copies_are_taken_group_by_group_with_the_new_blocks(vllm):
    "Mamba (group 0) and full attention both hit inside a block and both need a new block: vLLM's order is m-copy, m-new, f-copy, f-new."
    ops = [{"op": "config", "groups": [{"kind": "mamba", "block_size": 8, "checkpoint_alignment": None},
                                       {"kind": "full", "block_size": 8}], "num_blocks": 16, "prefix_match_unit": 2},
           {"op": "add", "id": "a", "prompt": list(range(13))}, {"op": "schedule", "id": "a", "budget": 12},
           {"op": "new_step"}, {"op": "add", "id": "b", "prompt": list(range(13)) + list(range(50, 60))},
           {"op": "schedule", "id": "b"}]
    replayer = VllmHybridReplayer(vllm)
    want = [replayer.apply(op) for op in ops]
    assert want[-1]["block_ids"] == [[0, 4, 5], [2, 6, 7]]
    assert replay_hybrid(ops) == want


def test_a_full_block_keeps_its_prompt_tail_key(vllm):
    "Full attention's block 1 fills up after the prompt tail (12 tokens) was keyed in it: vLLM keeps both keys, and `b` hits 12."
    ops = [{"op": "config", "groups": [{"kind": "full", "block_size": 8}, {"kind": "mamba", "block_size": 8, "checkpoint_alignment": None}],
            "num_blocks": 16, "prefix_match_unit": 2},
           {"op": "add", "id": "a", "prompt": list(range(13))}, {"op": "schedule", "id": "a", "budget": 12},
           {"op": "new_step"}, {"op": "schedule", "id": "a"}, {"op": "append", "id": "a", "tokens": [100, 101, 102]},
           {"op": "new_step"}, {"op": "schedule", "id": "a"}, {"op": "new_step"},
           {"op": "add", "id": "b", "prompt": list(range(13)) + list(range(50, 56))}, {"op": "schedule", "id": "b"}]
    replayer = VllmHybridReplayer(vllm)
    want = [replayer.apply(op) for op in ops]
    assert (want[-1]["hit_tokens"], want[-1]["block_ids"]) == (12, [[1, 5, 6], [0, 7, 8]])
    assert replay_hybrid(ops) == want


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_random_workloads_agree_with_vllm_soak(vllm, layout):
    assert sweep(vllm, layout, range(1000, 3000)) == []
