"""kvref against vLLM 0.33's own KVCacheManager (`kvref.adapters.vllm`): vLLM reproduces its recorded decisions
through the adapter, and kvref agrees with it in lockstep on multimodal, LoRA, salted and lookahead traces and on
the conformance machine's traces. Skipped where vLLM 0.33 does not import."""
import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvref.adapters.vllm import VLLMAdapter, load_vllm
from kvref.oracle.conformance import check, conformance_machine
from kvref.oracle.replay import apply_changes, list_vectors, load_decisions, load_trace, run_adapter, vector_path

try: load_vllm()
except ImportError as e: pytest.skip(f"vLLM 0.33 is not installed here ({e}); see the vLLM adapter chapter",
                                     allow_module_level=True)

TRACES = [v.name for v in list_vectors() if v.name.startswith(("traces/", "rules/")) and not v.name.endswith(".vllm")]


def image(name, offset=0, length=4):
    return [{"identifier": name, "offset": offset, "length": length}]


def with_full_queues(decisions: list[dict]) -> list[dict]:
    "Format 2 decisions as format 1 states them: the whole free queue after each op, in place of its changes."
    queue, out = [], []
    for d in decisions:
        queue = d["free_queue"] if "free_queue" in d else apply_changes(queue, d)
        out.append({**{k: v for k, v in d.items() if k not in ("taken", "to_head", "to_tail")}, "free_queue": queue})
    return out


@pytest.mark.parametrize("name", TRACES)
def test_vllm_reproduces_its_recorded_decisions(name):
    "vLLM's adapter reports whole free queues (it has no `free_queue_changes`): format 2 answers compare as queues."
    ops, recorded = load_trace(vector_path(name)), load_decisions(vector_path(name + ".vllm"))
    if ops[0].get("version", 1) >= 2: assert run_adapter(VLLMAdapter, ops, version=1) == with_full_queues(recorded)
    else: assert run_adapter(VLLMAdapter, ops) == recorded


def test_a_format_2_queue_change_is_compared():
    "A recorded format 2 decision with one block moved from the tail to the head no longer matches vLLM's queues."
    name = "rules/free-unhashed-to-head"
    recorded = load_decisions(vector_path(name + ".vllm"))
    planted = [dict(d, to_head=d["to_tail"][-1:] + d["to_head"], to_tail=d["to_tail"][:-1]) if d.get("to_tail") else d
               for d in recorded]
    assert run_adapter(VLLMAdapter, load_trace(vector_path(name)), version=1) != with_full_queues(planted)


@pytest.mark.parametrize("name", TRACES)
def test_kvref_agrees_with_vllm_on_the_shared_traces(name):
    assert check(VLLMAdapter, vector_path(name)) is None


@pytest.mark.parametrize("ops", [
    [{"op": "config", "num_blocks": 8, "block_size": 4},
     {"op": "add", "id": "a", "prompt": [5] * 9, "mm_items": image("cat")}, {"op": "schedule", "id": "a"},
     {"op": "add", "id": "b", "prompt": [5] * 9, "mm_items": image("dog")}, {"op": "schedule", "id": "b"},
     {"op": "add", "id": "c", "prompt": [5] * 9, "mm_items": image("cat", 2, 3)}, {"op": "schedule", "id": "c"},
     {"op": "add", "id": "d", "prompt": [5] * 9, "mm_items": image("cat")}, {"op": "schedule", "id": "d"}],
    [{"op": "config", "num_blocks": 8, "block_size": 2, "hash_algo": "sha256_cbor"},
     {"op": "add", "id": "a", "prompt": [3] * 7, "cache_salt": "t", "lora": {"name": "L", "path": "/l"}},
     {"op": "schedule", "id": "a"}, {"op": "add", "id": "b", "prompt": [3] * 7, "cache_salt": "t"},
     {"op": "schedule", "id": "b"}, {"op": "free", "id": "a"},
     {"op": "add", "id": "c", "prompt": [3] * 7, "cache_salt": "t", "lora": {"name": "L", "path": "/l"}},
     {"op": "schedule", "id": "c"}, {"op": "reset_prefix_cache"}],
    [{"op": "config", "num_blocks": 6, "block_size": 2, "version": 2},
     {"op": "add", "id": "a", "prompt": [1] * 5}, {"op": "schedule", "id": "a", "num_lookahead_tokens": 3},
     {"op": "append", "id": "a", "tokens": [2]}, {"op": "schedule", "id": "a", "num_lookahead_tokens": 4},
     {"op": "add", "id": "b", "prompt": [1] * 5}, {"op": "schedule", "id": "b", "num_lookahead_tokens": 2}],
], ids=["multimodal", "salt+lora+cbor", "lookahead"])
def test_kvref_agrees_with_vllm_on_what_traces_can_say(ops):
    assert check(VLLMAdapter, ops, free_queue_every=1) is None


def test_kvref_agrees_with_vllm_under_the_conformance_machine(tmp_path):
    machine = conformance_machine(VLLMAdapter, out_path=tmp_path / "d.jsonl")
    run_state_machine_as_test(machine, settings=settings(max_examples=60, stateful_step_count=30, deadline=None,
                                                         derandomize=True, database=None, phases=[Phase.generate]))
    assert not (tmp_path / "d.jsonl").exists()
