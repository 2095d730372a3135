"""The speed-ups of `kvref replay` (issue 30) change no decision: the token-list twin equals its definition, format 2
free-queue changes rebuild format 1's whole queues, the command's output equals the library's replay, the collector
is back on after the command, and `kvref replay` imports neither torch nor matplotlib."""
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from kvref.cli import collector_paused, replay_main
from kvref.oracle.replay import (TraceReplayer, apply_changes, is_token_list, is_token_list_fast, load_trace,
                                 replay, validate_op)
from kvref.oracle.workloads import shared_system_prompts, to_trace, write_trace

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "golden" / "traces"
TRACES = sorted(p for p in GOLDEN.glob("*.jsonl") if ".vllm" not in p.name)

tokens = st.lists(st.one_of(st.integers(-3, 2**65), st.booleans(), st.floats(allow_nan=False), st.text(max_size=2),
                            st.none()), max_size=6)


@given(tokens)
def test_token_list_twin_equals_its_definition(value):
    assert is_token_list_fast(value) == is_token_list(value)


@given(st.lists(st.integers(0, 2**64 + 5), min_size=1, max_size=600))
def test_token_list_twin_on_long_prompts(value):
    assert is_token_list_fast(value) is is_token_list(value) is True


def workload_trace(tmp_path: Path, version: int = 2) -> Path:
    w = shared_system_prompts(num_prompts=4, num_users=12, system_len=40, user_len=8, output_len=5, block_size=4,
                              num_blocks=40, seed=1)
    ops = to_trace(w, max_live=6)
    ops[0]["version"] = version
    return write_trace(ops, tmp_path / f"workload-v{version}.jsonl")


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_format_2_changes_rebuild_format_1_queues(trace):
    ops = load_trace(trace)
    whole, queue = list(replay(ops)), None
    for i, (w, d) in enumerate(zip(whole, replay(ops, version=2))):
        queue = d["free_queue"] if "free_queue" in d else apply_changes(queue, d)
        assert queue == w["free_queue"], f"op {i}"
        assert {k: v for k, v in d.items() if k not in ("taken", "to_head", "to_tail", "free_queue")} == \
            {k: v for k, v in w.items() if k != "free_queue"}


def test_workload_format_2_changes_rebuild_whole_queues(tmp_path):
    ops = load_trace(workload_trace(tmp_path))
    queue = None
    for i, (w, d) in enumerate(zip(replay(ops, version=2, free_queue_every=1), replay(ops, version=2))):
        queue = d["free_queue"] if "free_queue" in d else apply_changes(queue, d)
        assert queue == w["free_queue"], f"op {i}"


@pytest.mark.parametrize("version", [1, 2])
def test_command_prints_the_librarys_decisions(tmp_path, capsys, version):
    path = workload_trace(tmp_path, version)
    assert replay_main([str(path)]) == 0
    printed = capsys.readouterr().out
    assert printed == "".join(json.dumps(d) + "\n" for d in replay(load_trace(path)))
    assert gc.isenabled()


def test_collector_paused_leaves_a_disabled_collector_disabled():
    gc.disable()
    try:
        with collector_paused(): assert not gc.isenabled()
        assert not gc.isenabled()
    finally: gc.enable()


def test_one_token_append_refuses_as_before():
    ops = [{"op": "config", "num_blocks": 8, "block_size": 4}, {"op": "add", "id": "r", "prompt": [1, 2]},
           {"op": "append", "id": "r", "tokens": [2**64]}]
    r = TraceReplayer(validate=False)
    r.apply(ops[0]); r.apply(ops[1])
    with pytest.raises(ValueError, match=r"request 'r': token_ids\[0\] is 18446744073709551616"):
        r.apply(ops[2])


def test_replay_imports_neither_torch_nor_matplotlib(tmp_path):
    path = workload_trace(tmp_path)
    code = ("import sys, io, contextlib; from kvref.cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()): status = main(['replay', {str(path)!r}])\n"
            "print(status, sorted(m for m in ('torch', 'matplotlib', 'vllm') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["0", "[]"]


# ---------------------------------------------------------------- FastTraceReplayer, in lockstep with TraceReplayer

def outcomes(replayer, ops) -> list:
    "Each op's decision, or the error it raised (then the replay stops)."
    out = []
    for op in ops:
        try: out.append(replayer.apply(op))
        except (ValueError, TypeError) as e: out.append((type(e).__name__, str(e))); break
    return out


def assert_lockstep(ops, **kwargs):
    from kvref.oracle.replay import FastTraceReplayer
    want = outcomes(TraceReplayer(**kwargs), ops)
    got = outcomes(FastTraceReplayer(validate=False, **kwargs), ops)
    assert got == want
    assert [list(d) for d in got if isinstance(d, dict)] == [list(d) for d in want if isinstance(d, dict)], "key order"


def shipped_traces():
    from kvref.oracle.replay import list_vectors
    return [v for v in list_vectors(kind="trace")]


@pytest.mark.parametrize("vector", shipped_traces(), ids=lambda v: v.name)
@pytest.mark.parametrize("every", [None, 3])
def test_fast_replayer_in_lockstep_on_shipped_traces(vector, every):
    from kvref.oracle.conformance import load_any_trace
    ops = load_any_trace(vector.path)
    assert_lockstep(ops, version=2, free_queue_every=every)
    assert_lockstep(ops, version=1)
    assert_lockstep(ops, behavior="design_doc", version=2, strict=True)


@st.composite
def random_trace(draw):
    "A small pool and a random mix of ops, unknown requests and lookahead slots included."
    num_blocks, block_size = draw(st.integers(2, 12)), draw(st.integers(1, 4))
    ops = [{"op": "config", "num_blocks": num_blocks, "block_size": block_size, "version": 2,
            "enable_caching": draw(st.booleans())}]
    ids = [f"r{i}" for i in range(4)]
    for _ in range(draw(st.integers(0, 40))):
        kind, rid = draw(st.sampled_from(["add", "schedule", "schedule", "append", "append", "preempt", "free",
                                          "reset_prefix_cache"])), draw(st.sampled_from(ids))
        if kind == "add": ops.append({"op": "add", "id": rid, "prompt": draw(st.lists(st.integers(0, 3), min_size=1, max_size=9))})
        elif kind == "schedule":
            op = {"op": "schedule", "id": rid, "budget": draw(st.one_of(st.none(), st.integers(1, 5)))}
            if draw(st.integers(0, 3)) == 0: op["num_lookahead_tokens"] = draw(st.integers(1, 3))
            ops.append(op)
        elif kind == "append": ops.append({"op": "append", "id": rid, "tokens": draw(st.lists(st.integers(0, 3), min_size=1, max_size=2))})
        elif kind == "reset_prefix_cache": ops.append({"op": kind})
        else: ops.append({"op": kind, "id": rid})
    return ops


@given(random_trace(), st.sampled_from([None, 1, 2]))
def test_fast_replayer_in_lockstep_on_random_traces(ops, every):
    assert_lockstep(ops, version=2, free_queue_every=every)
