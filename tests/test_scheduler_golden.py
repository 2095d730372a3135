"""kvref's scheduler against vLLM 0.33.0's own, step by step: every workload in `golden/scheduler/` (recorded from
vLLM's `Scheduler`, see its PROVENANCE.md) gives the same record at every step: admissions, chunk sizes, kinds,
computed counts, preemptions, finishes, sampled tokens, prefix-cache counters, free blocks, usage, queue lengths."""
import json
from pathlib import Path

import pytest

from kvref.core.scheduler import SchedulerConfig, load_workloads, run_workload

GOLDEN = Path(__file__).parent.parent / "golden" / "scheduler"
WORKLOADS = load_workloads(GOLDEN / "workloads.jsonl")
DOC_WORKLOADS = load_workloads(GOLDEN / "docs" / "workloads.jsonl")  # recorded here: see PROVENANCE.md


def recorded(name: str) -> list[dict]:
    folder = GOLDEN / "docs" if name.startswith("doc_") else GOLDEN
    return [json.loads(line) for line in (folder / "vllm" / f"{name}.jsonl").read_text().splitlines()]


def test_every_workload_has_its_recording():
    assert len(WORKLOADS) >= 29 and all((GOLDEN / "vllm" / f"{w.name}.jsonl").exists() for w in WORKLOADS)


@pytest.mark.parametrize("workload", WORKLOADS + DOC_WORKLOADS, ids=lambda w: w.name)
def test_step_exact(workload):
    want, got = recorded(workload.name), run_workload(workload).records
    first = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), None)
    assert first is None and len(got) == len(want), (first, got[first] if first is not None else len(got),
                                                   want[first] if first is not None else len(want))


# Each minimal workload shows one rule: turning that rule's knob back to the other setting must change the record
# (the planted bug that each golden catches), while the control workload does not care about any of them.
FLIPS = {"min_full_isl_gate": dict(scheduler_reserve_full_isl=False),
         "min_long_prefill": dict(long_prefill_token_threshold=0),
         "min_no_chunking": dict(enable_chunked_prefill=True),
         "min_priority_admission": dict(policy="fcfs")}


@pytest.mark.parametrize("name", sorted(FLIPS))
def test_each_minimal_workload_needs_its_rule(name):
    workload = next(w for w in WORKLOADS if w.name == name)
    assert run_workload(workload, **FLIPS[name]).records != recorded(name)


def test_the_defaults_are_vllms():
    c = SchedulerConfig()
    assert (c.policy, c.long_prefill_token_threshold, c.enable_chunked_prefill, c.scheduler_reserve_full_isl,
            c.async_scheduling, c.max_num_batched_tokens, c.max_num_seqs) == ("fcfs", 0, True, True, False, 2048, 128)


def test_kvref_schedule_checks_recorded_runs(tmp_path, capsys):
    "`kvref schedule --expect`: 0 when every step agrees, 1 naming the first step that differs, 2 on bad input."
    from kvref.cli import main
    workloads = str(GOLDEN / "workloads.jsonl")
    assert main(["schedule", workloads, "--expect", str(GOLDEN / "vllm")]) == 0
    assert capsys.readouterr().out.count("identical") == len(WORKLOADS)
    changed = recorded("min_control"); changed[2]["sched"][2][1] = 4
    (tmp_path / "min_control.jsonl").write_text("".join(json.dumps(r) + "\n" for r in changed))
    assert main(["schedule", workloads, "--only", "min_control", "--expect", str(tmp_path)]) == 1
    assert "step 2: sched: kvref" in capsys.readouterr().out
    assert main(["schedule", workloads, "--only", "min_long_prefill", "--expect", str(tmp_path)]) == 2  # no recording
    (tmp_path / "bad.jsonl").write_text('{"requests": [{"id": "a", "prompt": [1], "colour": 3}]}\n')
    assert main(["schedule", str(tmp_path / "bad.jsonl")]) == 2
    assert "line 1: request 'a': unknown field 'colour'" in capsys.readouterr().err
