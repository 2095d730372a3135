"""kvref's scheduler against vLLM 0.33's own `Scheduler`, driven on the CPU (`scheduler_vllm_support.py`), over random
workloads, synchronous and async (vLLM's `AsyncScheduler` in `EngineCore.step_with_batch_queue`): every knob kvref models at random (pool, budget, max_num_seqs, chunked prefill, long-prefill cap, policy,
full-prompt admission gate, prefix caching, max_model_len), shared prefixes, salts, `after` chains with think time,
priorities, scripted and model-written outputs. Skipped, with the reason, where vLLM 0.33 does not import."""
import os

import pytest

from scheduler_vllm_support import vllm_or_skip, random_workload, run
from kvref.core.scheduler import _spec_of, run_workload
from kvref.oracle.workloads import Workload

VLLM, pytestmark = vllm_or_skip()
NUM_SEEDS = int(os.environ.get("KVREF_VLLM_SCHEDULER_SEEDS", "60"))


def kvref_records(w: dict) -> list[dict]:
    return run_workload(Workload(w["name"], [_spec_of(r) for r in w["requests"]], w["config"])).records


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("seed", range(NUM_SEEDS))
def test_random_workload_step_exact(seed, asynchronous):
    "Sync: vLLM's `Scheduler`, schedule then update. Async: its `AsyncScheduler` in the engine's batch queue of two."
    w = random_workload(seed, async_scheduling=asynchronous)
    want, got = run(w, VLLM), kvref_records(w)
    first = next((i for i, (g, e) in enumerate(zip(got, want)) if g != e), None)
    assert first is None and len(got) == len(want), (w["config"], first, got[first:first + 1], want[first:first + 1])


def test_the_chapters_opening_example_is_vllms_schedule():
    "Chapter 06 opens with kvref's run of three requests under a budget of 8 tokens: vLLM's own scheduler makes the same steps."
    from test_scheduler import OPENING
    config = {"enable_chunked_prefill": True, "long_prefill_token_threshold": 0, "policy": "fcfs", "enable_prefix_caching": True,
              "scheduler_reserve_full_isl": True, "hash_algo": "sha256", "model_seed": 0, **OPENING.config}
    requests = [{"id": r.id, "prompt": r.prompt, "output": None, "max_tokens": r.max_tokens, "arrival": r.arrival} for r in OPENING.requests]
    w = {"name": OPENING.name, "config": config, "requests": requests}
    assert kvref_records(w) == run(w, VLLM) == run_workload(OPENING).records
