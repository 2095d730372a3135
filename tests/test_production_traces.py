"""Production traces: Mooncake reading and conversion, the serving model's counts (hand-worked), the fast path
against the plain one, the sweep, and bad input."""
import json, signal, sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from kvref.oracle.production_traces import (MooncakeRequest, block_hashes, convert_mooncake, format_results, ideal_hit_rate,
                                     map_grid, mooncake_to_spec, read_mooncake, replay_mooncake, sweep, synthesize_output,
                                     synthesize_prompt)
from kvref.oracle.replay import replay

SAMPLE = Path(__file__).parent.parent / "golden" / "mooncake" / "synthetic-trace-last300.jsonl"


def write(tmp_path, lines, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines))
    return path


def named(seq, names):
    "Trace ids for a sequence of block contents: one id per distinct prefix, as Mooncake's hash ids are."
    return [names.setdefault(tuple(seq[:k + 1]), len(names)) for k in range(len(seq))]


def line(ts=0, n=600, out=2, ids=(3, 4)): return dict(timestamp=ts, input_length=n, output_length=out, hash_ids=list(ids))


# ---- conversion properties ----

@given(st.lists(st.integers(0, 50), min_size=1, max_size=6), st.integers(1, 8), st.data())
def test_same_id_same_tokens_different_ids_never_share_a_block(ids, hbs, data):
    n = data.draw(st.integers((len(ids) - 1) * hbs + 1, len(ids) * hbs))
    toks = synthesize_prompt(ids, n, hbs)
    assert len(toks) == n  # a partial last block gets exactly input_length tokens
    for k, h in enumerate(ids):
        block = toks[k * hbs:(k + 1) * hbs]
        assert block == synthesize_prompt([h], hbs, hbs)[:len(block)]  # the same id always gives the same tokens
    other = data.draw(st.integers(0, 50).filter(lambda h: h not in ids))
    assert not set(toks) & set(synthesize_prompt([other], hbs, hbs))  # different ids share no token
    assert not set(toks) & set(synthesize_output(0, 5))


@given(st.lists(st.tuples(st.lists(st.integers(0, 6), min_size=1, max_size=4), st.integers(0, 3)), min_size=1, max_size=6),
       st.sampled_from([1, 2, 3, 4, 8]))
@settings(deadline=None, max_examples=40)
def test_derived_block_keys_equal_exactly_when_the_synthesized_blocks_and_prefixes_do(shape, bs):
    "Keys from hash ids are equal iff the engine blocks have the same tokens after the same prefix."
    hbs, reqs, names = 8, [], {}
    for ids, cut in shape:
        ids = named(ids, names)
        reqs.append(MooncakeRequest(0, max(1, len(ids) * hbs - cut), 1, ids))
    seen = {}
    for r in reqs:
        toks = synthesize_prompt(r.hash_ids, r.input_length, hbs)
        for j, key in enumerate(block_hashes(r, bs, hbs)):
            prefix = tuple(toks[:(j + 1) * bs])
            assert seen.setdefault(key, prefix) == prefix
    assert len(set(seen.values())) == len(seen)


def test_convert_streams_a_replayable_trace(tmp_path):
    path = write(tmp_path, [line(0, 6, 1, [1, 2]), line(3, 5, 2, [1, 3])])
    ops = list(convert_mooncake(path, block_size=2, num_blocks=16, hash_block_size=4, max_live=1))
    assert [o["op"] for o in ops] == ["config", "add", "schedule", "append", "free", "add", "schedule", "append",
                                      "schedule", "append", "free"]
    assert ops[1]["prompt"] == [4, 5, 6, 7, 8, 9] and ops[5]["prompt"] == [4, 5, 6, 7, 12]
    decisions = replay(ops)
    hits = [d["hit_tokens"] for o, d in zip(ops, decisions) if o["op"] == "schedule"]
    assert hits == [0, 4, 0]
    assert ops[0]["version"] == 2 and not any("free_queue" in d for d in decisions)  # format 2: the queue's changes only


def test_the_reader_streams(tmp_path):
    path = write(tmp_path, [line(0), '{"timestamp": 1, "input_length": 600, "output_length": 2}'])
    reader = read_mooncake(path)
    assert next(reader).hash_ids == [3, 4]  # the first line comes back before the bad one is read
    with pytest.raises(ValueError, match="line 2: field 'hash_ids' is missing"): next(reader)


@pytest.mark.parametrize("bad, message", [
    ('{"timestamp": 0, "input_length": 600, "output_length": 2}', "line 2: field 'hash_ids' is missing"),
    (line(5, -1, 2, []), "line 2: field 'input_length' must be an int >= 0, got -1"),
    (line(5, 600, -2), "line 2: field 'output_length' must be an int >= 0, got -2"),
    (line(5, 600, 2, [3]), "line 2: field 'hash_ids' has 1 ids but input_length 600 needs 2 blocks of 512"),
    (line(5, 600, 2, [3, -4]), "line 2: field 'hash_ids' must be a list of ints >= 0"),
    (line(5, 600, 2, [3, True]), "line 2: field 'hash_ids' must be a list of ints >= 0"),
    (line(5, 600, 2.0), "line 2: field 'output_length' must be an int >= 0"),
    (line(-1), "line 2: field 'timestamp' goes back in time (-1 after 0)"),  # -1 is refused as negative first
    ("[1, 2]", "line 2: expected a JSON object, got list"),
    ("{oops", "line 2: not JSON")])
def test_bad_lines_are_named(tmp_path, bad, message):
    path = write(tmp_path, [line(0), bad])
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) if "back" not in message \
            else pytest.raises(ValueError, match="line 2: field 'timestamp'"):
        list(read_mooncake(path))


def test_a_timestamp_going_back_is_named(tmp_path):
    path = write(tmp_path, [line(10), line(4)])
    with pytest.raises(ValueError, match=r"line 2: field 'timestamp' goes back in time \(4 after 10\)"): list(read_mooncake(path))


# ---- the serving model's counts, hand-worked ----

def test_hits_counted_once_per_admission_last_token_recomputed_full_blocks_only():
    # A: ids [1, 2], 14 tokens; B shares trace block 1 (8 tokens = 2 blocks of 4); C repeats A: 13 tokens could
    # hit but only 12 (3 full blocks, the last token recomputed)
    hand = [MooncakeRequest(0, 14, 2, [1, 2], 1), MooncakeRequest(0, 12, 2, [1, 3], 2), MooncakeRequest(1, 14, 2, [1, 2], 3)]
    r = replay_mooncake(hand, num_blocks=64, block_size=4, max_num_batched_tokens=32, hash_block_size=8)
    assert (r.queries, r.hits, r.preempted_queries, r.preemptions, r.evictions) == (40, 20, 0, 0, 0)
    assert r.computed_tokens == 20 and r.hit_rate == 0.5


def test_a_refused_head_of_queue_is_counted_once():
    # 5 usable blocks of 4: A (16 tokens, 4 blocks, then a 5th to decode) runs; B (8 tokens) is refused at the head of the
    # queue for several steps, then admitted once: queries are 16 + 8, not 16 + 8 * tries
    reqs = [MooncakeRequest(0, 16, 2, [1, 2], 1), MooncakeRequest(0, 8, 1, [3], 2)]
    r = replay_mooncake(reqs, num_blocks=6, block_size=4, max_num_batched_tokens=64, hash_block_size=8)
    assert (r.queries, r.hits, r.preemptions) == (24, 0, 0)


def test_preempted_requests_are_counted_apart():
    # two requests of 8 tokens decoding 6 each on 5 usable blocks: the later one is preempted and re-admitted,
    # and its re-admission (8 + its outputs so far) goes to preempted_queries, its own cached blocks to preempted_hits
    reqs = [MooncakeRequest(0, 8, 6, [1], 1), MooncakeRequest(0, 8, 6, [2], 2)]
    r = replay_mooncake(reqs, num_blocks=6, block_size=4, max_num_batched_tokens=32, hash_block_size=8)
    assert r.preemptions == 1 and (r.queries, r.hits) == (16, 0)
    assert r.preempted_queries > 8 and r.preempted_hits % 4 == 0 and r.preempted_hits <= r.preempted_queries - 1
    assert r.recomputed_tokens == r.preempted_queries - r.preempted_hits
    assert r.computed_tokens == r.queries - r.hits + r.recomputed_tokens


@given(st.lists(st.tuples(st.lists(st.integers(0, 4), min_size=1, max_size=3), st.integers(0, 7), st.integers(0, 4)),
                min_size=1, max_size=6),
       st.sampled_from([2, 4]), st.integers(0, 12), st.integers(4, 24), st.sampled_from([None, 1.0, 3.0]))
@settings(deadline=None, max_examples=40)
def test_the_fast_path_equals_full_tokens_hashed_by_the_manager(shape, bs, extra, budget, ms):
    reqs, ts, names = [], 0, {}
    for i, (ids, cut, out) in enumerate(shape):
        ids = named(ids, names)
        reqs.append(MooncakeRequest(ts, max(1, len(ids) * 8 - cut), out, ids, i + 1)); ts += i % 3
    need = max(-(-(r.input_length + max(1, r.output_length)) // bs) for r in reqs)
    n = need + 1 + extra
    fast = replay_mooncake(reqs, n, bs, budget, max_num_seqs=3, ms_per_step=ms, hash_block_size=8)
    assert replay_mooncake(reqs, n, bs, budget, max_num_seqs=3, ms_per_step=ms, hash_block_size=8, fast=False) == fast


def test_the_sample_sweep_in_parallel_equals_one_at_a_time():
    reqs = list(read_mooncake(SAMPLE))[:40]
    sizes = [8000, 30000]
    par = sweep(reqs, sizes, jobs=2)
    assert par == sweep(reqs, sizes, jobs=1) == [replay_mooncake(reqs, n) for n in sizes]
    assert par[0].hit_rate <= par[1].hit_rate <= ideal_hit_rate(reqs) + 1e-9
    assert format_results(par, "csv").splitlines()[0].startswith("num_blocks,hit_rate,queries")


def _sigterm_action(_) -> object:
    return signal.getsignal(signal.SIGTERM)


def test_local_workers_die_by_sigterm_whatever_handler_this_process_has():
    """`map_grid`'s pool ends with `terminate`, one SIGTERM per worker: a worker that inherited a Python handler (Ray's
    `sys.exit`, a service's) could swallow it and be joined forever, so each worker starts with the default action."""
    before = signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # as Ray's: a worker that kept it ends, at times
    try: assert list(map_grid(_sigterm_action, [0, 1, 2], int, (), jobs=2)) == [signal.SIG_DFL] * 3
    finally: signal.signal(signal.SIGTERM, before)


def test_a_pool_too_small_for_the_longest_request_is_refused_like_vllm():
    reqs = [MooncakeRequest(0, 100, 1, [1], 7)]
    with pytest.raises(ValueError, match=r"num_blocks=7 cannot hold line 7 \(101 tokens need 7 blocks of 16"):
        replay_mooncake(reqs, 7)
    with pytest.raises(ValueError, match="num_blocks=7 cannot hold line 7"): sweep(reqs, [100, 7])
    with pytest.raises(ValueError, match="the trace has no requests"): replay_mooncake([], 100)


def test_the_sweep_defaults_are_a_default_vllm_and_the_table_says_so(capsys):
    """On the shipped sample at 12,500 blocks a default vLLM 0.33 (its own Scheduler, bench/sweep_vs_vllm.py) admits
    with the full-prompt gate: hit rate 0.1421, 0 preemptions, 1,329 steps; with the gate off 68 preemptions."""
    from kvref.cli import main
    reqs = list(read_mooncake(SAMPLE))
    default, no_gate = replay_mooncake(reqs, 12_500), replay_mooncake(reqs, 12_500, scheduler_reserve_full_isl=False)
    assert (default.hits, default.queries, default.preemptions, default.num_steps) == (974416, 6859548, 0, 1329)
    assert no_gate.preemptions == 68 and "scheduler_reserve_full_isl=False" in no_gate.settings
    asynchronous = replay_mooncake(reqs, 12_500, async_scheduling=True)  # vLLM's AsyncScheduler: 974,336 hits, 1,361 calls
    assert (asynchronous.hits, asynchronous.preemptions, asynchronous.num_steps) == (974336, 0, 1361)
    assert main(["sweep", str(SAMPLE), "--blocks", "12500", "--no-scheduler-reserve-full-isl", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("scheduler: max_num_batched_tokens=8192, max_num_seqs=256, policy=fcfs") and "| 68 |" in out
    assert main(["sweep", str(SAMPLE), "--blocks", "12500", "--scheduling-policy", "lifo"]) == 2


def test_sweep_svg_draws_the_hit_rates_and_the_ceiling():
    "The chapter's curve: one hit rate per size on a log x axis, the infinite-cache rate as a flat line, text >= 11 px."
    pytest.importorskip("matplotlib")
    import re
    from kvref.oracle.production_traces import sweep_svg
    from kvref.pictures import chart_svg
    hand = [MooncakeRequest(0, 14, 2, [1, 2], 1), MooncakeRequest(0, 12, 2, [1, 3], 2), MooncakeRequest(1, 14, 2, [1, 2], 3)]
    results = sweep(hand, [6, 64], block_size=4, max_num_batched_tokens=32, hash_block_size=8, jobs=1)
    svg = sweep_svg(results, 0.5, "hand")
    assert svg == chart_svg({"hit rate": [r.hit_rate for r in results], "infinite cache": [0.5, 0.5]}, [6, 64], title="hand",
                            xlabel="cache size (blocks)", ylabel="prefix-cache hit rate", logx=True)
    texts = re.findall(r"<text[^>]*>([^<]*)", svg)
    assert {"6", "64", "hit rate", "infinite cache", "hand", "cache size (blocks)"} <= set(texts)
    assert min(float(px) for px in re.findall(r"font-size: ([\d.]+)px", svg)) >= 11


def test_plot_sweep_writes_png_and_svg_and_leaves_matplotlib_settings_alone(tmp_path):
    "`kvref sweep --plot OUT`'s files; its larger text is set for its own figure only."
    matplotlib = pytest.importorskip("matplotlib")
    from kvref.oracle.production_traces import plot_sweep
    hand = [MooncakeRequest(0, 14, 2, [1, 2], 1), MooncakeRequest(0, 12, 2, [1, 3], 2)]
    results = sweep(hand, [6, 64], block_size=4, max_num_batched_tokens=32, hash_block_size=8, jobs=1)
    before = matplotlib.rcParams["font.size"]
    paths = plot_sweep(results, 0.5, tmp_path / "curve", "hand")
    assert [p.name for p in paths] == ["curve.png", "curve.svg"] and all(p.stat().st_size > 1000 for p in paths)
    assert matplotlib.rcParams["font.size"] == before


def test_without_chunked_prefill_a_request_longer_than_the_budget_is_refused_not_waited_for_forever():
    "vLLM refuses to start below max_model_len without chunked prefill; the replays ran such a request's admission forever."
    from kvref.kv_offload import replay_offload
    from kvref.oracle.array_replay import replay_arrays, sweep_arrays
    reqs = list(read_mooncake(Path(__file__).resolve().parents[1] / "golden/mooncake/synthetic-trace-last300.jsonl"))[:5]
    words = r"max_num_batched_tokens=8192 cannot hold line 2 \(39146 tokens\) without chunked prefill"
    for run in (lambda: replay_mooncake(reqs, 20_000, enable_chunked_prefill=False),
                lambda: replay_arrays(reqs, 20_000, enable_chunked_prefill=False),
                lambda: sweep(reqs, [20_000], jobs=1, enable_chunked_prefill=False),
                lambda: sweep_arrays(reqs, [20_000], jobs=1, enable_chunked_prefill=False),
                lambda: replay_offload(reqs, 20_000, 1_000, enable_chunked_prefill=False)):
        with pytest.raises(ValueError, match=words): run()
    assert replay_mooncake(reqs, 20_000, max_num_batched_tokens=39_146, enable_chunked_prefill=False).num_steps > 0  # just holds it
