"""Issue 26, "first contact": what a new user met, pinned. Every shipped trace is taken by `kvref check` and
`kvref replay`, a run over many files reports each and exits with the worst status, `kvref vectors` says what
each file is, the docs' hashing rules match the code, the allocator rules of the engine-authors page ship as
vectors, and the README's oracle commands work from outside the clone.
"""
import json
from pathlib import Path

import pytest

from kvref.cli import main
from kvref.replay import _decisions_of, list_vectors

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "golden"
KVREF_ADAPTER = "kvref.conformance:KVRefAdapter"
RELEASE_TRACES = [v for v in list_vectors() if v.kind == "trace" and v.name.startswith("versions")]


# ------------------------------------------------------------------- item 2: check and replay take every trace

@pytest.mark.parametrize("vector", RELEASE_TRACES, ids=lambda v: v.name)
def test_every_release_recording_checks_against_its_decisions(vector, capsys):
    "The releases chapter's recordings (`mm` on `add`), each with its release's decisions: all conform."
    assert main(["check", str(vector.path), "--expect", str(_decisions_of(vector.path)), "--vllm-version", vector.release]) == 0
    assert "conforms" in capsys.readouterr().out


def test_release_format_trace_replays_and_checks_without_a_version(capsys):
    "A recording with `mm` items on `add` is read as `mm_items`: replayed, and checked against kvref's 0.33 allocator."
    mm = str(GOLDEN / "versions" / "0.33.0" / "traces" / "mm-position.jsonl")
    assert main(["replay", mm]) == 0
    assert main(["check", mm, "--adapter", KVREF_ADAPTER]) == 0
    assert main(["check", mm, "--expect", str(GOLDEN / "versions" / "0.33.0" / "traces" / "mm-position.vllm-0.33.0.jsonl"),
                 "--vllm-version", "0.33.0"]) == 0


@pytest.mark.parametrize("path, holds", [
    ("events/trace-11-0.events.jsonl", "KV events"), ("hybrid/events/hybrid-mamba-0.events.jsonl", "KV events"),
    ("traces/trace-11-0.vllm.jsonl", "decisions"), ("mooncake/synthetic-trace-last300.jsonl", "request log")])
def test_a_file_that_is_not_a_trace_is_named_as_such(path, holds, capsys):
    for argv in (["replay", str(GOLDEN / path)], ["check", str(GOLDEN / path), "--adapter", KVREF_ADAPTER]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "not an allocator trace" in err and holds in err and len(err.splitlines()) == 1


def test_many_traces_each_reported_worst_status_wins(tmp_path, capsys):
    "One bad file among many no longer aborts the run: each is reported, the exit status is the worst."
    good, events = str(GOLDEN / "traces" / "design-doc-example.jsonl"), str(GOLDEN / "events" / "trace-11-0.events.jsonl")
    assert main(["check", "--adapter", KVREF_ADAPTER, good, events, good]) == 2
    captured = capsys.readouterr()
    assert captured.out.count("conforms") == 2 and "3 traces: 2 conform, 0 diverged, 1 could not be checked" in captured.out
    assert main(["check", "--adapter", "kvref.nano:NanoAdapter", "--out", str(tmp_path), good, good]) == 1
    assert "2 traces: 0 conform, 2 diverged" in capsys.readouterr().out
    assert main(["check", "--adapter", "kvref.nano:NanoAdapter", "--out", str(tmp_path), good, events]) == 2


def test_a_trace_on_which_vllm_raised_holds_no_adapter(capsys):
    "A recording whose decisions say vLLM raised is refused for an adapter at that op, and checks with --expect."
    trace = GOLDEN / "versions-vllm" / "0.33.0" / "traces" / "diff-3-2.jsonl"
    assert main(["check", str(trace), "--adapter", KVREF_ADAPTER, "--vllm-version", "0.33.0"]) == 2
    assert "vLLM 0.33.0 raises here" in capsys.readouterr().err
    assert main(["check", str(trace), "--expect", str(_decisions_of(trace)), "--vllm-version", "0.33.0"]) == 0


# ------------------------------------------------------------------- item 3: kvref vectors says what each file is

def test_every_vector_labelled_with_its_own_release_and_kind():
    for v in list_vectors():
        parts = v.name.split("/")
        if parts[0] in ("versions", "versions-vllm"): assert v.release == parts[1] and parts[1] in v.source, v
        if ".events" in v.name: assert v.kind == "events" and "trace (ops)" not in v.source, v
        if v.name.endswith(".vllm") or ".vllm-" in v.name: assert v.kind == "decisions", v


def _paths(capsys, *argv) -> list[str]:
    assert main(["vectors", *argv, "--paths"]) == 0
    return capsys.readouterr().out.split()


def test_vectors_filters(capsys):
    everything = _paths(capsys)
    traces = _paths(capsys, "--kind", "trace", "--vllm", "0.33.0")
    assert 0 < len(traces) < len(everything) / 5
    assert all(json.loads(Path(p).read_text().splitlines()[0])["op"] == "config" for p in traces)
    assert set(_paths(capsys, "--vllm", "0.9")) == set(_paths(capsys, "--vllm", "0.9.0")) | set(_paths(capsys, "--vllm", "0.9.2"))
    assert main(["vectors", "--kind", "attention", "--vllm", "0.33.0"]) == 2
    assert "no shipped vector file matches --kind attention --vllm 0.33.0" in capsys.readouterr().err


@pytest.mark.parametrize("kind, adapter", [("trace", KVREF_ADAPTER), ("hybrid-trace", "kvref.hybrid_replay:KVRefHybridAdapter")])
def test_checkable_traces_are_what_an_adapter_is_checked_on(kind, adapter, capsys):
    "Every trace `kvref vectors --checkable` lists is taken by `kvref check --adapter` as it is, and kvref's own conforms."
    paths = _paths(capsys, "--kind", kind, "--checkable")
    assert len(paths) >= 10
    assert main(["check", "--adapter", adapter, *paths]) == 0
