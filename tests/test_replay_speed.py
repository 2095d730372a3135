"""The speed-ups of `kvref replay` (issue 30) change no decision: the token-list twin equals its definition, format 2
free-queue changes rebuild format 1's whole queues, the command's output equals the library's replay, the collector
is back on after the command, and neither `kvref replay` nor `kvref check --expect` imports hypothesis, torch or
matplotlib."""
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from kvref.cli import check_main, collector_paused, replay_main
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


values = st.one_of(st.text(max_size=2), st.integers(-2, 3), st.booleans(), st.none(), st.floats(allow_nan=False), tokens,
                   st.dictionaries(st.sampled_from(["name", "path", "x"]), st.text(max_size=1), max_size=3))
op_names = st.sampled_from(["schedule"] * 3 + ["append"] * 2 + ["free", "preempt", "add", "config", "reset_prefix_cache", "evict"])
fields = st.sampled_from(["id", "budget", "tokens", "prompt", "num_lookahead_tokens", "cache_salt", "lora", "mm",
                          "mm_items", "why"])


@st.composite
def any_op(draw):
    "Mostly the common shapes (a schedule's budget, an append's tokens), often with one field wrong, added or missing."
    if draw(st.integers(0, 30)) == 0: return draw(values)
    name = draw(op_names)
    op = {"op": name, "id": draw(st.text(max_size=2))}
    if name == "schedule" and draw(st.booleans()): op["budget"] = draw(st.one_of(st.none(), st.integers(-1, 3)))
    if name == "append": op["tokens"] = draw(st.lists(st.integers(0, 9), max_size=3))
    if draw(st.booleans()):  # one field wrong, added or taken away
        key = draw(st.sampled_from(["op", "id", "budget", "tokens"]) | fields)
        if draw(st.integers(0, 3)) == 0: op.pop(key, None)
        else: op[key] = draw(values)
    return op


def outcome(validate, op, version):
    "What `validate` does with `op`: the op it returns, or the error it raises."
    try: return validate(op, version)
    except (ValueError, TypeError) as e: return type(e).__name__, str(e)


@settings(max_examples=1000)  # cheap: a few microseconds an op
@given(any_op(), st.sampled_from([1, 2]))
def test_validate_op_twin_equals_its_definition(op, version):
    from kvref.oracle.replay import is_common_op, validate_op_fast
    want = outcome(validate_op, op, version)
    assert outcome(validate_op_fast, op, version) == want
    assert not is_common_op(op) or want is op


@settings(max_examples=1000)
@given(any_op(), st.sampled_from([1, 2]))
def test_validate_release_op_twin_equals_its_definition(op, version):
    from kvref.oracle.conformance import validate_release_op_fast
    from kvref.oracle.releases import validate_release_op
    assert outcome(validate_release_op_fast, op, version) == outcome(validate_release_op, op, version)


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


def test_replay_lets_go_of_the_trace_before_the_collector_is_back(tmp_path, capsys, monkeypatch):
    "With nothing to draw, the parsed trace is freed while the collector is off: its youngest generation holds no op."
    path, counts = workload_trace(tmp_path), []
    enable = gc.enable
    monkeypatch.setattr(gc, "enable", lambda: counts.append(gc.get_count()[0]) or enable())
    assert replay_main([str(path)]) == 0
    ops = len(load_trace(path))
    assert counts and counts[-1] < ops / 2, (ops, counts)  # held, they would be there: about 2 objects an op


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


HEAVY = ("hypothesis", "torch", "matplotlib", "vllm", "numpy")  # what `kvref replay` and `kvref check --expect` never import


def modules_loaded(code: str) -> list[str]:
    "The modules of `HEAVY` that a fresh interpreter running `code` (then printing nothing) has imported."
    code += f"\nimport sys; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                     check=True).stdout.splitlines()[-1].replace("'", '"'))


def test_cli_imports_no_heavy_module():
    assert modules_loaded("import kvref.cli") == []


def test_replay_and_check_import_no_heavy_module(tmp_path):
    path = workload_trace(tmp_path)
    decisions = tmp_path / "decisions.jsonl"
    decisions.write_text("".join(json.dumps(d) + "\n" for d in replay(load_trace(path))))
    code = ("import io, contextlib; from kvref.cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()): assert main(['replay', {str(path)!r}]) == 0\n"
            f"with contextlib.redirect_stdout(io.StringIO()): assert main(['check', {str(path)!r}, '--expect', {str(decisions)!r}]) == 0")
    assert modules_loaded(code) == []


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


# ---------------------------------------------------------------- each op checked once

def test_check_recorded_checks_each_op_once(tmp_path, monkeypatch, capsys):
    "A trace file's ops are checked by its loader, not again by kvref's replay; ops given as a list, by the replay."
    import kvref.oracle.replay as replay_module
    from kvref.oracle.conformance import check, check_recorded, load_any_trace
    path = workload_trace(tmp_path)
    decisions = list(replay(load_trace(path)))
    calls, checked = [], replay_module.validate_op_fast  # the replay's check of each op
    def counted(op, version=1):
        calls.append(op)
        return checked(op, version)
    monkeypatch.setattr(replay_module, "validate_op_fast", counted)
    ops = load_any_trace(path)
    assert check_recorded(decisions, path) is None and calls == []
    assert check_recorded(decisions, ops, checked=True) is None and calls == []
    assert check(replay_module.kvref_factory(), ops, checked=True) is None and calls == []
    recorded = tmp_path / "decisions.jsonl"
    recorded.write_text("".join(json.dumps(d) + "\n" for d in decisions))
    assert check_main([str(path), "--expect", str(recorded)]) == 0 and calls == []
    assert check_recorded(decisions, ops) is None and len(calls) == len(ops)
    n = next(i for i, op in enumerate(ops) if op["op"] == "schedule")
    bad = ops[:n] + [{**ops[n], "budget": True}]
    with pytest.raises(ValueError, match="field 'budget' must be int or null, got true"): check_recorded(decisions, bad)


# ---------------------------------------------------------------- DecisionEncoder and loads_line, twins of json's own

@pytest.mark.parametrize("vector", shipped_traces(), ids=lambda v: v.name)
@pytest.mark.parametrize("version", [1, 2])
def test_decision_encoder_writes_json_dumps_on_shipped_traces(vector, version):
    from kvref.oracle.conformance import load_any_trace
    from kvref.oracle.replay import DecisionEncoder
    decisions = [d for d in outcomes(TraceReplayer(version=version), load_any_trace(vector.path)) if isinstance(d, dict)]
    for checked in (False, True):
        encode = DecisionEncoder(ids_checked=checked)
        assert [encode(d) for d in decisions] == [json.dumps(d) for d in decisions]


def test_decision_encoder_writes_json_dumps_on_hybrid_traces():
    from kvref.oracle.hybrid_replay import load_hybrid_trace, HybridTraceReplayer
    from kvref.oracle.replay import DecisionEncoder
    paths = sorted((ROOT / "golden" / "hybrid").glob("hybrid-*.jsonl"))
    assert paths
    for path in paths:
        if ".vllm" in path.name: continue
        replayer = HybridTraceReplayer()
        decisions = [replayer.apply(op) for op in load_hybrid_trace(path)]
        for checked in (False, True):
            encode = DecisionEncoder(ids_checked=checked)
            assert [encode(d) for d in decisions] == [json.dumps(d) for d in decisions], path.name


scalars = st.one_of(st.integers(-2, 2**70), st.booleans(), st.none(), st.floats(), st.text(max_size=3))
ids_like = st.one_of(st.integers(0, 9), st.booleans(), st.sampled_from([0.0, 1.0, 2.5]), st.lists(st.integers(0, 3), max_size=2))


@st.composite
def decision_streams(draw, int_tables: bool):
    "Decisions of a few requests whose tables grow, stay, shrink or change; other keys and values of any JSON kind."
    tables, out = {}, []
    for _ in range(draw(st.integers(1, 12))):
        rid = draw(st.sampled_from(["a", "b", "%s", "\u00e9"]))
        op = draw(st.sampled_from(["schedule", "schedule", "append", "free", "preempt"]))
        table = list(tables.get(rid, []))
        move = draw(st.sampled_from(["grow", "grow", "same", "shrink", "replace", "new"]))
        item = st.integers(0, 300) if int_tables else ids_like
        if move == "grow": table += draw(st.lists(item, min_size=1, max_size=3))
        elif move == "shrink": table = table[:-1]
        elif move == "replace" and table: table[draw(st.integers(0, len(table) - 1))] = draw(item)
        elif move == "new": table = draw(st.lists(item, max_size=4))
        tables[rid] = table
        d = {"op": op, "id": rid}
        for key in draw(st.lists(st.sampled_from(["hit_tokens", "allocated", "block_ids", "taken", "x%", 'q"', "num_free"]),
                                 unique=True, max_size=5)):
            d[key] = table if key == "block_ids" else draw(st.one_of(scalars, st.lists(scalars, max_size=3)))
        if draw(st.integers(0, 10)) == 0: d = draw(st.one_of(scalars, st.dictionaries(st.integers(0, 3), scalars, max_size=2)))
        out.append(d)
    return out


@settings(max_examples=500)
@given(decision_streams(int_tables=False))
def test_decision_encoder_equals_json_dumps(stream):
    from kvref.oracle.replay import DecisionEncoder
    encode = DecisionEncoder()
    for d in stream:
        try: want = json.dumps(d)
        except (TypeError, ValueError) as e: want = type(e).__name__
        try: got = encode(d)
        except (TypeError, ValueError) as e: got = type(e).__name__
        assert got == want, d


@settings(max_examples=500)
@given(decision_streams(int_tables=True))
def test_decision_encoder_with_checked_ids_equals_json_dumps(stream):
    from kvref.oracle.replay import DecisionEncoder
    encode = DecisionEncoder(ids_checked=True)
    for d in stream: assert encode(d) == json.dumps(d), d


def test_decision_encoder_lets_go_of_a_freed_table():
    from kvref.oracle.replay import DecisionEncoder
    encode = DecisionEncoder(ids_checked=True)
    encode({"op": "schedule", "id": "r", "block_ids": [1, 2]})
    assert "r" in encode.tables
    encode({"op": "free", "id": "r", "to_tail": [2, 1]})
    assert "r" not in encode.tables


def test_decision_encoder_reads_a_changed_list_again():
    "The caller's list changed in place after a decision: the next decision prints the new ids."
    from kvref.oracle.replay import DecisionEncoder
    encode, table = DecisionEncoder(), [1, 2, 3]
    encode({"op": "schedule", "id": "r", "block_ids": table})
    table[1] = 9
    assert encode({"op": "schedule", "id": "r", "block_ids": table}) == json.dumps({"op": "schedule", "id": "r", "block_ids": [1, 9, 3]})


json_values = st.recursive(scalars.filter(lambda x: x == x), lambda inner: st.lists(inner, max_size=3) |
                           st.dictionaries(st.text(max_size=2), inner, max_size=3), max_leaves=6)
spaces = st.text(alphabet=" \t\r\n\x0b\x0c\u00a0", max_size=3)


def parsed(loads, line):
    try: return "ok", loads(line)
    except json.JSONDecodeError as e: return type(e).__name__, str(e)


@settings(max_examples=1000)
@given(spaces, json_values, spaces, st.one_of(st.just(""), st.text(max_size=3), st.sampled_from(["1", "]", "}", "{}"])))
def test_loads_line_equals_json_loads(before, value, after, junk):
    from kvref.oracle.replay import loads_line
    for line in (json.dumps(value) + "\n", before + json.dumps(value) + after, json.dumps(value) + after + junk,
                 (before + json.dumps(value))[:-1] + after):
        assert parsed(loads_line, line) == parsed(json.loads, line), repr(line)


def test_decision_encoder_reads_a_hybrid_table_again_even_vouched_for():
    "A table of tables (a hybrid trace's) changed in place: written again, though `ids_checked` vouches for int tables."
    from kvref.oracle.replay import DecisionEncoder
    encode, table = DecisionEncoder(ids_checked=True), [[1, 2], [3]]
    d = {"op": "schedule", "id": "r", "block_ids": table}
    assert encode(d) == json.dumps(d)
    table[0].append(4)
    assert encode(d) == json.dumps(d)


# ---------------------------------------------------------------- FileLockstep: a decisions file compared as text

def _write(path: Path, decisions, dumps=json.dumps) -> Path:
    path.write_text("".join(dumps(d) + "\n" for d in decisions))
    return path


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_file_lockstep_finds_what_the_list_lockstep_finds(tmp_path, trace):
    "On each golden trace, kvref's decisions with one field changed at a time: the same divergence from file and list."
    from kvref.oracle.conformance import check_recorded
    ops = load_trace(trace)
    decisions = list(replay(ops))
    assert check_recorded(_write(tmp_path / "d.jsonl", decisions), ops) is None
    for i in (0, len(decisions) // 2, len(decisions) - 1):
        changed = [dict(d) for d in decisions]
        changed[i]["num_free"] = -1
        for tampered in (changed, changed + [decisions[-1]], changed[:i + 1]):
            want, got = check_recorded(tampered, ops), check_recorded(_write(tmp_path / "t.jsonl", tampered), ops)
            assert (got.index, got.fields, got.expected, got.got) == (want.index, want.fields, want.expected, want.got)
    extra = check_recorded(_write(tmp_path / "e.jsonl", decisions + [{"op": "free", "id": "x"}]), ops)
    assert (extra.index, extra.op, extra.expected) == (len(ops), None, {"op": "free", "id": "x"})


def test_file_lockstep_reads_kvrefs_own_file_as_text(tmp_path):
    from kvref.oracle.replay import FileLockstep
    path = workload_trace(tmp_path)
    ops = load_trace(path)
    lock = FileLockstep(_write(tmp_path / "d.jsonl", replay(ops)), TraceReplayer().apply, ids_checked=True)
    assert all(lock.apply(op) is None for op in ops) and lock.rest() is None
    assert lock.by_text  # no line needed parsing


def test_file_lockstep_reads_another_writers_spacing(tmp_path):
    "A file in compact JSON: equal decisions match (parsed), and a changed one still diverges."
    from kvref.oracle.replay import FileLockstep
    ops = load_trace(workload_trace(tmp_path))
    decisions = list(replay(ops))
    compact = lambda d: json.dumps(d, separators=(",", ":"))
    lock = FileLockstep(_write(tmp_path / "c.jsonl", decisions, compact), TraceReplayer().apply)
    assert all(lock.apply(op) is None for op in ops) and not lock.by_text
    decisions[-2] = {**decisions[-2], "num_free": 10**6}
    lock = FileLockstep(_write(tmp_path / "c.jsonl", decisions, compact), TraceReplayer().apply)
    assert [d.index for d in map(lock.apply, ops) if d is not None][:1] == [len(ops) - 2]


def test_file_lockstep_refuses_a_bad_line_past_a_divergence(tmp_path):
    from kvref.oracle.conformance import check_recorded
    ops = load_trace(workload_trace(tmp_path))
    decisions = [json.dumps(d) for d in replay(ops)]
    decisions[1] = json.dumps({"op": "add", "id": "nobody"})
    path = tmp_path / "d.jsonl"
    for bad, message in (("[1]", "line 6: a decision must be a JSON object"), ("{", "line 6: not JSON")):
        path.write_text("\n".join(decisions[:5] + [bad] + decisions[5:]) + "\n")
        with pytest.raises(ValueError, match=message): check_recorded(path, ops)
    path.write_text("\n".join(decisions) + "\n[2]\n")  # past the last op too
    with pytest.raises(ValueError, match=f"line {len(decisions) + 1}: a decision must be"): check_recorded(path, ops)


def test_file_lockstep_refuses_an_empty_file(tmp_path):
    from kvref.oracle.replay import FileLockstep
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match="e.jsonl: no decisions, nothing to compare"):
        FileLockstep(tmp_path / "e.jsonl", TraceReplayer().apply)



@pytest.mark.parametrize("prompt_len, numpy_loaded", [(576, False), (1024, True)])
def test_numpy_is_imported_only_for_a_prompt_long_enough_for_its_route(tmp_path, prompt_len, numpy_loaded):
    "576-token prompts hash without numpy (the routes do not pay there); 1,024-token ones are cut from their pickle."
    w = shared_system_prompts(num_prompts=2, num_users=3, system_len=prompt_len - 16, user_len=16, output_len=2,
                              block_size=16, num_blocks=400, seed=0)
    path = write_trace(to_trace(w, max_live=2), tmp_path / "t.jsonl")
    code = ("import io, contextlib, sys; from kvref.cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()): assert main(['replay', {str(path)!r}]) == 0\n"
            "print(['numpy'] if 'numpy' in sys.modules else [])")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert ("numpy" in out) is numpy_loaded


@pytest.mark.parametrize("in_file", [False, True])
def test_decisions_that_end_early_diverge_in_the_fields_compared(tmp_path, in_file):
    "Fewer decisions than ops, some fields compared: a divergence in those fields, not a TypeError from deep inside."
    from kvref.oracle.conformance import check_recorded
    ops = load_trace(TRACES[0])
    decisions = list(replay(ops))[:4]
    given = _write(tmp_path / "d.jsonl", decisions) if in_file else decisions
    d = check_recorded(given, ops, fields=["block_ids", "num_free"])
    assert (d.index, d.expected, d.fields) == (4, None, [f for f in ("block_ids", "num_free") if f in d.got])
    assert check_main([str(TRACES[0]), "--expect", str(_write(tmp_path / "e.jsonl", decisions)), "--fields", "num_free"]) == 1
