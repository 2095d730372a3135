"""Replay: every recorded vLLM 0.33 trace decision by decision, the design doc example, the trace format's
validation, and the `kvref replay` command (exit codes 0, 1, 2)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvref.cli import replay_main
from kvref.oracle.replay import (TraceReplayer, load_decisions, load_trace, replay, validate_op)

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "traces"
TRACES = sorted(p for p in GOLDEN.glob("*.jsonl") if not p.name.endswith(".vllm.jsonl"))
KVREF = Path(sys.executable).parent / "kvref"


def expected_of(trace: Path) -> Path:
    return trace.with_name(trace.stem + ".vllm.jsonl")


def test_golden_traces_are_present():
    assert {p.stem for p in TRACES} >= {"design-doc-example", "trace-11-0", "trace-11-1", "trace-11-2", "trace-11-3"}


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_every_vllm_decision_reproduced(trace):
    ops, want = load_trace(trace), load_decisions(expected_of(trace))
    got = list(replay(ops))
    assert len(got) == len(want) == len(ops)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"op {i + 1}: {ops[i]}"
        assert list(g) == list(w), "keys in the recorded order"


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_output_is_textually_identical(trace, capsys):
    assert replay_main([str(trace)]) == 0
    assert capsys.readouterr().out == expected_of(trace).read_text()


def test_design_doc_behaviour_prints_the_documents_numbers():
    got = list(replay(load_trace(GOLDEN / "design-doc-example.jsonl"), behavior="design_doc"))
    frees = [d for d in got if d["op"] == "free"]
    assert frees[0]["free_queue"] == [7, 8, 9, 4, 3, 2]
    assert frees[1]["free_queue"] == [7, 8, 9, 4, 3, 2, 6, 5, 1, 0]
    assert got[-1]["block_ids"] == [0, 1, 2, 7, 8, 9, 4, 3] and got[-1]["hit_tokens"] == 12


def test_replayer_steps_in_lockstep():
    ops = load_trace(GOLDEN / "trace-11-1.jsonl")
    want = load_decisions(expected_of(GOLDEN / "trace-11-1.jsonl"))
    r = TraceReplayer("vllm_0_33")
    for i, op in enumerate(ops):
        assert r.apply(op) == want[i]
        assert r.num_applied == i + 1
    assert r.manager.get_free_queue_ids() == want[-1]["free_queue"]


# ---------------------------------------------------------------- the format

@pytest.mark.parametrize("op, message", [
    ({"op": "config", "num_blocks": 0, "block_size": 4}, "num_blocks must be >= 1"),
    ({"op": "config", "num_blocks": 4, "block_size": 4, "version": 3}, "version 3 is not supported"),
    ({"op": "schedule", "id": "r", "num_lookahead_tokens": 1}, "needs trace format version 2"),
    ({"op": "config", "num_blocks": 4, "block_size": True}, "'block_size' must be int, got true"),
    ({"op": "add", "id": "r", "prompt": [1, -1]}, "'prompt' must be a non-empty list of ints >= 0"),
    ({"op": "add", "id": "r", "prompt": [1], "lora": "L"}, "'lora' must be dict or null"),
    ({"op": "add", "id": "r", "prompt": []}, "'prompt' must be a non-empty list"),
    ({"op": "add", "id": "r", "prompt": [1], "lora": {"name": "L"}}, "'lora' must be {\"name\": str, \"path\": str}"),
    ({"op": "add", "id": "r", "prompt": [1], "lora": {"name": "L", "path": 3}}, "'lora' must be"),
    ({"op": "add", "id": "r", "prompt": [1], "mm_items": [{"id": "i", "offset": 0, "length": 1}]}, "each of 'mm_items'"),
    ({"op": "add", "id": "r", "prompt": [1], "mm_items": [{"identifier": "i", "offset": 0, "length": 0}]},
     "each of 'mm_items'"),
    ({"op": "add", "id": "r", "prompt": [1], "mm_items": ["i"]}, "each of 'mm_items'"),
    ({"op": "append", "id": "r", "tokens": []}, "'tokens' must be a non-empty list"),
    ({"op": "schedule", "id": "r", "budget": 0}, "budget must be >= 1"),
    ({"op": "append", "id": "r"}, "missing field 'tokens'"),
    ({"op": "free"}, "missing field 'id'"),
    ({"op": "reset_prefix_cache", "id": "r"}, "unknown field 'id'"),
    ({"op": "allocate"}, "unknown op 'allocate'"),
    (["op", "free"], "must be a JSON object"),
])
def test_validate_op_names_the_problem(op, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        validate_op(op)


def test_optional_fields_and_mm_items():
    ops = [{"op": "config", "num_blocks": 8, "block_size": 2, "version": 1},
           {"op": "add", "id": "a", "prompt": [5, 5, 5, 5, 1],
            "mm_items": [{"identifier": "img0", "offset": 0, "length": 4}]},
           {"op": "schedule", "id": "a"}, {"op": "free", "id": "a"},
           {"op": "add", "id": "b", "prompt": [5, 5, 5, 5, 2],
            "mm_items": [{"identifier": "img1", "offset": 0, "length": 4}]},
           {"op": "schedule", "id": "b"},
           {"op": "add", "id": "c", "prompt": [5, 5, 5, 5, 2],
            "mm_items": [{"identifier": "img0", "offset": 0, "length": 4}]},
           {"op": "schedule", "id": "c"}]
    got = list(replay(ops))
    assert got[5]["hit_tokens"] == 0   # another image: no hit
    assert got[7]["hit_tokens"] == 4   # the same image: hit


def write(tmp_path, name, lines):
    p = tmp_path / name
    p.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines))
    return p


def test_load_trace_names_the_line(tmp_path):
    cfg = {"op": "config", "num_blocks": 8, "block_size": 4}
    p = write(tmp_path, "t.jsonl", [cfg, "", {"op": "add", "id": "a", "prompt": [1]}, '{"op": "schedule",'])
    with pytest.raises(ValueError, match=r"t.jsonl, line 4: not JSON"):
        load_trace(p)
    p = write(tmp_path, "t.jsonl", [cfg, cfg])
    with pytest.raises(ValueError, match="line 2: the first op must be 'config', and only the first"):
        load_trace(p)
    with pytest.raises(ValueError, match="empty trace"):
        load_trace(write(tmp_path, "e.jsonl", []))
    with pytest.raises(ValueError, match="line 1: a decision must be a JSON object"):
        load_decisions(write(tmp_path, "d.jsonl", ["[1]"]))


def test_replayer_refuses_bad_sequences():
    r = TraceReplayer()
    with pytest.raises(ValueError, match="the first op must be 'config'"):
        r.apply({"op": "free", "id": "a"})
    r.apply({"op": "config", "num_blocks": 4, "block_size": 2, "max_model_len": 4})
    r.apply({"op": "add", "id": "a", "prompt": [1, 2, 3, 4, 5]})
    with pytest.raises(ValueError, match="request 'a' needs 5 tokens but max_model_len is 4"):
        r.apply({"op": "schedule", "id": "a"})
    r.apply({"op": "add", "id": "b", "prompt": [1, 2]})
    assert r.apply({"op": "schedule", "id": "b"})["allocated"] is True
    with pytest.raises(ValueError, match="request 'b': num_new_tokens must be > 0"):
        r.apply({"op": "schedule", "id": "b"})        # nothing left to compute
    with pytest.raises(ValueError, match="unknown request 'zz'"):
        r.apply({"op": "preempt", "id": "zz"})
    assert r.apply({"op": "free", "id": "zz"})["op"] == "free"       # a no-op, as in vLLM
    strict = TraceReplayer(strict=True)
    strict.apply({"op": "config", "num_blocks": 4, "block_size": 2})
    strict.apply({"op": "add", "id": "a", "prompt": [1]})
    strict.apply({"op": "free", "id": "a"})                             # added, never scheduled: fine
    with pytest.raises(ValueError, match="'a' is unknown or already freed"):
        strict.apply({"op": "free", "id": "a"})
    with pytest.raises(ValueError, match="behavior must be one of"):
        TraceReplayer("vllm")


# ---------------------------------------------------------------- the command

def test_expect_match_and_divergence(tmp_path, capsys):
    trace = GOLDEN / "trace-11-3.jsonl"
    assert replay_main([str(trace), "--expect", str(expected_of(trace))]) == 0
    assert capsys.readouterr().out == "kvref replay: all 118 decisions match (vllm_0_33)\n"
    want = load_decisions(expected_of(trace))
    want[40]["free_queue"] = want[40]["free_queue"][::-1] + [99]
    bad = write(tmp_path, "bad.vllm.jsonl", want)
    assert replay_main([str(trace), "--expect", str(bad)]) == 1
    out = capsys.readouterr().out.splitlines()
    head = "diverged at op 40 (line 41 of the trace): "
    assert out[0].startswith(head) and json.loads(out[0][len(head):]) == load_trace(trace)[40]
    assert out[1] == "  free_queue:"
    assert json.loads(out[2].split("expected ")[1]) == want[40]["free_queue"]
    assert json.loads(out[3].split("got      ")[1]) == load_decisions(expected_of(trace))[40]["free_queue"]
    short = write(tmp_path, "short.jsonl", want[:10])
    assert replay_main([str(trace), "--expect", str(short)]) == 1
    assert capsys.readouterr().out.startswith("diverged at op 10 (line 11 of the trace): ")
    longer = write(tmp_path, "long.jsonl", load_decisions(expected_of(trace)) + [{"op": "free"}])
    assert replay_main([str(trace), "--expect", str(longer)]) == 1
    assert "op 118 (line 119 of the trace): the trace ended, but the decisions go on with" in capsys.readouterr().out


def test_bad_files_exit_2_with_one_line(tmp_path, capsys):
    p = write(tmp_path, "t.jsonl", [{"op": "config", "num_blocks": 8, "block_size": 4},
                                    {"op": "schedule", "id": "a", "budget": "all"}])
    assert replay_main([str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "kvref replay: error:" in err and "line 2" in err
    assert replay_main([str(tmp_path / "missing.jsonl")]) == 2
    p = write(tmp_path, "u.jsonl", [{"op": "config", "num_blocks": 8, "block_size": 4}, {"op": "append", "id": "x", "tokens": [1]}])
    assert replay_main([str(p)]) == 2
    assert "op 1: op 'append': unknown request 'x'" in capsys.readouterr().err
    assert replay_main([str(p), "--behavior", "v0"]) == 2
    assert capsys.readouterr().err == ("kvref replay: error: argument --behavior: invalid choice: 'v0' "
                                       "(choose from 'vllm_0_33', 'design_doc')\n")


@pytest.mark.skipif(not KVREF.exists(), reason="console script not installed")
def test_console_command(tmp_path):
    trace = GOLDEN / "design-doc-example.jsonl"
    ok = subprocess.run([str(KVREF), "replay", str(trace), "--expect", str(expected_of(trace))],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and "all 13 decisions match" in ok.stdout
    doc = subprocess.run([str(KVREF), "replay", str(trace), "--behavior", "design_doc"], capture_output=True, text=True)
    assert json.loads(doc.stdout.splitlines()[-1])["block_ids"] == [0, 1, 2, 7, 8, 9, 4, 3]
    bad = write(tmp_path, "b.jsonl", ["{nope"])
    res = subprocess.run([str(KVREF), "replay", str(bad)], capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "line 1" in res.stderr and "Traceback" not in res.stderr


def test_stats_report_matches_replay_stats(capsys):
    from kvref.oracle.workloads import replay_stats
    trace = GOLDEN / "trace-11-2.jsonl"
    ops = load_trace(trace)
    assert replay_main([str(trace), "--stats"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == replay_stats(ops, replay(ops)).report().strip()
    assert "token hit rate" in out and "preemptions" in out


def test_stats_with_expect_checks_first(capsys):
    trace = GOLDEN / "trace-11-0.jsonl"
    assert replay_main([str(trace), "--stats", "--expect", str(trace).replace(".jsonl", ".vllm.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "decisions match" in out and "token hit rate" in out


def test_svg_writes_one_wellformed_picture_per_op(tmp_path, capsys):
    import xml.etree.ElementTree as ET
    trace = GOLDEN / "design-doc-example.jsonl"
    assert replay_main([str(trace), "--svg", str(tmp_path / "pics")]) == 0
    pictures = sorted((tmp_path / "pics").glob("*.svg"))
    assert len(pictures) == len(load_trace(trace))
    for p in pictures: assert ET.parse(p).getroot().tag.endswith("svg")


def test_svg_without_matplotlib_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert replay_main([str(GOLDEN / "design-doc-example.jsonl"), "--svg", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "matplotlib" in err[0]
