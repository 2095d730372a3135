"""The trace generator (chapter 06g): deterministic, valid Mooncake JSONL, the source's shape within stated
tolerances, memory that does not grow with the trace, arguments refused by name, and the `kvref gen-trace` command."""
import json
import tracemalloc
from dataclasses import asdict, replace
from itertools import islice
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from kvref import cli
from kvref.oracle import trace_generator as tg
from kvref.oracle.production_traces import MooncakeRequest, ideal_hit_rate, read_mooncake
from kvref.oracle.trace_generator import (TraceShape, default_shape, generate_trace, load_shape, prefix_relations,
                                          save_shape, trace_shape, write_mooncake)

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "mooncake"
SOURCE = GOLDEN / "synthetic_trace.jsonl"
DRAWN = 20_000
SHAPE = default_shape()  # measured once for the module (a fifth of a second each time)

# Tolerances for a 20,000-request trace drawn from the shipped trace's shape. Measured (seed 1): KS distance 0.027 for
# prompt lengths, 0.012 for output lengths, 0.005 for gaps; turn share 0.316 vs 0.334; ideal hit rate 0.625 vs 0.650
# (a 100,000-request trace comes within 0.5 points: a short trace is cut at both ends, as its source was).
KS_DRAWN = 0.03  # distributions drawn directly (output lengths, gaps): the largest gap between the two CDFs
KS_PROMPTS = 0.05  # prompt lengths, which come out of conversations growing turn by turn
SHARE_POINTS = 0.05  # turn share, shared-token share, ideal hit rate
HIT_BLOCK = 512  # `ideal_hit_rate`'s block size here: the hash block (16 gives the source 0.6512 for 0.6504, 30x slower)


@pytest.fixture(scope="module")
def source():
    return list(read_mooncake(SOURCE))


@pytest.fixture(scope="module")
def drawn():
    return list(generate_trace(DRAWN, SHAPE, seed=1))


def ks(a: list[int], b: list[int]) -> float:
    "The Kolmogorov-Smirnov distance between two samples: the largest gap between their empirical CDFs."
    a, b, i, j, gap = sorted(a), sorted(b), 0, 0, 0.0
    for v in sorted(set(a) | set(b)):
        while i < len(a) and a[i] <= v: i += 1
        while j < len(b) and b[j] <= v: j += 1
        gap = max(gap, abs(i / len(a) - j / len(b)))
    return gap


def mismatches(source: list[MooncakeRequest], drawn: list[MooncakeRequest]) -> list[str]:
    "How `drawn`'s shape differs from `source`'s beyond the tolerances above (empty: the same shape)."
    s, d, out = trace_shape(source), trace_shape(drawn), []
    gaps = lambda t: [b.timestamp - a.timestamp for a, b in zip(t, t[1:])]
    for name, get, tol in (("input_length", lambda t: [r.input_length for r in t], KS_PROMPTS),
                           ("output_length", lambda t: [r.output_length for r in t], KS_DRAWN),
                           ("interarrival_ms", gaps, KS_DRAWN)):
        if (gap := ks(get(source), get(drawn))) > tol: out.append(f"{name}: KS distance {gap:.3f} > {tol}")
    for name, a, b in (("turn_share", s.turn_share, d.turn_share),
                       ("shared_token_share", s.shared_token_share, d.shared_token_share),
                       ("ideal_hit_rate", ideal_hit_rate(source, HIT_BLOCK), ideal_hit_rate(drawn, HIT_BLOCK))):
        if abs(a - b) > SHARE_POINTS: out.append(f"{name}: {b:.3f} drawn vs {a:.3f} in the source")
    return out


def test_a_drawn_trace_has_its_sources_shape(source, drawn):
    assert mismatches(source, drawn) == []


def test_a_planted_bug_is_caught(source, monkeypatch):
    "A generator whose turns share nothing with the turn before (no prefix sharing) fails the shape check."
    monkeypatch.setattr(tg, "next_turn", lambda shape, length, ids, rng: (tg.draw(shape.opening_length, rng), []))
    found = mismatches(source, list(generate_trace(DRAWN, SHAPE, seed=1)))
    assert any(m.startswith("ideal_hit_rate") for m in found) and any(m.startswith("turn_share") for m in found), found


def test_a_generator_without_branches_is_caught(source):
    "Conversations that never open on an earlier prompt's blocks (no shared documents) lose 17 points of hit rate."
    found = mismatches(source, list(generate_trace(DRAWN, replace(SHAPE, branch_share=0.0), seed=1)))
    assert any(m.startswith("ideal_hit_rate") for m in found), found


def test_the_same_seed_draws_the_same_trace():
    assert list(generate_trace(2000, SHAPE, seed=5)) == list(generate_trace(2000, SHAPE, seed=5))
    assert list(generate_trace(2000, SHAPE, seed=5)) != list(generate_trace(2000, SHAPE, seed=6))


def test_a_shorter_trace_is_the_start_of_a_longer_one():
    "The generator streams: the first m requests of n do not depend on n."
    assert list(generate_trace(500, SHAPE, seed=3)) == list(islice(generate_trace(5000, SHAPE, seed=3), 500))


def test_written_traces_read_back_valid(tmp_path):
    path = tmp_path / "drawn.jsonl"
    assert write_mooncake(generate_trace(5000, SHAPE, seed=2), path) == 5000
    back = list(read_mooncake(path))  # checks every field, the ids' cover, nondecreasing timestamps
    assert back == list(generate_trace(5000, SHAPE, seed=2))
    assert all(len(r.hash_ids) == -(-r.input_length // 512) for r in back)
    assert all(a.timestamp <= b.timestamp for a, b in zip(back, back[1:]))
    assert path.read_text().splitlines()[0].startswith('{"timestamp": 0, "input_length": ')


def test_turns_extend_and_ids_mean_prefixes(drawn):
    "Equal ids mean equal prefixes: an id sits at one position, always after the same id."
    parent = {}
    for r in drawn:
        for k, h in enumerate(r.hash_ids):
            assert parent.setdefault(h, (k, r.hash_ids[k - 1] if k else None)) == (k, r.hash_ids[k - 1] if k else None)


def test_the_default_shape_is_the_shipped_traces():
    stored = SHAPE
    assert list(generate_trace(300)) == list(generate_trace(300, SHAPE))  # no shape: this one
    assert (stored.requests, round(stored.turn_share, 4), round(stored.shared_token_share, 4)) == (3993, 0.3338, 0.6512)
    assert len(stored.input_length) == tg.QUANTILE_POINTS and stored.max_input_length == 191378


def test_a_shape_saved_loads_the_same(tmp_path):
    assert load_shape(save_shape(SHAPE, tmp_path / "shape.json")) == SHAPE
    (tmp_path / "extra.json").write_text(json.dumps({**asdict(SHAPE), "colour": "red"}))
    with pytest.raises(ValueError, match="path must be a TraceShape saved by save_shape"): load_shape(tmp_path / "extra.json")


def test_writing_refuses_what_is_not_a_request(tmp_path):
    with pytest.raises(TypeError, match=r"requests\[1\] must be a MooncakeRequest"):
        write_mooncake([MooncakeRequest(0, 1, 1, [0]), "x"], tmp_path / "t.jsonl")


def test_memory_does_not_grow_with_the_trace():
    "Peak memory drawing 24,000 requests is about that of 6,000: the state is the live conversations, not the trace."
    def peak(n):
        tracemalloc.start()
        for _ in generate_trace(n, SHAPE, seed=4): pass
        top = tracemalloc.get_traced_memory()[1]; tracemalloc.stop()
        return top
    small, large = peak(6_000), peak(24_000)
    assert large < 1.3 * small, (small, large)


def test_the_worked_example():
    M = MooncakeRequest
    example = [M(0, 1300, 40, [0, 1, 2]), M(100, 1100, 25, [0, 3, 4]), M(250, 1800, 60, [0, 1, 5, 6]),
               M(300, 1030, 10, [7, 8, 9]), M(420, 1600, 30, [0, 3, 10, 11]), M(600, 1500, 20, [7, 8, 12])]
    assert [tuple(r) for r in prefix_relations(example)] == [("fresh", 0, 0, 1300), ("branch", 1, 1, 588),
        ("turn", 2, 2, 776), ("fresh", 0, 0, 1030), ("turn", 3, 2, 576), ("turn", 2, 2, 476)]
    assert trace_shape(example).turns == [2] * tg.QUANTILE_POINTS


@pytest.mark.parametrize("call, error, message", [
    (lambda: generate_trace(0, SHAPE), ValueError, "n must be an int >= 1 and <= 4294967296, got 0"),
    (lambda: generate_trace(1 << 40, SHAPE), ValueError, "n must be an int >= 1"),
    (lambda: generate_trace("5", SHAPE), TypeError, "n must be an int"),
    (lambda: generate_trace(5, SHAPE, seed=-1), ValueError, "seed must be an int >= 0, got -1"),
    (lambda: generate_trace(5, SHAPE, seed=1.5), TypeError, "seed must be an int"),
    (lambda: generate_trace(5, shape={"turns": [1]}), TypeError, "shape must be"),
    (lambda: trace_shape([]), ValueError, "requests must be at least two requests"),
    (lambda: trace_shape(generate_trace(1, SHAPE)), ValueError, "requests must be at least two requests (a gap between arrivals)"),
    (lambda: replace(SHAPE, turn_share=1.5), ValueError, "turn_share must be a fraction from 0 to 1"),
    (lambda: replace(SHAPE, branch_share="x"), TypeError, "branch_share must be a fraction from 0 to 1"),
    (lambda: replace(SHAPE, turns=[]), ValueError, "turns must be a non-empty table"),
    (lambda: replace(SHAPE, output_length=[1, -2]), ValueError, "output_length[1] must be an int >= 0"),
    (lambda: replace(SHAPE, single_length=[], opening_length=[]), ValueError, "single_length must be a non-empty"),
    (lambda: replace(SHAPE, branch_back=[]), ValueError, "branch_back must be non-empty tables"),
    (lambda: replace(SHAPE, hash_block_size=0), ValueError, "hash_block_size must be an int >= 1"),
    (lambda: trace_shape(None), TypeError, "requests must be an iterable of MooncakeRequest, got None"),
    (lambda: trace_shape([MooncakeRequest(0, 1, 1, [0]), {"timestamp": 1}]), TypeError, "requests[1] must be a MooncakeRequest"),
    (lambda: trace_shape(generate_trace(5, SHAPE), hash_block_size=0), ValueError, "hash_block_size must be an int >= 1"),
    (lambda: write_mooncake([MooncakeRequest(0, 1, 1, [0])], 5), TypeError, "path must be a str or Path, got 5"),
    (lambda: save_shape({"turns": [1]}, "shape.json"), TypeError, "shape must be a TraceShape"),
    (lambda: load_shape(SOURCE), ValueError, "path must be a TraceShape saved by save_shape"),
])
def test_bad_arguments_are_refused_by_name(call, error, message):
    with pytest.raises(error) as e: call()
    assert message in str(e.value)


def test_gen_trace_command(tmp_path, capsys):
    out, again = tmp_path / "t.jsonl", tmp_path / "u.jsonl"
    assert cli.main(["gen-trace", str(out), "--requests", "1000", "--seed", "9"]) == 0
    assert capsys.readouterr().out == f"{out}: 1000 requests with the shape of the shipped Mooncake synthetic trace (seed 9)\n"
    assert list(read_mooncake(out)) == list(generate_trace(1000, seed=9))
    assert cli.main(["gen-trace", str(again), "--requests", "50", "--like", str(out)]) == 0
    assert sum(1 for _ in read_mooncake(again)) == 50


@pytest.mark.parametrize("argv, message", [
    (["--requests", "0"], "argument --requests: invalid int value: '0'"),
    (["--requests", "5", "--seed", "-1"], "argument --seed: invalid int value: '-1'"),
    (["--requests", "5", "--like", "/no/such/trace.jsonl"], "/no/such/trace.jsonl: No such file or directory"),
    ([], "the following arguments are required: --requests"),
])
def test_gen_trace_refuses_bad_input_in_one_line(tmp_path, capsys, argv, message):
    assert cli.main(["gen-trace", str(tmp_path / "t.jsonl"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvref gen-trace: error: ") and message in err and err.count("\n") == 1, err


def test_gen_trace_refuses_an_output_folder_that_does_not_exist(tmp_path, capsys):
    assert cli.main(["gen-trace", str(tmp_path / "no" / "t.jsonl"), "--requests", "5"]) == 2
    assert capsys.readouterr().err == f"kvref gen-trace: error: {tmp_path}/no/t.jsonl: no folder {tmp_path}/no\n"


def test_gen_trace_refuses_an_empty_like_trace(tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    assert cli.main(["gen-trace", str(tmp_path / "t.jsonl"), "--requests", "5", "--like", str(tmp_path / "empty.jsonl")]) == 2
    assert "requests must be at least two requests" in capsys.readouterr().err


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 60), seed=st.integers(0, 1 << 32), m=st.integers(1, 200))
def test_any_measured_shape_draws_valid_traces(n, seed, m):
    "A shape measured from any short trace (two requests, no turns, no branches) draws valid requests again."
    shape = trace_shape(generate_trace(n, SHAPE, seed))
    drawn = list(generate_trace(m, shape, seed))
    assert all(len(r.hash_ids) == -(-r.input_length // 512) and r.input_length <= shape.max_input_length for r in drawn)
    assert all(a.timestamp <= b.timestamp for a, b in zip(drawn, drawn[1:]))
