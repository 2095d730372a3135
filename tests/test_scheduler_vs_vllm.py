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
