"""Hybrid traces on the command line (issue 16): `kvref check` against recorded decisions and against an engine's
hybrid adapter, `kvref replay --stats` and `--svg`, on every shared hybrid trace; the hybrid adapter protocol."""
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvref.cli import main
from kvref.oracle.conformance import check, check_recorded, shrink
from kvref.oracle.hybrid_replay import (HybridTraceDriver, HybridTraceReplayer, KVRefHybridAdapter, hybrid_replay_stats,
                                 load_hybrid_trace, write_hybrid_svgs)
from kvref.oracle.replay import load_decisions

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT / "golden" / "hybrid"  # the shared recordings (top level, mamba/) and vllm-diff/, runs vLLM once decided otherwise
TRACES = sorted(p for d in ("", "mamba/", "vllm-diff/") for p in SHARED.glob(f"{d}*.jsonl") if not p.name.endswith(".vllm.jsonl"))
ADAPTER = "kvref.oracle.hybrid_replay:KVRefHybridAdapter"


def recorded(trace: Path) -> Path:
    return trace.with_name(trace.name.replace(".jsonl", ".vllm.jsonl"))


def test_every_shared_hybrid_trace_is_here():
    assert len(TRACES) == 15 and all(recorded(t).exists() for t in TRACES)


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_check_passes_on_recorded_decisions(trace, capsys):
    assert main(["check", str(trace), "--expect", str(recorded(trace))]) == 0
    assert capsys.readouterr().out == f"{trace}: conforms ({len(load_hybrid_trace(trace))} ops)\n"


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_check_passes_with_kvrefs_hybrid_adapter(trace, tmp_path, capsys):
    assert main(["check", "--adapter", ADAPTER, "--out", str(tmp_path), str(trace)]) == 0
    assert "conforms" in capsys.readouterr().out and not list(tmp_path.iterdir())


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_driver_through_the_protocol_reproduces_vllm(trace):
    driver = HybridTraceDriver(KVRefHybridAdapter)
    assert [driver.apply(op) for op in load_hybrid_trace(trace)] == load_decisions(recorded(trace))


def _alter(decisions: list[dict]) -> tuple[int, int]:
    "Change one block of the last group's table in the middle schedule that allocated; (op index, group)."
    schedules = [i for i, d in enumerate(decisions) if d["op"] == "schedule" and d["allocated"] and d["block_ids"][-1]]
    n = schedules[len(schedules) // 2]
    table = decisions[n]["block_ids"][-1]
    table[-1] += 1000
    return n, len(decisions[n]["block_ids"]) - 1


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_check_fails_at_the_altered_decision(trace, tmp_path, capsys):
    decisions = load_decisions(recorded(trace))
    n, group = _alter(decisions)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(d) + "\n" for d in decisions))
    assert main(["check", str(trace), "--expect", str(tmp_path / "d.jsonl")]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{trace}: diverged at op {n} (line {n + 1} of the trace): ")
    kind = load_hybrid_trace(trace)[0]["groups"][group]["kind"]
    assert f"  block_ids:\n    group {group} ({kind}):\n      expected " in out
    assert out.count("    group ") == 1  # only the group that differs


@pytest.mark.parametrize("trace", TRACES[:2], ids=lambda p: p.stem)
def test_check_names_decisions_that_run_short_or_long(trace, tmp_path, capsys):
    decisions = load_decisions(recorded(trace))
    (tmp_path / "long.jsonl").write_text("".join(json.dumps(d) + "\n" for d in decisions + decisions[-1:]))
    assert main(["check", str(trace), "--expect", str(tmp_path / "long.jsonl")]) == 1
    assert f"op {len(decisions)} (line {len(decisions) + 1} of the trace): the trace ended" in capsys.readouterr().out
    assert check_recorded(decisions[:-1], trace).index == len(decisions) - 1


KEEPS_WINDOW = """
from kvref.oracle.hybrid_replay import KVRefHybridAdapter

class KeepsWindow(KVRefHybridAdapter):
    "Never gives back the blocks that slid out of a sliding window (a planted bug)."
    def __init__(self, config):
        super().__init__(config)
        for m in self.manager.coordinator.single_type_managers:
            m.remove_skipped_blocks = lambda request_id, num_computed_tokens: None
"""
exec(KEEPS_WINDOW)


class NoSteps(KVRefHybridAdapter):
    "Raises at every step boundary."
    def new_step(self): raise NotImplementedError("steps are not wired up yet")


def test_a_broken_engine_diverges_group_by_group_and_shrinks(tmp_path, capsys):
    (tmp_path / "window_engine.py").write_text(KEEPS_WINDOW)
    trace = ROOT / "golden" / "hybrid" / "hybrid-gpt-oss-11-1.jsonl"
    d = check(KeepsWindow, trace)
    assert (d.index, d.fields) == (25, ["block_ids", "free_queue", "num_free"])
    assert main(["check", "--adapter", f"{tmp_path / 'window_engine.py'}:KeepsWindow", "--out", str(tmp_path), str(trace)]) == 1
    out = capsys.readouterr().out
    assert "diverged at op 25 (line 26 of the trace)" in out and "group 0 (sliding_window):" in out
    assert "group 1" not in d.report()  # only the groups that differ (the minimal trace's own report shows both)
    minimal = load_hybrid_trace(tmp_path / "hybrid-gpt-oss-11-1.min.jsonl")
    assert len(minimal) < 26 and check(KeepsWindow, minimal).fields == d.fields
    assert minimal == shrink(KeepsWindow, trace)


def test_an_adapter_that_raises_is_named_at_its_op():
    trace = ROOT / "golden" / "hybrid" / "mamba" / "hybrid-qwen3-next-9-1.jsonl"
    d = check(NoSteps, trace)
    first_step = next(i for i, op in enumerate(load_hybrid_trace(trace)) if op["op"] == "new_step")
    assert d.index == first_step and d.error.splitlines()[-1] == "NotImplementedError: steps are not wired up yet"
    assert d.report().startswith(f"the adapter raised at op {first_step} ")


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_stats_on_every_hybrid_trace(trace, capsys):
    assert main(["replay", str(trace), "--stats"]) == 0
    out = capsys.readouterr().out
    ops = load_hybrid_trace(trace)
    groups = ops[0]["groups"]
    assert f"| ops | {len(ops)} |" in out
    for g, group in enumerate(groups): assert f"| {g} | {group['kind']} | {group['block_size']} | " in out
    s = hybrid_replay_stats(ops)
    assert s.num_ops == len(ops) and s.refusals == sum(d["op"] == "schedule" and not d["allocated"]
                                                       for d in load_decisions(recorded(trace)))
    replayer = HybridTraceReplayer()
    for op in ops: replayer.apply(op)
    for g, gs in enumerate(s.groups):  # every block that joined a table left it or is held at the end
        held = sum(sum(b != 0 for b in replayer.manager.get_block_ids(r)[g]) for r in replayer.requests)
        assert gs.hit_blocks + gs.new_blocks - gs.freed_blocks == held
        assert gs.evicted_blocks <= gs.cached_blocks and gs.peak_blocks <= s.peak_blocks_used
        if groups[g]["kind"] == "full": assert gs.null_slots == 0


def test_stats_count_what_the_decisions_show():
    "Null slots and hits, counted by hand from vLLM's recorded tables of the gpt-oss-like trace."
    trace = ROOT / "golden" / "hybrid" / "hybrid-gpt-oss-11-1.jsonl"
    ops, decisions = load_hybrid_trace(trace), load_decisions(recorded(trace))
    tables, nulls, hits = {}, [0, 0], [0, 0]
    for op, d in zip(ops, decisions):
        if op["op"] in ("free", "preempt"): tables.pop(op["id"], None)
        if op["op"] != "schedule": continue
        old = tables.get(op["id"], [[], []])
        for g, new in enumerate(d["block_ids"]):
            nulls[g] += sum(b == 0 and (i >= len(old[g]) or old[g][i] != 0) for i, b in enumerate(new))
            if d["allocated"]: hits[g] += sum(b != 0 for b in new[:d["hit_tokens"] // 2] if b not in old[g])
        tables[op["id"]] = d["block_ids"]
    s = hybrid_replay_stats(ops)
    assert [g.null_slots for g in s.groups] == nulls and [g.hit_blocks for g in s.groups] == hits
    assert nulls[0] > 0 and nulls[1] == 0



@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_stats_count_lookups_of_waiting_requests_only(trace):
    "Lookups, queried and hit tokens, counted by hand from the ops and vLLM's recorded decisions: a running request is not looked up."
    ops, decisions = load_hybrid_trace(trace), load_decisions(recorded(trace))
    tokens, computed, lookups, queried, hit, allocated = {}, {}, 0, 0, 0, 0
    for op, d in zip(ops, decisions):
        rid = op.get("id")
        if op["op"] == "add": tokens[rid], computed[rid] = len(op["prompt"]), 0
        elif op["op"] == "append": tokens[rid] += len(op["tokens"])
        elif op["op"] == "preempt": computed[rid] = 0
        elif op["op"] == "schedule" and d["allocated"]:
            allocated += 1
            if computed[rid] == 0: lookups += 1; queried += tokens[rid]; hit += d["hit_tokens"]
            computed[rid] += d["hit_tokens"] + d["num_new_tokens"]
    s = hybrid_replay_stats(ops)
    assert (s.lookups, s.queried_tokens, s.hit_tokens) == (lookups, queried, hit)
    assert 0 < lookups < allocated  # the trace schedules running requests too

@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_svg_on_every_hybrid_trace(trace, tmp_path, capsys):
    assert main(["replay", str(trace), "--svg", str(tmp_path / "pictures")]) == 0
    ops = load_hybrid_trace(trace)
    assert capsys.readouterr().out == f"kvref replay: wrote {len(ops)} pictures to {tmp_path / 'pictures'}\n"
    pictures = sorted((tmp_path / "pictures").iterdir())
    assert [p.name for p in pictures] == [f"step-{i:04d}.svg" for i in range(len(ops))]
    for p in pictures: ET.fromstring(p.read_text())  # well-formed
    greys = sum(p.read_text().count('fill="#ddd"') for p in pictures)
    assert (greys > 0) == any(g["kind"] != "full" for g in ops[0]["groups"])  # null blocks are drawn


def test_svg_names_the_op_and_each_group():
    trace = ROOT / "golden" / "hybrid" / "hybrid-sw-chunked-11-5.jsonl"
    ops = load_hybrid_trace(trace)
    n = next(i for i, op in enumerate(ops) if op["op"] == "schedule")
    import tempfile
    text = write_hybrid_svgs(ops[:n + 1], tempfile.mkdtemp())[n].read_text()
    assert f"op {n}: schedule {ops[n]['id']}" in text
    for g, kind in enumerate(["SlidingWindow", "ChunkedLocalAttention", "FullAttention"]): assert f"{kind} {g}" in text


def test_svg_draws_every_live_request():
    trace = ROOT / "golden" / "hybrid" / "hybrid-gpt-oss-11-1.jsonl"
    ops, replayer = load_hybrid_trace(trace), HybridTraceReplayer()
    import tempfile
    pictures = write_hybrid_svgs(ops, tempfile.mkdtemp())
    most = 0
    for op, picture in zip(ops, pictures):
        replayer.apply(op)
        live = [r for r in replayer.requests if any(replayer.manager.get_block_ids(r))]
        text, most = picture.read_text(), max(most, len(live))
        assert all(f">{r} · Sliding" in text and f">{r} · FullAttention 1<" in text for r in live), op
    assert most >= 2


def test_replay_expect_reports_group_detail(tmp_path, capsys):
    trace = ROOT / "golden" / "hybrid" / "hybrid-two-windows-11-4.jsonl"
    decisions = load_decisions(recorded(trace))
    n, group = _alter(decisions)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(d) + "\n" for d in decisions))
    assert main(["replay", str(trace), "--expect", str(tmp_path / "d.jsonl")]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"diverged at op {n} (line {n + 1} of the trace)") and f"    group {group} (full):" in out
