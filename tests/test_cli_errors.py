"""The command line never crashes and never passes on nothing: malformed input is exit 2 with one line on stderr.

Each row of `BAD` is a reproducer from issue 12 / 13: the files it needs, the argv (`{f}` is the folder holding the
files), and a piece of the one stderr line. The fuzz tests run every subcommand on malformed files and arguments.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvref import cli
from kvref.cli import MAX_NUM_BLOCKS, main, parse_int
from kvref.oracle.conformance import check
from kvref.adapters.nano import NanoAdapter
from kvref.oracle.replay import load_decisions, load_trace

ROOT = Path(__file__).resolve().parents[1]
TRACE = str(ROOT / "golden" / "traces" / "design-doc-example.jsonl")
DECISIONS = str(ROOT / "golden" / "traces" / "design-doc-example.vllm.jsonl")
RUNS = ROOT / "golden" / "thinking_budget" / "vllm-0.33-thinking-budget-v1.json"
VECTORS = ROOT / "golden" / "hashing" / "vllm-0.33-block-hashes.json"
NANO = "kvref.adapters.nano:NanoAdapter"
DEEP = "[" * 100_000 + "]" * 100_000
CONFIG = '{"op": "config", "num_blocks": 8, "block_size": 4}\n'
HYBRID = str(ROOT / "golden" / "hybrid" / "hybrid-gpt-oss-11-1.jsonl")
HYBRID_DECISIONS = str(ROOT / "golden" / "hybrid" / "hybrid-gpt-oss-11-1.vllm.jsonl")
HYBRID_ADAPTER = "kvref.oracle.hybrid_replay:KVRefHybridAdapter"
ENGINE_A = str(ROOT / "golden" / "events" / "audit" / "engine-a.jsonl")
AUDIT_STATED = ["--vllm-version", "0.33.0", "--hash-algo", "sha256", "--block-size", "4"]
WORKLOADS = str(ROOT / "golden" / "scheduler" / "workloads.jsonl")


def _hybrid(*ops: dict, **groups) -> str:
    "A hybrid trace: a sliding-window and a full-attention group (fields of group 0 overridden by `groups`), then `ops`."
    sliding = {"kind": "sliding_window", "block_size": 2, "sliding_window": 8, **groups}
    config = {"op": "config", "groups": [sliding, {"kind": "full", "block_size": 2}], "num_blocks": 16}
    return "".join(json.dumps(op) + "\n" for op in (config, *ops))


def _vectors(**change) -> str:
    vector = json.loads(VECTORS.read_text())["vectors"][0]
    return json.dumps({"vectors": [{**vector, **change}]})


ROUTER_ADAPTER, FIRST_BYTES = "kvref.oracle.router_conformance:ExampleRouter", "kvref.oracle.router_conformance:FirstBytesRouter"
RELEASE_VECTORS = ROOT / "golden" / "versions" / "0.33.0" / "block-hashes.json"


def _release_vectors(drop=None, as_list=False) -> str:
    "A release vector file whose first vector lacks `drop`, or is a list of its values."
    data = json.loads(RELEASE_VECTORS.read_text())
    vector = data["vectors"][0]
    data["vectors"] = [list(vector.values()) if as_list else {k: v for k, v in vector.items() if k != drop}]
    return json.dumps(data)


def _caching_off() -> str:
    "The design-doc trace with prefix caching off: it publishes no KV events."
    ops = [json.loads(line) for line in Path(TRACE).read_text().splitlines() if line.strip()]
    return "".join(json.dumps(op) + "\n" for op in [{**ops[0], "enable_caching": False}] + ops[1:])


def _runs(**change) -> str:
    run = json.loads(RUNS.read_text())["cases"][0]
    return json.dumps({"cases": [{**run, **change}]})


BAD = [  # (files, argv, piece of the stderr line)
    # integers, strictly
    ({}, ["hash", "²"], "token ids must be integers, got '²'"),
    ({}, ["hash", "9" * 5000], "token ids must be integers, got '9999"),
    ({}, ["hash", "--", "-1"], "token_ids[0] is -1; token ids are integers from 0 to 18446744073709551615"),
    ({}, ["hash", "18446744073709551616"], "token_ids[0] is 18446744073709551616"),
    ({}, ["hash", "1", "5_000"], "token ids must be integers, got '5_000'"),
    ({}, ["hash", "+5"], "got '+5'"),
    ({}, ["hash", " 5"], "got ' 5'"),
    ({}, ["hash", "٣"], "got '٣'"),
    ({}, ["hash", "1", "--block-size", "5_000"], "argument --block-size: invalid int value: '5_000'"),
    ({}, ["hash", "1", "--mm", "img:²:1"], "--mm OFFSET: invalid int value"),
    ({}, ["cudagraph", "--max-num-seqs", "1e3"], "argument --max-num-seqs: invalid int value: '1e3'"),
    ({}, ["cudagraph", "3²"], "batch '3²' is not a token count"),
    ({}, ["cudagraph", "--capture-sizes", "1,٣"], "--capture-sizes takes comma-separated integers"),
    ({}, ["thinking-budget", "--start", "1", "--end", "+2"], "--end must be token ids"),
    ({}, ["thinking-budget", "--start", "1", "--end", "2", "--budget", "٣"], "thinking_token_budget must be an int"),
    # token files
    ({"t.json": '["1", "2"]'}, ["hash", "--file", "{f}/t.json"], 't.json: token_ids[0] is "1"'),
    ({"t.json": "[1.0]"}, ["hash", "--file", "{f}/t.json"], "t.json: token_ids[0] is 1.0"),
    ({"t.json": "[[1, 2]]"}, ["hash", "--file", "{f}/t.json"], "t.json: token_ids[0] is [1, 2]"),
    ({"t.json": "[true]"}, ["hash", "--file", "{f}/t.json"], "t.json: token_ids[0] is true"),
    ({"t.json": '[1, 2, "x"]'}, ["hash", "--file", "{f}/t.json", "--block-size", "2"], 't.json: token_ids[2] is "x"'),
    ({"t.json": "[1, 2, -3]"}, ["hash", "--file", "{f}/t.json", "--block-size", "2"], "t.json: token_ids[2] is -3"),
    ({"t.txt": "1 2\n3 x\n"}, ["hash", "--file", "{f}/t.txt"], "t.txt, line 2: token ids must be integers, got 'x'"),
    ({"t.txt": ""}, ["hash", "--file", "{f}/t.txt"], "t.txt: no tokens"),
    ({"t.json": "[]"}, ["hash", "--file", "{f}/t.json"], "t.json: no tokens"),
    ({"t.json": "[1,\n 2,"}, ["hash", "--file", "{f}/t.json"], "t.json is not JSON: Expecting value (line 2"),
    ({"t.json": DEEP}, ["hash", "--file", "{f}/t.json"], "t.json: JSON nested too deeply"),
    ({"t.bin": b"\xff\xfe1 2"}, ["hash", "--file", "{f}/t.bin"], "t.bin: not UTF-8"),
    ({}, ["hash", "--file", "{f}/missing.json"], "/missing.json: cannot read: No such file"),
    # vector files
    ({"v.json": '{"vectors": []}'}, ["hash", "--check", "{f}/v.json"], "v.json: no vectors"),
    ({"v.json": DEEP}, ["hash", "--check", "{f}/v.json"], "v.json: JSON nested too deeply"),
    ({"v.json": _vectors(prompt_embeds={"dtype": "float32", "rows": [[1, [2]]]})}, ["hash", "--check", "{f}/v.json"],
     "v.json: vector 0"),
    ({"v.json": _vectors(prompt_embeds={"dtype": "nope", "rows": [[1]]})}, ["hash", "--check", "{f}/v.json"], "v.json: vector 0"),
    ({"v.json": _vectors(prompt_embeds=5)}, ["hash", "--check", "{f}/v.json"], "v.json: vector 0: malformed"),
    # traces
    ({"t.jsonl": CONFIG + DEEP + "\n"}, ["replay", "{f}/t.jsonl"], "t.jsonl, line 2: JSON nested too deeply"),
    ({"t.jsonl": DEEP + "\n"}, ["check", "{f}/t.jsonl", "--adapter", NANO], "t.jsonl, line 1: JSON nested too deeply"),
    ({"t.jsonl": CONFIG + '{"op": "add", "id": \n'}, ["replay", "{f}/t.jsonl"], "t.jsonl, line 2: not JSON"),
    ({"t.jsonl": CONFIG + b'{"op": "\xff"}\n'.decode("latin-1")}, ["replay", "{f}/t.jsonl"], "t.jsonl, line 2"),
    ({"t.jsonl": ""}, ["replay", "{f}/t.jsonl"], "t.jsonl: empty trace"),
    ({"t.jsonl": '{"op": "config", "num_blocks": 1000000000000, "block_size": 4}\n'}, ["replay", "{f}/t.jsonl"],
     f"num_blocks 1000000000000 is above the command line's limit of {MAX_NUM_BLOCKS}"),
    ({"t.jsonl": '{"op": "config", "num_blocks": 10000000, "block_size": 4}\n'}, ["check", "{f}/t.jsonl", "--adapter", NANO],
     "above the command line's limit"),
    ({"d.jsonl": ""}, ["replay", TRACE, "--expect", "{f}/d.jsonl"], "d.jsonl: no decisions, nothing to compare"),
    ({"d.jsonl": DEEP + "\n"}, ["replay", TRACE, "--expect", "{f}/d.jsonl"], "d.jsonl, line 1: JSON nested too deeply"),
    # check
    ({}, ["check", TRACE, "--adapter", NANO, "--fields", ""], "--fields '' names no field: nothing would be compared"),
    ({}, ["check", TRACE, "--adapter", NANO, "--fields", " , "], "names no field"),
    ({"broken_adapter_mod.py": "raise RuntimeError('boom at import')\n"}, ["check", TRACE, "--adapter", "broken_adapter_mod:X"],
     "cannot import module 'broken_adapter_mod': RuntimeError: boom at import"),
    ({}, ["check", TRACE, "--adapter", "no_such_engine_mod:X"], "(is its folder on PYTHONPATH?)"),
    ({}, ["check", TRACE, "--adapter", NANO, "--out", "/proc/nope"], "--out /proc/nope: not an existing folder"),
    ({"x.txt": "keep"}, ["check", TRACE, "--adapter", NANO, "--out", "{f}/x.txt"], "x.txt: not an existing folder"),
    # hybrid traces (issue 16): options that do not apply, malformed groups and ops, check's pairing
    ({}, ["replay", HYBRID, "--vllm-version", "0.9.2"], "--vllm-version does not apply to a hybrid trace (config with 'groups')"),
    ({}, ["replay", HYBRID, "--behavior", "design_doc"], "--behavior does not apply to a hybrid trace"),
    ({}, ["replay", HYBRID, "--format", "2"], "--format does not apply to a hybrid trace"),
    ({}, ["replay", HYBRID, "--free-queue-every", "3"], "--free-queue-every does not apply to a hybrid trace"),
    ({}, ["replay", HYBRID, "--strict"], "--strict does not apply to a hybrid trace"),
    ({"t.jsonl": _hybrid(kind="linear")}, ["replay", "{f}/t.jsonl"],
     "t.jsonl, line 1: groups[0].kind must be one of 'full', 'sliding_window', 'chunked_local', 'mamba', got 'linear'"),
    ({"t.jsonl": _hybrid(kind="linear")}, ["check", "{f}/t.jsonl", "--adapter", HYBRID_ADAPTER], "t.jsonl, line 1: groups[0].kind"),
    ({"t.jsonl": _hybrid(sliding_window=0)}, ["replay", "{f}/t.jsonl"], "t.jsonl, line 1: groups[0].sliding_window must be"),
    ({"t.jsonl": _hybrid().replace('"num_blocks": 16', '"num_blocks": 16, "prefix_match_unit": 3')}, ["replay", "{f}/t.jsonl", "--stats"],
     "op 0: prefix_match_unit=3 must divide every block size, got [2, 2]"),
    ({"t.jsonl": _hybrid(kind="mamba", sliding_window=None, mamba_cache_mode="all")}, ["replay", "{f}/t.jsonl"],
     "has unknown field 'sliding_window' for kind 'mamba'"),
    ({"t.jsonl": _hybrid(kind="mamba", mamba_cache_mode="all")}, ["replay", "{f}/t.jsonl"], "groups[0]"),
    ({"t.jsonl": _hybrid().replace('"num_blocks": 16', '"num_blocks": 16, "block_size": 2')}, ["replay", "{f}/t.jsonl"],
     "line 1: op 'config' has unknown field 'block_size'"),
    ({"t.jsonl": _hybrid().replace('"num_blocks": 16', '"num_blocks": 16, "max_model_len": 1')}, ["replay", "{f}/t.jsonl"],
     "op 0: the block sizes [2, 2] have lcm 2 (the scheduler block size) but max_model_len is 1"),
    ({"t.jsonl": _hybrid().replace('"num_blocks": 16', '"num_blocks": 10000000')}, ["replay", "{f}/t.jsonl"],
     "num_blocks 10000000 is above the command line's limit"),
    ({"t.jsonl": _hybrid({"op": "add", "id": "a", "prompt": [1, 2]}, {"op": "append", "id": "a"})}, ["replay", "{f}/t.jsonl"],
     "t.jsonl, line 3: op 'append' is missing field 'tokens'"),
    ({"t.jsonl": _hybrid({"op": "new_step", "id": "a"})}, ["check", "{f}/t.jsonl", "--adapter", HYBRID_ADAPTER],
     "line 2: op 'new_step' has unknown field 'id'"),
    ({"t.jsonl": _hybrid({"op": "add", "id": "a", "prompt": [1, 2]}, {"op": "schedule", "id": "a", "num_lookahead_tokens": 1})},
     ["replay", "{f}/t.jsonl"], "line 3: op 'schedule': hybrid traces have no num_lookahead_tokens"),
    ({"t.jsonl": _hybrid({"op": "frobnicate"})}, ["replay", "{f}/t.jsonl"], "line 2: unknown op 'frobnicate'; valid hybrid ops"),
    ({"t.jsonl": _hybrid({"op": "schedule", "id": "ghost"})}, ["replay", "{f}/t.jsonl", "--stats"], "op 1: op 'schedule': unknown request 'ghost'"),
    ({}, ["check", HYBRID, "--adapter", HYBRID_ADAPTER, "--behavior", "design_doc"],
     "hybrid-gpt-oss-11-1.jsonl: hybrid traces replay as vLLM 0.33 does: behavior 'design_doc' does not apply to them"),
    ({}, ["check", HYBRID, "--expect", HYBRID_DECISIONS, "--behavior", "design_doc"], "behavior 'design_doc' does not apply"),
    ({}, ["check", HYBRID, "--adapter", HYBRID_ADAPTER, "--free-queue-every", "5"], "free_queue_every does not apply to a hybrid trace"),
    ({}, ["check", HYBRID, "--adapter", HYBRID_ADAPTER, "--fields", "taken"], "unknown fields ['taken']; choose from ('hit_tokens'"),
    ({}, ["check", TRACE, "--adapter", NANO, "--fields", "copies"], "unknown fields ['copies']; choose from ('hit_tokens'"),
    ({}, ["check", HYBRID], "give --adapter (an engine to check) or --expect (recorded decisions), one of the two"),
    ({}, ["check", HYBRID, "--adapter", HYBRID_ADAPTER, "--expect", HYBRID_DECISIONS], "one of the two"),
    ({}, ["check", HYBRID, TRACE, "--expect", HYBRID_DECISIONS], "--expect gives 1 decisions files for 2 traces"),
    ({}, ["check", HYBRID, "--expect", HYBRID_DECISIONS, "--out", "."], "--out and --free-queue-every go with --adapter"),
    ({"d.jsonl": ""}, ["check", HYBRID, "--expect", "{f}/d.jsonl"], "d.jsonl: no decisions, nothing to compare"),
    ({"d.jsonl": "[1]\n"}, ["check", HYBRID, "--expect", "{f}/d.jsonl"], "d.jsonl, line 1: a decision must be a JSON object"),
    ({"x.txt": "keep"}, ["replay", HYBRID, "--svg", "{f}/x.txt"], "x.txt"),
    # thinking budget
    ({"r.json": '{"cases": []}'}, ["thinking-budget", "--check", "{f}/r.json"], "r.json: no runs, nothing to check"),
    ({"r.json": DEEP}, ["thinking-budget", "--check", "{f}/r.json"], "r.json: JSON nested too deeply"),
    ({"r.json": _runs(end=[10 ** 10])}, ["thinking-budget", "--check", "{f}/r.json"], "case 0: end must be a list of token ids"),
    ({"r.json": _runs(wish=[1, "x"])}, ["thinking-budget", "--check", "{f}/r.json"], "case 0: wish must be a list of token ids"),
    ({"r.json": _runs(forced=[0] * 24)}, ["thinking-budget", "--check", "{f}/r.json"], "case 0: forced must be a list of true/false"),
    ({"r.json": _runs(wish=[], emitted=[], forced=[])}, ["thinking-budget", "--check", "{f}/r.json"], "at least 1"),
    ({"r.json": _runs(budget="3")}, ["thinking-budget", "--check", "{f}/r.json"], "case 0: thinking_token_budget must be"),
    ({"r.json": '{"cases": [7]}'}, ["thinking-budget", "--check", "{f}/r.json"], "case 0: a run must be a JSON object"),
    # cudagraph sizes that would allocate up front
    ({}, ["cudagraph", "--max-num-batched-tokens", "1000000000", "--max-capture-size", "1000000000"],
     "argument --max-capture-size: invalid int value: '1000000000' (an integer from 1 to 65536)"),
    ({}, ["cudagraph", "--capture-sizes", "1,100000000"], "each at most 65536"),
    # issue 32: the newer commands
    ({"e.jsonl": ""}, ["replay", "{f}/e.jsonl", "--vllm-version", "0.9.0"], "e.jsonl: empty trace"),
    ({"v.json": _release_vectors(drop="algo")}, ["hash", "--diagnose", "{f}/v.json"], "v.json: vectors[0] has no 'algo'"),
    ({"v.json": _release_vectors(as_list=True)}, ["hash", "--check", "{f}/v.json"], "v.json: vectors[0] must be an object, got list"),
    ({"v.json": _release_vectors(drop="block_size")}, ["hash", "--check", "{f}/v.json"], "vectors[0] has no 'block_size'"),
    ({}, ["events", TRACE, "--publish", "not-an-endpoint", "--wait-s", "0"], "endpoint 'not-an-endpoint': ZMQ cannot bind it"),
    ({}, ["events", TRACE, "--publish", "tcp://*:abc", "--wait-s", "0"], "endpoint 'tcp://*:abc': ZMQ cannot bind it"),
    ({}, ["events", TRACE, "--publish", "", "--wait-s", "0"], "endpoint '': ZMQ cannot bind it"),
    ({}, ["events", TRACE, "--publish", "ipc:///proc/kvref/x", "--wait-s", "0"], "endpoint 'ipc:///proc/kvref/x': ZMQ cannot bind"),
    ({}, ["events", TRACE, "--publish", "tcp://127.0.0.1:*", "--replay", "nowhere", "--wait-s", "0"], "replay_endpoint 'nowhere'"),
    ({"c.jsonl": CONFIG}, ["check-router", "{f}/c.jsonl", "--adapter", ROUTER_ADAPTER], "compared nothing"),
    ({"off.jsonl": _caching_off()}, ["check-router", "{f}/off.jsonl", "--adapter", FIRST_BYTES],
     "compared nothing: the traces publish no KV events"),
    ({}, ["check-router", TRACE, TRACE, "--adapter", ROUTER_ADAPTER], "two traces have the file name 'design-doc-example.jsonl'"),
    # issue 32: kvref hash's version flags
    ({}, ["hash", "1", "2", "--vllm-version", ""], "kvref hash: error: '' is not a vLLM release number"),
    ({}, ["check", TRACE, "--expect", DECISIONS, "--vllm-version", ""], "'' is not a vLLM release number"),
    ({}, ["hash", "1", "2", "--vllm-version", "0.9.2", "--seed", "7"], "--seed does not go with --vllm-version"),
    ({}, ["hash", "1", "2", "--vllm-version", "0.8.5", "--format", "int64"], "--format int64: vLLM 0.8.5 has no KV events"),
    ({}, ["hash", "1", "2", "--pythonhashseed", ""], "--pythonhashseed and --lora-int-id go with --vllm-version"),
    # issue 32: audit, schedule, vectors and convert
    ({"s.jsonl": ""}, ["audit", "--file", "{f}/s.jsonl", *AUDIT_STATED], "s.jsonl: nothing was checked"),
    ({"s.jsonl": "[1]\n"}, ["audit", "--file", "{f}/s.jsonl", *AUDIT_STATED], "s.jsonl, line 1: seq must be an int >= 0, got None"),
    ({"s.jsonl": '{"seq": -1, "payload_b64": "AA=="}\n'}, ["audit", "--file", "{f}/s.jsonl", *AUDIT_STATED], "seq must be an int >= 0, got -1"),
    ({"s.jsonl": '{"seq": 0, "payload_b64": "!!"}\n'}, ["audit", "--file", "{f}/s.jsonl", *AUDIT_STATED], "s.jsonl, line 1: payload_b64 is not base64"),
    ({"s.jsonl": "{\n"}, ["audit", "--file", "{f}/s.jsonl", *AUDIT_STATED], "s.jsonl, line 1: not JSON"),
    ({"s.jsonl": DEEP + "\n"}, ["audit", "--file", "{f}/s.jsonl", *AUDIT_STATED], "s.jsonl, line 1: JSON nested too deeply"),
    ({}, ["audit", "--file", "{f}/missing.jsonl", *AUDIT_STATED], "missing.jsonl"),
    ({}, ["audit", "--file", ENGINE_A, *AUDIT_STATED[:-1], "0"], "argument --block-size: invalid int value: '0'"),
    ({}, ["audit", "--file", ENGINE_A, "--vllm-version", "0.8.5", *AUDIT_STATED[2:]], "vLLM 0.8.5 has no KV events"),
    ({}, ["audit", "--file", ENGINE_A, "--vllm-version", "", *AUDIT_STATED[2:]], "'' is not a vLLM release number"),
    ({}, ["audit", "--file", ENGINE_A, "--vllm-version", "0.33.0", "--hash-algo", "builtin", "--block-size", "4"],
     "engine 'engine-a': vLLM 0.33.0 offers hash algorithms"),
    ({}, ["audit", "--file", ENGINE_A, *AUDIT_STATED, "--hash-form", "hex"], "argument --hash-form: invalid choice: 'hex'"),
    ({}, ["audit", "--file", ENGINE_A, *AUDIT_STATED, "--engine", "a", "--engine", "b"], "--engine given 2 times for 1 engines"),
    ({}, ["audit", "--file", ENGINE_A, *AUDIT_STATED, "--vllm-version", "0.33.0"], "--vllm-version given 2 times for 1 engines"),
    ({}, ["audit", "--file", ENGINE_A, "--file", ENGINE_A, *AUDIT_STATED], "two engines share a name"),
    ({}, ["audit", *AUDIT_STATED], "give either --file streams or live ENDPOINTs, not both or neither"),
    ({}, ["audit", "tcp://127.0.0.1:1", *AUDIT_STATED, "--duration", "nan"], "--duration must be in (0, 86400] seconds, got nan"),
    ({}, ["audit", "tcp://127.0.0.1:1", *AUDIT_STATED, "--max-batches", "0"], "argument --max-batches: invalid int value: '0'"),
    ({}, ["audit", "--file", ENGINE_A, *AUDIT_STATED, "--report", "/proc/nope/r.json"], "--report /proc/nope/r.json: its folder does not exist"),
    ({"w.jsonl": ""}, ["schedule", "{f}/w.jsonl"], "w.jsonl: no workload"),
    ({"w.jsonl": '{"name": "w", "requests": 5}\n'}, ["schedule", "{f}/w.jsonl"], "w.jsonl: line 1: expected an object with a 'requests' list"),
    ({"w.jsonl": '{"name": "w", "requests": [{"id": "a", "prompt": [1, 2], "max_tokens": 0}]}\n'}, ["schedule", "{f}/w.jsonl"],
     "line 1: request 'a': max_tokens must be"),
    ({"w.jsonl": DEEP + "\n"}, ["schedule", "{f}/w.jsonl"], "w.jsonl: JSON nested too deeply"),
    ({}, ["schedule", "{f}/missing.jsonl"], "missing.jsonl"),
    ({}, ["schedule", WORKLOADS, "--only", "nope"], "no workload named 'nope'"),
    ({}, ["schedule", WORKLOADS, "--only", "min_control", "--expect", "/proc/nope"], "/proc/nope/min_control.jsonl: cannot read"),
    ({"min_control.jsonl": '{"step": \n'}, ["schedule", WORKLOADS, "--only", "min_control", "--expect", "{f}"],
     "min_control.jsonl, line 1 is not JSON"),
    ({"min_control.jsonl": "[1]\n"}, ["schedule", WORKLOADS, "--only", "min_control", "--expect", "{f}"],
     "min_control.jsonl, line 1: a step record must be a JSON object"),
    ({"min_control.jsonl": DEEP + "\n"}, ["schedule", WORKLOADS, "--only", "min_control", "--expect", "{f}"], "JSON nested too deeply"),
    ({}, ["vectors", "nope/nothing"], "no shipped vector 'nope/nothing'"),
    ({}, ["vectors", "../../etc/passwd"], "no shipped vector '../../etc/passwd'"),
    ({}, ["vectors", "rules/nope/"], "no shipped vector file matches rules/nope/"),
    ({}, ["vectors", "--kind", "nope"], "argument --kind: invalid choice: 'nope'"),
    ({}, ["vectors", "--kind", "trace", "--vllm", "0.7"], "no shipped vector file matches --kind trace --vllm 0.7"),
    ({}, ["vectors", "traces/trace-11-0.vllm", "--paths"], "NAME takes no other option"),
    ({"m.jsonl": "[1]\n"}, ["convert", "{f}/m.jsonl", "--from", "mooncake"], "m.jsonl: line 1: expected a JSON object, got list"),
    ({"m.jsonl": DEEP + "\n"}, ["convert", "{f}/m.jsonl", "--from", "mooncake"], "m.jsonl: line 1: JSON nested too deeply"),
    ({}, ["convert", "{f}/missing.jsonl", "--from", "mooncake"], "missing.jsonl"),
    ({}, ["convert", TRACE, "--from", "csv"], "--from 'csv': unknown format; known: mooncake"),
    ({}, ["convert", TRACE, "--from", "mooncake", "--max-live", "0"], "argument --max-live: invalid int value: '0'"),
    # the front door
    ({}, ["--frobnicate"], "kvref: error: unknown option '--frobnicate'"),
    ({}, [], "kvref: error: give a command"),
    ({}, ["frobnicate"], "unknown command 'frobnicate'"),
]


def _materialize(tmp_path: Path, files: dict, argv: list[str]) -> list[str]:
    for name, content in files.items():
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return [a.replace("{f}", str(tmp_path)) for a in argv]


@pytest.mark.parametrize("files, argv, message", BAD, ids=[" ".join(a)[:60] for _, a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, files, argv, message):
    monkeypatch.syspath_prepend(str(tmp_path))
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(_materialize(tmp_path, files, argv)) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("kvref"), err
    assert message in err, err
    assert out == "" and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(set(before) | set(files)), "a refused command wrote a file"


def test_adapter_import_traceback_on_request(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = _materialize(tmp_path, {"raising_engine.py": "def f(): raise RuntimeError('deep')\nf()\n"},
                        ["check", TRACE, "--adapter", "raising_engine:X", "--traceback"])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "raising_engine.py" in err and "raise RuntimeError('deep')" in err
    assert err.splitlines()[-1] == "kvref check: error: cannot import module 'raising_engine': RuntimeError: deep"


def test_num_blocks_limit_is_inclusive(tmp_path, capsys, monkeypatch):
    "A pool of exactly MAX_NUM_BLOCKS blocks is replayed, one more is refused (the limit lowered to keep this fast)."
    monkeypatch.setattr(cli, "MAX_NUM_BLOCKS", 64)
    for num_blocks, status in ((64, 0), (65, 2)):
        (tmp_path / "t.jsonl").write_text(f'{{"op": "config", "num_blocks": {num_blocks}, "block_size": 4}}\n')
        assert main(["replay", str(tmp_path / "t.jsonl")]) == status
    out, err = capsys.readouterr()
    assert json.loads(out)["num_free"] == 63 and "num_blocks 65 is above the command line's limit of 64" in err


def test_hash_of_a_release_without_kv_events(capsys):
    "vLLM 0.8.5 had no KV events, but its hashes print in hex (issue 32: it was refused for every format)."
    from kvref.oracle.releases import profile_for_version, release_block_hashes
    argv = ["hash", "1", "2", "3", "4", "--block-size", "2", "--vllm-version", "0.8.5", "--pythonhashseed", "0"]
    assert main(argv) == 0
    expected = release_block_hashes(profile_for_version("0.8.5"), [1, 2, 3, 4], 2, "sha256", pythonhashseed="0")
    assert capsys.readouterr().out.split() == [str(h) for h in expected]


def test_parse_int_takes_plain_integers_only():
    assert [parse_int(t) for t in ("0", "-0", "007", "123", "-9223372036854775808")] == [0, 0, 7, 123, -(1 << 63)]
    for text in ("5_000", "+5", " 5", "5 ", "٣", "²", "1e3", "0x1", "", "-", "9" * 21, "9223372036854775808"):
        with pytest.raises(ValueError, match="invalid int value"): parse_int(text)


# ---------------------------------------------------------------- ops are counted from 0, by both checks

def test_replay_expect_and_check_number_ops_alike(tmp_path, capsys):
    ops = load_trace(TRACE)
    divergence = check(NanoAdapter, ops)
    n = divergence.index
    assert main(["check", TRACE, "--adapter", NANO, "--out", str(tmp_path)]) == 1
    assert f"diverged at op {n} (line {n + 1} of the trace): {json.dumps(ops[n])}" in capsys.readouterr().out
    decisions = load_decisions(DECISIONS)
    decisions[n] = {**decisions[n], "num_free": -1}
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(d) + "\n" for d in decisions))
    assert main(["replay", TRACE, "--expect", str(tmp_path / "d.jsonl")]) == 1
    assert capsys.readouterr().out.startswith(f"diverged at op {n} (line {n + 1} of the trace): {json.dumps(ops[n])}")


def test_zero_is_agreement_on_something(capsys):
    "The golden files pass, and say how much they compared."
    assert main(["hash", "--check", str(VECTORS)]) == 0
    assert main(["thinking-budget", "--check", str(RUNS)]) == 0
    assert main(["replay", TRACE, "--expect", DECISIONS]) == 0
    assert main(["check", TRACE, "--adapter", "kvref.oracle.conformance:KVRefAdapter", "--fields", "allocated"]) == 0
    assert capsys.readouterr().out.splitlines() == ["16 vectors, 16 match", "30 runs, 30 match (vllm_0_33_v1)",
                                                     "kvref replay: all 13 decisions match (vllm_0_33)",
                                                     f"{TRACE}: conforms (13 ops)"]


# ---------------------------------------------------------------- fuzz: every command, malformed files and arguments

MALFORMED = ["", "\n\n", "null", "[]", "{}", "[1, 2, 3]", '{"vectors": [{}]}', '{"cases": [{}]}', '{"vectors": 3}',
             '{"cases": "x"}', "[" * 5000, DEEP, CONFIG, CONFIG + '{"op": "schedule", "id": "a"}\n',
             '{"op": "config", "num_blocks": 1, "block_size": 4}\n', '{"op": "config", "num_blocks": true, "block_size": 4}\n',
             CONFIG + '{"op": "add", "id": "a", "prompt": [18446744073709551616]}\n{"op": "schedule", "id": "a"}\n',
             _vectors(prompt_token_ids=["1"]), _vectors(block_size=0), _vectors(algo=None), _vectors(mm=[{"identifier": 1}]),
             _vectors(prompt_embeds={"dtype": "float32", "rows": "xx"}), _vectors(lora=[]), _vectors(block_hashes=None),
             _runs(start=None), _runs(budget=-7), _runs(natural_end=[-1]), _runs(prompt=[2 ** 70]), "\x00" * 1000, "\ufeff[1]"]


def _commands(path: str) -> list[list[str]]:
    return [["hash", "--file", path], ["hash", "--check", path], ["replay", path], ["replay", TRACE, "--expect", path],
            ["check", path, "--adapter", NANO], ["thinking-budget", "--check", path]]


@pytest.mark.parametrize("content", MALFORMED, ids=range(len(MALFORMED)))
def test_fuzz_malformed_files_never_crash_or_pass(tmp_path, capsys, content):
    (tmp_path / "in").write_text(content, encoding="utf-8")
    for argv in _commands(str(tmp_path / "in")):
        status = main(argv + (["--out", str(tmp_path)] if argv[0] == "check" else []))
        out, err = capsys.readouterr()
        assert status in (1, 2) or (status == 0 and argv[0] in ("hash", "replay") and "--expect" not in argv
                                    and "--check" not in argv), (argv, status, err)
        assert status != 2 or err.count("\n") == 1, (argv, err)
        assert "Traceback" not in err


BAD_INTS = ["", "-1", "+1", " 1", "1_0", "1e3", "0x10", "٣", "²", "9" * 5000, "18446744073709551616", "1.5", "nan"]
INT_OPTIONS = [["hash", "1", "--block-size"], ["cudagraph", "--max-num-seqs"], ["cudagraph", "--max-num-batched-tokens"],
               ["cudagraph", "--num-speculative-tokens"], ["cudagraph", "--max-capture-size"], ["cudagraph", "--capture-sizes"],
               ["cudagraph"], ["hash"], ["hash", "1", "--mm"], ["thinking-budget", "--start", "1", "--end"],
               ["thinking-budget", "--start", "1", "--end", "2", "--budget"], ["thinking-budget", "--start", "1", "--end", "2", "--prompt"]]


@pytest.mark.parametrize("prefix", INT_OPTIONS, ids=[" ".join(p) for p in INT_OPTIONS])
def test_fuzz_bad_integers_exit_2(capsys, prefix):
    for text in BAD_INTS:
        if text == "-1" and prefix[-1] in ("--num-speculative-tokens", "--budget"): continue  # -1: the chapter's own checks
        if text == " 1" and prefix[-1] in ("--capture-sizes", "--end", "--prompt"): continue  # lists: spaces separate
        if text == "" and prefix[-1] == "--prompt": continue  # an empty prompt is a prompt
        value = f"img:{text}:2" if prefix[-1] == "--mm" else text
        status = main([*prefix, value] if prefix[-1].startswith("-") else [*prefix, "--", value])
        err = capsys.readouterr().err
        assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, (prefix, text, status, err)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                           lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.sampled_from(
                               ["op", "id", "prompt", "vectors", "cases", "num_blocks", "block_size", "wish", "tokens"]),
                               kids, max_size=4), max_leaves=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(json_values, min_size=1, max_size=3))
def test_fuzz_random_json_never_crashes(tmp_path, capsys, lines):
    path = tmp_path / "in.json"
    for text in ("\n".join(json.dumps(v) for v in lines), json.dumps(lines)):
        path.write_text(text)
        for argv in _commands(str(path)):
            status = main(argv + (["--out", str(tmp_path)] if argv[0] == "check" else []))
            assert status in (0, 1, 2) and "Traceback" not in capsys.readouterr().err


# ---------------------------------------------------------------- a real process: closed pipes and full disks

def _kvref(*argv: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", "import sys; from kvref.cli import main; sys.exit(main())", *argv],
                            env=env, stderr=subprocess.PIPE, text=True, **kw)


def test_closed_pipe_exits_141_quietly(tmp_path):
    (tmp_path / "t.txt").write_text(" ".join(map(str, range(20_000))))
    p = _kvref("hash", "--file", str(tmp_path / "t.txt"), "--block-size", "1", stdout=subprocess.PIPE)
    assert len(p.stdout.readline()) == 65
    p.stdout.close()
    assert p.wait(timeout=120) == 141
    assert p.stderr.read() == ""


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_full_disk_is_one_line_and_exit_2():
    with open("/dev/full", "w") as full:
        p = _kvref("replay", TRACE, stdout=full)
        assert p.wait(timeout=120) == 2
    assert p.stderr.read() == "kvref replay: error: cannot write output: No space left on device\n"


# ---------------------------------------------------------------- convert and sweep (issue 12, new commands)
MOONCAKE_LINE = '{"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [1, 2]}\n'
MALFORMED_MOONCAKE = MALFORMED + [
    "", "\n\n", '{"timestamp": 0}\n', MOONCAKE_LINE.replace("20", "2000"), MOONCAKE_LINE.replace("[1, 2]", "[1, -2]"),
    MOONCAKE_LINE.replace("[1, 2]", "[1, true]"), MOONCAKE_LINE.replace("0,", "true,", 1), MOONCAKE_LINE.replace("2,", "2.0,"),
    MOONCAKE_LINE * 2 + MOONCAKE_LINE.replace('"timestamp": 0', '"timestamp": -1'), "[" + MOONCAKE_LINE + "]",
    MOONCAKE_LINE.replace("[1, 2]", "[1, 18446744073709551616]"), MOONCAKE_LINE.replace("20", "9" * 5000)]


def _mooncake_commands(path: str) -> list[list[str]]:
    return [["convert", path, "--from", "mooncake", "--hash-block-size", "16"],
            ["sweep", path, "--blocks", "8,64", "--block-size", "4", "--hash-block-size", "16", "--jobs", "1"]]


@pytest.mark.parametrize("content", MALFORMED_MOONCAKE, ids=range(len(MALFORMED_MOONCAKE)))
def test_convert_and_sweep_refuse_malformed_traces(tmp_path, capsys, content):
    (tmp_path / "in").write_text(content, encoding="utf-8")
    for argv in _mooncake_commands(str(tmp_path / "in")):
        status = main(argv)
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        if argv[0] == "sweep" or content.strip():  # sweep never reports on nothing; convert of an empty log is a config op
            assert status == 2 and err.count("\n") == 1 and err.startswith("kvref"), (argv, status, err)


@pytest.mark.parametrize("option", ["--hash-block-size", "--block-size", "--num-blocks", "--max-live"])
@pytest.mark.parametrize("value", BAD_INTS + ["0", str(MAX_NUM_BLOCKS + 1) * 2])
def test_convert_bad_integers_exit_2(tmp_path, capsys, option, value):
    (tmp_path / "in").write_text(MOONCAKE_LINE)
    assert main(["convert", str(tmp_path / "in"), "--from", "mooncake", option, value]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err


SWEEP_BAD = [["--blocks", ""], ["--blocks", "8,,64"], ["--blocks", "8,-1"], ["--blocks", "1e3"], ["--blocks", "٣"],
             ["--blocks", str(10 ** 30)], ["--blocks", "8,64", "--ms-per-step", "nan"],
             ["--blocks", "8,64", "--ms-per-step", "-1"], ["--blocks", "8,64", "--ms-per-step", "inf"],
             ["--blocks", "8,64", "--jobs", "0"], ["--blocks", "8,64", "--max-num-seqs", "True"],
             ["--blocks", "2"], ["--blocks", "8", "--format", "xml"], ["--blocks", "8", "--engine", "fast"],
             ["--blocks", "8", "--engine", "arrays", "--scheduling-policy", "priority"],
             ["--blocks", "8", "--engine", "arrays", "--cpu-blocks", "16"]]


@pytest.mark.parametrize("args", SWEEP_BAD, ids=[" ".join(a) for a in SWEEP_BAD])
def test_sweep_bad_arguments_exit_2(tmp_path, capsys, args):
    (tmp_path / "in").write_text(MOONCAKE_LINE)
    status = main(["sweep", str(tmp_path / "in"), "--block-size", "4", "--hash-block-size", "16", "--jobs", "1", *args]
                  if "--jobs" not in args else ["sweep", str(tmp_path / "in"), "--block-size", "4", "--hash-block-size", "16", *args])
    out, err = capsys.readouterr()
    assert status == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, (status, err)


@pytest.mark.parametrize("argv, message", [
    (["convert", "/dev/zero", "--from", "mooncake"], "/dev/zero: line 1 is longer than MOONCAKE_MAX_LINE_BYTES"),
    (["sweep", "/dev/zero", "--blocks", "100"], "/dev/zero: line 1 is longer than MOONCAKE_MAX_LINE_BYTES"),
    (["convert", "{f}/big.jsonl", "--from", "mooncake", "--hash-block-size", str(1 << 20)],
     "input_length 1073741824 is above MAX_SYNTHESIZED_TOKENS"),
])
def test_production_trace_commands_refuse_what_would_exhaust_memory(tmp_path, capsys, argv, message):
    "Issue 32: /dev/zero (one endless line) and a 5 KB line asking 2**30 tokens ran out of memory."
    line = {"timestamp": 0, "input_length": 1 << 30, "output_length": 1, "hash_ids": list(range(1 << 10))}
    (tmp_path / "big.jsonl").write_text(json.dumps(line) + "\n")
    assert main([a.replace("{f}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
