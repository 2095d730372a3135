"""kvref's CPU offload tier against vLLM 0.33's own OffloadingConnector (scheduler side, CPU backend, LRU and ARC),
driven beside its `Scheduler` on the CPU (`scheduler_vllm_support.py`), over random workloads: the scheduler's random
knobs and requests plus a random tier (1 to 64 chunks, chunk 1x to 4x the GPU block, store threshold, decode blocks
stored or not, either worker stand-in) and sometimes prefix-cache resets (running requests and the connector).

Both run in this process, so vLLM's `set`-ordered handling of requests finishing together and kvref's see the same
string hash seed: the comparison holds for any PYTHONHASHSEED (recordings fix it at 0). Skipped, with the reason, where
vLLM 0.33 does not import."""
import os

import pytest

from scheduler_vllm_support import vllm_or_skip, random_offload_workload, run
from kvref.kv_offload import OffloadConfig
from kvref.core.scheduler import _spec_of, run_workload
from kvref.oracle.workloads import Workload

VLLM, pytestmark = vllm_or_skip()
NUM_SEEDS = int(os.environ.get("KVREF_VLLM_OFFLOAD_SEEDS", "40"))


def kvref_records(w: dict) -> list[dict]:
    workload = Workload(w["name"], [_spec_of(r) for r in w["requests"]], w["config"])
    return run_workload(workload, offload=OffloadConfig.of(w["config"]["offload"])).records


@pytest.mark.parametrize("seed", range(NUM_SEEDS))
def test_random_offload_workload_step_exact(seed):
    w = random_offload_workload(seed)
    want, got = run(w, VLLM), kvref_records(w)
    first = next((i for i, (g, e) in enumerate(zip(got, want)) if g != e), None)
    assert first is None and len(got) == len(want), (w["config"], first, got[first:first + 1], want[first:first + 1])
