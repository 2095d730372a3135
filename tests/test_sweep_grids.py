"""Sweep grids (chapter 06h): every row is the single-point replay of its point (06c's `replay_mooncake`, 06d's
`offload_sweep`), rows come in grid order, the table gains trace and settings columns only where they vary (one trace
and one point print 06c's table byte for byte), and `kvref sweep` refuses a bad grid in one line before anything runs.
The Ray runs are in test_sweep_ray.py (they share its loopback cluster)."""
import contextlib, io, itertools, json, re
from pathlib import Path
import pytest
from kvref.cli import sweep_main
from kvref.kv_offload import format_offload_results, offload_sweep
from kvref.oracle import sweep_grids
from kvref.oracle.production_traces import format_results, read_mooncake, replay_mooncake, sweep
from kvref.oracle.sweep_grids import GridRow, format_grid, grid_points, grid_svg, sweep_grid, vllm_refusal
from kvref.oracle.trace_generator import generate_trace, write_mooncake

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "golden/mooncake/synthetic-trace-last300.jsonl"
TINY = list(read_mooncake(SAMPLE))[:30]
DRAWN = list(generate_trace(30, seed=1))
TRACES = {"tiny": TINY, "drawn": DRAWN}
SIZES = [16_000, 4_000]  # not in order: rows keep the order of `blocks`


def _labels(rows):
    return [(r.point.trace, r.point.settings, r.point.gpu_blocks) for r in rows]


def test_rows_are_the_single_point_replays_in_grid_order():
    grid = {"max_num_seqs": [4, 256], "max_num_batched_tokens": [2048, 8192]}
    rows = sweep_grid(TRACES, SIZES, grid, jobs=2)
    assert _labels(rows) == [(t, {"max_num_seqs": s, "max_num_batched_tokens": b}, g)
                             for t in TRACES for s in (4, 256) for b in (2048, 8192) for g in SIZES]
    for r in rows:
        assert r.point.engine == "arrays"
        assert r.result == replay_mooncake(TRACES[r.point.trace], r.point.gpu_blocks, **r.point.settings), r.point
    assert len({r.result.hit_rate for r in rows}) > 4  # the settings matter on this trace: a mislabel shows


def test_a_block_of_rows_is_the_single_trace_sweep():
    rows = sweep_grid(TRACES, SIZES, {"max_num_seqs": [4, 256]}, jobs=1)
    for i, (t, seqs) in enumerate(itertools.product(TRACES, (4, 256))):
        assert [r.result for r in rows[2 * i:2 * i + 2]] == sweep(TRACES[t], SIZES, max_num_seqs=seqs, jobs=1)


def test_each_point_takes_the_arrays_only_where_they_model_it():
    rows = sweep_grid({"tiny": TINY}, [4_000], {"policy": ["fcfs", "priority"], "async_scheduling": [False, True]}, jobs=1)
    assert [r.point.engine for r in rows] == ["arrays", "objects", "objects", "objects"]
    for r in rows: assert r.result == replay_mooncake(TINY, 4_000, **r.point.settings)
    objects = sweep_grid({"tiny": TINY}, [4_000], {"max_num_seqs": [4, 256]}, engine="objects", jobs=1)
    arrays = sweep_grid({"tiny": TINY}, [4_000], {"max_num_seqs": [4, 256]}, engine="arrays", jobs=1)
    assert [r.point.engine for r in objects] == ["objects"] * 2 and [r.result for r in objects] == [r.result for r in arrays]


def test_offload_rows_are_offload_sweep_in_its_order():
    rows = sweep_grid(TRACES, [4_000, 8_000], {"max_num_seqs": [4, 256]}, cpu_blocks=[0, 8_000], policies=["lru", "arc"], jobs=2)
    assert len(rows) == 2 * 2 * 2 * 2 * 2
    for i, (t, seqs) in enumerate(itertools.product(TRACES, (4, 256))):
        assert [r.result for r in rows[8 * i:8 * i + 8]] == offload_sweep(TRACES[t], [4_000, 8_000], [0, 8_000], ["lru", "arc"],
                                                                         max_num_seqs=seqs, jobs=1)
        assert {r.point.trace for r in rows[8 * i:8 * i + 8]} == {t}


def test_settings_given_alone_are_shared_and_the_defaults_are_sweeps():
    rows = sweep_grid({"tiny": TINY}, [4_000], {"max_num_seqs": [4, 256]}, max_num_batched_tokens=2048, jobs=1)
    assert [r.result for r in rows] == [replay_mooncake(TINY, 4_000, max_num_batched_tokens=2048, max_num_seqs=s) for s in (4, 256)]
    assert sweep_grid({"tiny": TINY}, SIZES, jobs=1)[1].result == sweep(TINY, SIZES, jobs=1)[1]


def test_grid_points_order_is_trace_then_settings_then_tier_then_size():
    points = grid_points(["a", "b"], {"x": [1, 2], "y": ["p", "q"]}, [10, 20], cpu_blocks=[0, 5], policies=["lru", "arc"])
    assert len(points) == 2 * 2 * 2 * 2 * 2 * 2
    assert [(p.trace, p.settings, p.eviction_policy, p.cpu_blocks, p.gpu_blocks) for p in points[:5]] == [
        ("a", {"x": 1, "y": "p"}, "lru", 0, 10), ("a", {"x": 1, "y": "p"}, "lru", 0, 20), ("a", {"x": 1, "y": "p"}, "lru", 5, 10),
        ("a", {"x": 1, "y": "p"}, "lru", 5, 20), ("a", {"x": 1, "y": "p"}, "arc", 0, 10)]
    assert (points[8].settings, points[16].settings, points[31].trace, points[32].trace) == ({"x": 1, "y": "q"}, {"x": 2, "y": "p"}, "a", "b")


# ---- the table and the picture ----

@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_one_trace_and_one_point_print_the_sweeps_own_output(fmt):
    rows = sweep_grid({"tiny": TINY}, SIZES, {"max_num_seqs": [64]}, jobs=1)
    assert format_grid(rows, fmt) == format_results(sweep(TINY, SIZES, max_num_seqs=64, jobs=1), fmt)
    tiered = sweep_grid({"tiny": TINY}, [4_000], cpu_blocks=[0, 8_000], jobs=1)
    assert format_grid(tiered, fmt) == format_offload_results(offload_sweep(TINY, [4_000], [0, 8_000], jobs=1), fmt)


def test_the_table_gains_a_column_only_for_what_varies_and_each_labels_its_own_row():
    grid = {"max_num_seqs": [4, 256], "policy": ["fcfs"], "max_num_batched_tokens": [2048, 8192]}
    rows = sweep_grid(TRACES, [4_000], grid, jobs=1)
    table = format_grid(rows).splitlines()
    assert table[0].startswith("scheduler: policy=fcfs, long_prefill_token_threshold=0") and "max_num" not in table[0]
    assert table[2].startswith("| trace | max_num_seqs | max_num_batched_tokens | num_blocks | hit_rate |")
    cells = [l.strip("| ").split(" | ")[:3] for l in table[4:]]
    records = json.loads(format_grid(rows, "json"))
    assert cells == [[d["trace"], str(d["max_num_seqs"]), str(d["max_num_batched_tokens"])] for d in records]
    for d, r in zip(records, rows):  # each label is the setting its row was replayed with
        assert d["trace"] == r.point.trace and d["hit_rate"] == r.result.hit_rate
        assert {f"max_num_seqs={d['max_num_seqs']}", f"max_num_batched_tokens={d['max_num_batched_tokens']}"} <= set(d["settings"].split(", "))
    assert [(d["trace"], d["max_num_seqs"], d["max_num_batched_tokens"]) for d in records] == list(itertools.product(TRACES, (4, 256), (2048, 8192)))
    csv_head = format_grid(rows, "csv").splitlines()[0]
    assert csv_head.startswith("trace,max_num_seqs,max_num_batched_tokens,num_blocks,hit_rate,") and csv_head.endswith(",settings")
    only_traces = format_grid(sweep_grid(TRACES, [4_000], jobs=1), "csv").splitlines()[0]
    assert only_traces.startswith("trace,num_blocks,")


def test_grid_svg_draws_a_line_per_trace_and_setting_with_text_at_least_11_px():
    pytest.importorskip("matplotlib")
    rows = sweep_grid(TRACES, [4_000, 8_000, 16_000], {"max_num_seqs": [4, 256]}, jobs=1)
    svg = grid_svg(rows, "two traces")
    texts = set(re.findall(r"<text[^>]*>([^<]*)", svg))
    assert {"tiny, 4", "tiny, 256", "drawn, 4", "drawn, 256", "4000", "8000", "16000", "GPU cache size (blocks)",
            "two traces (a line per trace, max_num_seqs)"} <= texts, texts
    assert min(float(px) for px in re.findall(r"font-size: ([\d.]+)px", svg)) >= 11
    assert grid_svg(rows, "two traces") == svg  # deterministic
    tiered = sweep_grid({"tiny": TINY}, [4_000, 8_000], cpu_blocks=[0, 8_000], jobs=1)
    assert {"CPU 0 lru", "CPU 8000 lru"} <= set(re.findall(r"<text[^>]*>([^<]*)", grid_svg(tiered)))


# ---- refusals ----

def test_vllm_refusals_follow_vllm_0_33_verify_max_model_len():
    from kvref.core.scheduler import SchedulerConfig
    assert "must be >= max_num_seqs (256)" in vllm_refusal(SchedulerConfig(max_num_batched_tokens=255, max_num_seqs=256), 10)
    assert vllm_refusal(SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=256), 256) is None
    assert "without chunked prefill" in vllm_refusal(SchedulerConfig(max_num_batched_tokens=300, enable_chunked_prefill=False), 301)
    assert vllm_refusal(SchedulerConfig(max_num_batched_tokens=301, enable_chunked_prefill=False), 301) is None
    assert "long_prefill_token_threshold (302)" in vllm_refusal(SchedulerConfig(long_prefill_token_threshold=302), 301)


@pytest.mark.parametrize("call, error, words", [
    (lambda: sweep_grid(TRACES, SIZES, {"max_num_seqs": [4, 4]}), ValueError, "grid['max_num_seqs'] must be distinct values"),
    (lambda: sweep_grid(TRACES, SIZES, {"max_num_seqs": []}), ValueError, "grid['max_num_seqs'] must be a non-empty list"),
    (lambda: sweep_grid(TRACES, SIZES, {"max_num_seqs": 4}), TypeError, "grid['max_num_seqs'] must be a list of values"),
    (lambda: sweep_grid(TRACES, SIZES, "max_num_seqs"), TypeError, "grid must be a dict of scheduler setting -> list of values"),
    (lambda: sweep_grid(TRACES, SIZES, offload={"store_threshold": 1}), ValueError, "offload must be None without cpu_blocks"),
    (lambda: sweep_grid(TRACES, [10 ** 30]), ValueError, "blocks[0] must be an int >= 1 and <= 2097152"),
    (lambda: sweep_grid(TRACES, SIZES, {"max_num_seqs": [4]}, max_num_seqs=8), ValueError, "must be a setting not also given alone"),
    (lambda: sweep_grid(TRACES, SIZES, {"budget": [4]}), ValueError, "unknown scheduler setting 'budget'"),
    (lambda: sweep_grid(TRACES, SIZES, {"max_num_seqs": [0]}), ValueError, "max_num_seqs must be an int >= 1"),
    (lambda: sweep_grid(TRACES, SIZES, {"max_num_seqs": [4, 512]}, max_num_batched_tokens=256), ValueError,
     "vLLM refuses max_num_seqs=512 on trace 'tiny': max_num_batched_tokens (256) must be >= max_num_seqs (512)"),
    (lambda: sweep_grid(TRACES, SIZES, {"enable_chunked_prefill": [True, False]}), ValueError,
     "vLLM refuses enable_chunked_prefill=False on trace 'tiny': max_num_batched_tokens (8192) is below max_model_len"),
    (lambda: sweep_grid(TRACES, SIZES, {"policy": ["fcfs", "priority"]}, engine="arrays"), ValueError,
     "engine 'arrays' does not model policy='priority'"),
    (lambda: sweep_grid(TRACES, SIZES, cpu_blocks=[0], engine="arrays"), ValueError, "engine 'arrays' does not model a CPU tier"),
    (lambda: sweep_grid(TRACES, SIZES, engine="fast"), ValueError, "engine must be one of 'auto', 'arrays', 'objects'"),
    (lambda: sweep_grid(TRACES, [3_000]), ValueError, "trace 'tiny': num_blocks=3000 cannot hold line 6"),
    (lambda: sweep_grid({"a": TINY, "b": []}, SIZES), ValueError, "traces['b'] must be a non-empty list"),
    (lambda: sweep_grid({}, SIZES), ValueError, "traces must be at least one named trace"),
    (lambda: sweep_grid([TINY], SIZES), TypeError, "traces must be a dict of name -> list of MooncakeRequest"),
    (lambda: sweep_grid(TRACES, SIZES, cpu_blocks=[-1]), ValueError, "cpu_blocks[0] must be an int >= 0"),
    (lambda: sweep_grid(TRACES, SIZES, cpu_blocks=[0], policies=["lfu"]), ValueError, "policies[0] must be one of 'lru', 'arc'"),
    (lambda: sweep_grid(TRACES, SIZES, cpu_blocks=[8], offload={"eviction_policy": "arc"}), ValueError, "not 'eviction_policy'"),
    (lambda: sweep_grid(TRACES, SIZES, cpu_blocks=[8], async_scheduling=True), ValueError, "async_scheduling must be False with a CPU tier"),
])
def test_bad_grids_are_refused_by_name_before_any_worker_starts(monkeypatch, call, error, words):
    monkeypatch.setattr(sweep_grids, "map_grid", lambda *a: pytest.fail("a worker started"))
    with pytest.raises(error) as e: call()
    assert words in str(e.value), str(e.value)


def test_format_grid_and_grid_svg_refuse_what_is_not_rows():
    rows = sweep_grid({"tiny": TINY}, [4_000], jobs=1)
    with pytest.raises(ValueError, match="fmt must be one of 'table', 'csv', 'json'"): format_grid(rows, "xml")
    for bad in ([], rows[0], [rows[0].result]):
        with pytest.raises(TypeError, match="rows must be a"): format_grid(bad)
        with pytest.raises(TypeError, match="rows must be a"): grid_svg(bad)


# ---- kvref sweep ----

def _cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): status = sweep_main([str(a) for a in argv])
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("grid")
    write_mooncake(TINY, folder / "tiny.jsonl"); write_mooncake(DRAWN, folder / "drawn.jsonl")
    (folder / "other").mkdir(); write_mooncake(DRAWN, folder / "other" / "tiny.jsonl")
    return folder


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_kvref_sweep_of_one_trace_and_one_value_prints_what_it_printed_before_grids(files, fmt):
    status, out, err = _cli(files / "tiny.jsonl", "--blocks", "16000,4000", "--max-num-seqs", "64", "--jobs", "1", "--format", fmt)
    assert (status, err) == (0, "") and out == format_results(sweep(TINY, SIZES, max_num_seqs=64, jobs=1), fmt)


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_kvref_sweep_of_a_grid_prints_format_grid(files, fmt):
    status, out, err = _cli(files / "tiny.jsonl", files / "drawn.jsonl", "--blocks", "16000,4000", "--max-num-seqs", "4,256",
                            "--max-num-batched-tokens", "2048,8192", "--no-scheduler-reserve-full-isl", "--jobs", "2", "--format", fmt)
    assert (status, err) == (0, "")
    grid = {"max_num_batched_tokens": [2048, 8192], "max_num_seqs": [4, 256], "policy": ["fcfs"], "long_prefill_token_threshold": [0]}
    rows = sweep_grid({"tiny.jsonl": TINY, "drawn.jsonl": DRAWN}, SIZES, grid, scheduler_reserve_full_isl=False, jobs=1)
    assert out == format_grid(rows, fmt)
    if fmt == "csv": assert out.splitlines()[0].startswith("trace,max_num_batched_tokens,max_num_seqs,num_blocks,")


def test_kvref_sweep_grid_with_a_cpu_tier_and_a_plot(files, tmp_path):
    status, out, err = _cli(files / "tiny.jsonl", "--blocks", "4000", "--cpu-blocks", "0,8000", "--scheduling-policy", "fcfs,priority",
                            "--jobs", "1", "--format", "csv", "--plot", tmp_path / "grid")
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("policy,gpu_blocks,cpu_blocks,eviction_policy,") and len(lines) == 5
    assert [l.split(",")[:3] for l in lines[1:]] == [["fcfs", "4000", "0"], ["fcfs", "4000", "8000"], ["priority", "4000", "0"], ["priority", "4000", "8000"]]
    assert "fcfs, CPU 8000 lru" in (tmp_path / "grid.svg").read_text()


@pytest.mark.parametrize("argv, words", [
    (["--max-num-seqs", "4,,256"], "argument --max-num-seqs: empty item in '4,,256'"),
    (["--max-num-seqs", "4,"], "argument --max-num-seqs: empty item in '4,'"),
    (["--max-num-batched-tokens", "2048,2048"], "argument --max-num-batched-tokens: 2048 is listed twice in '2048,2048'"),
    (["--long-prefill-token-threshold", "0,0"], "argument --long-prefill-token-threshold: 0 is listed twice"),
    (["--scheduling-policy", "fcfs,lifo"], "argument --scheduling-policy: invalid choice: 'lifo' (choose from fcfs, priority)"),
    (["--max-num-seqs", "4,x"], "argument --max-num-seqs: invalid int value: 'x'"),
    (["--max-num-seqs", "64,512", "--max-num-batched-tokens", "256"],
     "vLLM refuses max_num_seqs=512 on trace 'tiny.jsonl': max_num_batched_tokens (256) must be >= max_num_seqs (512)"),
    (["--max-num-seqs", "4,8", "--no-enable-chunked-prefill"], "max_num_batched_tokens (8192) is below max_model_len (49031) without chunked prefill"),
    (["--long-prefill-token-threshold", "0,60000"], "long_prefill_token_threshold (60000) is above max_model_len (49031)"),
    (["--engine", "arrays", "--scheduling-policy", "fcfs,priority"], "engine 'arrays' does not model policy='priority'"),
    (["--max-num-seqs", "4,8", "--cpu-blocks", "0,8", "--engine", "arrays"], "--engine arrays does not model the CPU offload tier"),
    (["--max-num-seqs", "4,8", "--blocks", "3000"], "trace 'tiny.jsonl': num_blocks=3000 cannot hold line 6"),
    (["--max-num-seqs", "4,8", "--plot", "/nonexistent/dir/x"], "--plot /nonexistent/dir/x: no folder"),
    (["--max-num-seqs", "4,8", "--policy", "arc"], "--policy needs --cpu-blocks"),
    (["{f}/tiny.jsonl"], "two traces are named 'tiny.jsonl': a grid names each trace by its file name"),
    (["{f}/other/tiny.jsonl"], "two traces are named 'tiny.jsonl'"),
    (["{f}/missing.jsonl"], "missing.jsonl"),
])
def test_kvref_sweep_refuses_a_bad_grid_in_one_line_and_runs_nothing(files, monkeypatch, argv, words):
    monkeypatch.setattr(sweep_grids, "map_grid", lambda *a: pytest.fail("a worker started"))
    args = [a.replace("{f}", str(files)) for a in argv]
    traces = [files / "tiny.jsonl"] + [a for a in args if a.endswith(".jsonl")]  # positionals together, before the options
    blocks = [] if "--blocks" in args else ["--blocks", "4000"]
    status, out, err = _cli(*traces, *blocks, "--jobs", "1", *[a for a in args if not a.endswith(".jsonl")])
    assert (status, out) == (2, "") and err.count("\n") == 1 and err.startswith("kvref sweep: error: ") and words in err, err


@pytest.mark.parametrize("argv, words", [
    (["--max-num-batched-tokens", "128"], "vLLM refuses these settings on trace 'tiny.jsonl': max_num_batched_tokens (128) must be >= max_num_seqs (256)"),
    (["--no-enable-chunked-prefill"], "max_num_batched_tokens (8192) is below max_model_len (49031) without chunked prefill"),
    (["--long-prefill-token-threshold", "60000", "--cpu-blocks", "0,8000"], "long_prefill_token_threshold (60000) is above max_model_len (49031)"),
])
def test_one_point_vllm_would_not_start_is_refused_as_a_grid_point_is(files, monkeypatch, argv, words):
    "One trace at one point of settings goes through chapter 06c's path, and is refused with the grid's words."
    from kvref.oracle import production_traces
    monkeypatch.setattr(production_traces, "map_grid", lambda *a: pytest.fail("a worker started"))
    status, out, err = _cli(files / "tiny.jsonl", "--blocks", "4000", "--jobs", "1", *argv)
    assert (status, out) == (2, "") and err.count("\n") == 1 and words in err, err
