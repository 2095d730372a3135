"""kvref's CPU offload tier against vLLM 0.33.0's OffloadingConnector, step by step: every workload in
`golden/offload/` (recorded from vLLM's Scheduler with its connector, see its PROVENANCE.md) gives the same record at
every step: lookups, admissions, loads, stores, failed stores, evictions, completions, CPU events, the connector's
prefix-cache counters and metrics, and the CPU pool's eviction order, beside the scheduler's own fields.

vLLM handles the requests that finished in one step in the order of a `set` of their ids, which follows the string
hash seed; kvref iterates the same set, so a workload whose recording shows such an order (`fin_order`) is compared
under PYTHONHASHSEED=0, the seed it was recorded with (in a subprocess when this one runs with another)."""
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kvref.kv_offload import OffloadConfig
from kvref.core.scheduler import load_workloads, run_workload

GOLDEN = Path(__file__).parent.parent / "golden" / "offload"
WORKLOADS = load_workloads(GOLDEN / "workloads.jsonl")


def recorded(name: str) -> list[dict]:
    return [json.loads(line) for line in (GOLDEN / "vllm" / f"{name}.jsonl").read_text().splitlines()]


def records(workload, **offload) -> list[dict]:
    config = replace(OffloadConfig.of(workload.config["offload"]), **offload)
    return run_workload(workload, offload=config).records


def first_difference(got, want):
    first = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), None)
    return None if first is None and len(got) == len(want) else (first, got[first:first + 1], want[first:first + 1])


def test_every_workload_has_its_recording():
    assert len(WORKLOADS) >= 19 and all((GOLDEN / "vllm" / f"{w.name}.jsonl").exists() for w in WORKLOADS)


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_step_exact(workload):
    want = recorded(workload.name)
    if any("fin_order" in r for r in want) and os.environ.get("PYTHONHASHSEED") != "0":
        code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_offload_golden as t; " \
               f"w = next(w for w in t.WORKLOADS if w.name == {workload.name!r}); " \
               f"sys.exit(t.first_difference(t.records(w), t.recorded(w.name)) is not None)"
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0
        return
    assert first_difference(records(workload), want) is None


# Each minimal workload shows one rule: turning that rule's knob the other way must change the record (the planted
# bug each golden catches).
FLIPS = {"min_evict_lru": dict(eviction_policy="arc"), "min_evict_arc": dict(eviction_policy="lru"),
         "min_store_decode": dict(offload_prompt_only=True), "min_store_when": dict(offload_prompt_only=False),
         "min_store_threshold": dict(store_threshold=0), "min_pending_store_vllm_worker": dict(worker="instant"),
         "min_pending_store_instant": dict(worker="vllm"), "min_chunk_multiple": dict(block_size=4),
         "min_cpu_too_small": dict(cpu_chunks=16)}


@pytest.mark.parametrize("name", sorted(FLIPS))
def test_each_minimal_workload_needs_its_rule(name):
    workload = next(w for w in WORKLOADS if w.name == name)
    assert first_difference(records(workload, **FLIPS[name]), recorded(name)) is not None
