"""kvref's release profiles against the releases' own code.

- Always: the divergences recorded from the releases (`golden/versions-vllm/`: random hashing cases with decode tokens,
  and allocator traces, where kvref once differed) are reproduced.
- Always: a profile's hashes do not depend on whether equal strings are one Python object (a server decodes the
  LoRA name and the salt separately; pickle would write a shared object once).
- With `KVREF_VLLM_RELEASES` (see `release_vllm_support.py`): random cases and traces, asked of every release installed
  there and of kvref's profile for it, agree. Skipped otherwise, saying why."""
import json
import os
import random
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from kvref.core.hashing import LoRARequest
from kvref.oracle.releases import PROFILES, profile_for_version, release_block_hashes, replay_release
from release_vllm_support import (GOLDEN, as_ops, ask, ask_hashes, hash_divergences, kvref_answers, random_case,
                                  random_trace, release_dirs, trace_divergence)

VECTOR_FILES = sorted(GOLDEN.glob("*/block-hashes-*.json"))
TRACES = sorted(t for t in GOLDEN.glob("*/traces/*.jsonl") if ".vllm-" not in t.name)


def test_recorded_divergences_present():
    assert VECTOR_FILES and TRACES
    for path in VECTOR_FILES: assert "own code on CPU" in json.loads(path.read_text())["provenance"]


@pytest.mark.parametrize("path", VECTOR_FILES, ids=[f"{p.parent.name}-{p.stem}" for p in VECTOR_FILES])
def test_recorded_vectors(path):
    data = json.loads(path.read_text())
    for i, entry in enumerate(data["vectors"]):
        got = kvref_answers(data["vllm_version"], entry)
        want = {k: entry[k] for k in ("none_hash", "block_hashes", "extra_keys", "event_block_hashes") if k in entry}
        assert {k: got.get(k) for k in want} == want, f"vector {i}"


@pytest.mark.parametrize("trace", TRACES, ids=[f"{t.parent.parent.name}-{t.stem}" for t in TRACES])
def test_recorded_traces(trace):
    version = trace.parent.parent.name
    want = [json.loads(line) for line in trace.with_name(f"{trace.stem}.vllm-{version}.jsonl").open()]
    assert list(replay_release(as_ops([json.loads(line) for line in trace.open()]), version)) == want


UNTAGGED = [p for p in PROFILES if PROFILES[p].lora_key == "lora_name"]
TAGGED = [p for p in PROFILES if PROFILES[p].lora_key == "tagged"]


def _equal_name_and_salt(profile: str, name: str, shared: bool, algo: str):
    salt = name if shared else "".join(list(name))  # the same object, or an equal one
    return release_block_hashes(PROFILES[profile], list(range(8)), 4, algo, cache_salt=salt,
                                lora=LoRARequest(name, "/p"), pythonhashseed="0")


@pytest.mark.parametrize("profile", UNTAGGED)
@given(name=st.text(min_size=2, max_size=6), algo=st.sampled_from(["sha256", "xxhash"]))
def test_hash_does_not_depend_on_string_identity(profile, name, algo):
    if algo not in PROFILES[profile].hash_algos: algo = "sha256"
    assert _equal_name_and_salt(profile, name, True, algo) == _equal_name_and_salt(profile, name, False, algo)


@pytest.mark.parametrize("profile", TAGGED)
def test_tagged_hash_does_not_depend_on_string_identity(profile):
    assert _equal_name_and_salt(profile, "sql", True, "sha256") == _equal_name_and_salt(profile, "sql", False, "sha256")


def test_zero_step_error_follows_the_release():
    "0.14.0 reworded the error for a step with nothing to compute (external KV loads may allocate with zero new tokens)."
    assert profile_for_version("0.13.0").zero_step_error == "ValueError: num_new_tokens must be greater than 0"
    assert profile_for_version("0.14.0").zero_step_error.endswith("when there are no external computed tokens")
    assert profile_for_version("0.30.0").zero_step_error.endswith("when there are no external computed tokens")
    assert profile_for_version("0.31.0").zero_step_error.endswith("when there are no computed tokens to adopt")


RELEASES = release_dirs()
live = pytest.mark.skipif(not RELEASES, reason="set KVREF_VLLM_RELEASES to a folder of vLLM releases "
                          "(one per version: a venv, or a pip --target folder run by KVREF_VLLM_PYTHON)")
NUM_CASES, NUM_TRACES = int(os.environ.get("KVREF_VLLM_CASES", "40")), int(os.environ.get("KVREF_VLLM_TRACES", "10"))


@live
@pytest.mark.parametrize("version", sorted(RELEASES))
def test_random_hashes_match_the_release(version):
    rng = random.Random(f"live-{version}")
    info = ask(RELEASES[version], {"kind": "info"})
    cases = [random_case(rng, info) for _ in range(NUM_CASES)]
    diffs = hash_divergences(version, cases, ask_hashes(RELEASES[version], cases))
    assert not diffs, json.dumps(diffs[0])[:3000]


@live
@pytest.mark.parametrize("version", sorted(RELEASES))
def test_random_traces_match_the_release(version):
    rng = random.Random(f"live-trace-{version}")
    info = ask(RELEASES[version], {"kind": "info"})
    traces = [random_trace(rng, info) for _ in range(NUM_TRACES)]
    answers = ask(RELEASES[version], {"kind": "traces", "traces": [as_ops(trace) for trace in traces]})
    for trace, want in zip(traces, answers):
        assert trace_divergence(version, trace, want) is None, json.dumps(trace)[:2000]
