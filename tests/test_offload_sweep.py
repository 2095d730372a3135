"""The GPU x CPU sweep (chapter 06d): its fast twins make the plain connector's decisions, the grid is the points one by
one, bad grids are named, the tables carry the settings, and the pictures hold what they should."""
import json
import random
import re
from dataclasses import replace
from pathlib import Path

import pytest

from kvref.core.scheduler import CONNECTOR_FIELDS, load_workloads, run_workload
from kvref.kv_offload import (ChunkStatus, HeapLRUCachePolicy, LRUCachePolicy, OffloadConfig, OffloadSizeResult,
                              ReqContext, TallyConfig, doubling_gains, format_offload_results, offload_curves_svg,
                              offload_heatmap_svg, offload_sweep, replay_offload)
from kvref.oracle.production_traces import read_mooncake, replay_mooncake

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = load_workloads(ROOT / "golden" / "offload" / "workloads.jsonl")
SAMPLE = list(read_mooncake(ROOT / "golden" / "mooncake" / "synthetic-trace-last300.jsonl"))
SMALL = [r for r in SAMPLE if r.input_length <= 20_000][:40]  # a few seconds a replay at most


@pytest.mark.parametrize("seed", range(40))
def test_heap_lru_evicts_as_the_sorting_lru(seed):
    "Random inserts, accesses, finishes, touches, pins and evictions: the heap twin picks the same victims."
    rng, plain, heap = random.Random(seed), LRUCachePolicy(16), HeapLRUCachePolicy(16)
    ctxs = [ReqContext(f"r{i}", positions={bytes([i, p]): 4 * (p + 1) for p in range(6)}) for i in range(5)]
    for _ in range(300):
        ctx = rng.choice(ctxs); keys = [k for k in ctx.positions if rng.random() < 0.6]
        op, pins = rng.randrange(7), {k: rng.choice([0, 0, -1]) for k in keys}
        for policy in (plain, heap):
            resident = [k for k in keys if k in policy.chunks]
            if op == 0:
                for k in keys:
                    if k not in policy.chunks: policy.insert(k, ChunkStatus(0, ref_cnt=pins[k]), ctx)
            elif op == 1: policy.on_request_access(resident, ctx)
            elif op == 2: policy.on_request_finished(resident, set(), set(), ctx)
            elif op == 3: policy.touch(resident, ctx)
            elif op == 4 and resident:
                k = resident[0]
                (policy.mark_non_evictable if k in policy.evictable else policy.mark_evictable)(k)
        if op in (0, 5, 6):
            n, protected = rng.randrange(4), set(rng.sample(keys, min(2, len(keys))))
            got = heap.evict(n, protected); want = plain.evict(n, protected)
            assert (None if got is None else [k for k, _ in got]) == (None if want is None else [k for k, _ in want])
        if rng.random() < 0.01: plain.clear(); heap.clear()
        assert plain.order() == heap.order() and plain.evictable == heap.evictable


def totals_from(records: list[dict]) -> dict:
    "What a TallyConnector counts, summed from the plain connector's step records."
    out = {"lookups": 0, "admitted": 0, "loads": 0, "stores": 0, "evicted": 0, "store_fail": 0, "cpu_queries": 0, "cpu_hits": 0}
    for r in records:
        for name in ("lookups", "admitted", "evicted", "store_fail"): out[name] += len(r.get(name, []))
        out["loads"] += sum(len(load[1]) for load in r.get("loads", []))
        out["stores"] += sum(len(store[1]) for store in r.get("stores", []))
        out["cpu_queries"] += r.get("conn_pcs", {}).get("queries", 0); out["cpu_hits"] += r.get("conn_pcs", {}).get("hits", 0)
    return out


def without_connector(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in CONNECTOR_FIELDS or k in ("fin_order", "loading", "kv_fetch", "done")} for r in records]


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_tally_connector_decides_as_the_recording_one(workload, policy):
    "Every golden workload, both policies: the same scheduler records, and totals equal to the records' sums."
    config = replace(OffloadConfig.of(workload.config["offload"]), eviction_policy=policy)
    plain = run_workload(workload, offload=config)
    tally = TallyConfig(**vars(config))
    run = run_workload(workload, offload=tally)
    assert without_connector(run.records) == without_connector(plain.records)


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_replay_offload_counts_what_the_records_show(policy):
    "A Mooncake replay: TallyConnector's totals are the plain connector's records summed, the GPU counters equal."
    plain_records = []
    def keep(s, out, gap): plain_records.append(out.record()); return 0
    plain = replay_mooncake(SMALL, 900, block_size=256, offload=OffloadConfig(cpu_chunks=600, eviction_policy=policy), advance=keep)
    r = replay_offload(SMALL, 900, 600, policy, block_size=256)
    t = totals_from(plain_records)
    assert (r.gpu_hits, r.queries, r.num_steps, r.preemptions) == (plain.hits, plain.queries, plain.num_steps, plain.preemptions)
    assert (r.loads, r.stores, r.cpu_evictions, r.store_failures, r.cpu_queries, r.cpu_hits) == \
        (t["loads"], t["stores"], t["evicted"], t["store_fail"], t["cpu_queries"], t["cpu_hits"])
    assert r.stores > 0 and r.hit_rate == pytest.approx(r.gpu_hit_rate + r.cpu_hit_rate)


def test_no_cpu_tier_is_the_gpu_alone():
    alone, r = replay_mooncake(SMALL, 900, block_size=256), replay_offload(SMALL, 900, 0, block_size=256)
    assert (r.gpu_hits, r.cpu_hits, r.loads, r.stores, r.hit_rate) == (alone.hits, 0, 0, 0, alone.hit_rate)


def test_the_grid_is_its_points_in_order_on_any_number_of_processes():
    grid = offload_sweep(SMALL, [900, 1800], [0, 600], ("lru", "arc"), block_size=256, jobs=2)
    assert [(r.eviction_policy, r.cpu_blocks, r.gpu_blocks) for r in grid] == \
        [(p, c, g) for p in ("lru", "arc") for c in (0, 600) for g in (900, 1800)]
    assert grid[5] == replay_offload(SMALL, 1800, 0, "arc", block_size=256)
    assert offload_sweep(SMALL, [900, 1800], [0, 600], ("lru", "arc"), block_size=256, jobs=1) == grid


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(blocks=[10]), ValueError, r"blocks\[0\] must be at least"),
    (dict(blocks=[]), ValueError, "blocks must be a non-empty list"),
    (dict(cpu_blocks=[-1]), ValueError, r"cpu_blocks\[0\] must be an int >= 0"),
    (dict(cpu_blocks=[1.5]), TypeError, r"cpu_blocks\[0\] must be an int"),
    (dict(policies="lru"), TypeError, "policies must be a non-empty list"),
    (dict(policies=["lfu"]), ValueError, r"policies\[0\] must be one of 'lru', 'arc'"),
    (dict(offload={"eviction_policy": "arc"}), ValueError, "not 'eviction_policy'"),
    (dict(offload={"store_threshold": -1}), ValueError, "store_threshold"),
    (dict(offload={"cpu_bytes": 1}), ValueError, "unknown offload setting 'cpu_bytes'"),
    (dict(frobnicate=1), ValueError, "unknown scheduler setting 'frobnicate'"),
    (dict(async_scheduling=True), ValueError, "async_scheduling"),
    (dict(requests=[]), ValueError, "requests must be a non-empty list"),
    (dict(requests="x"), TypeError, "requests must be a list of MooncakeRequest")])
def test_bad_grids_are_named_before_any_replay(kwargs, error, words):
    args = dict(requests=SMALL, blocks=[900], cpu_blocks=[0, 600], block_size=256, jobs=1) | kwargs
    with pytest.raises(error, match=words): offload_sweep(**args)


def fake(gpu, cpu, policy, rate):
    return OffloadSizeResult(gpu, cpu, policy, rate, rate / 2, rate / 2, 100, 50, 50, 60, 3, 4, 1, 0, 2, 0, 9, "s=1", "o=2")


FAKE = [fake(g, c, p, round(0.1 + g / 10_000 + c / 20_000 + (p == "arc") / 100, 4)) for p in ("lru", "arc")
        for c in (0, 1000, 2000) for g in (1000, 2000)]


def test_tables_carry_the_settings_and_every_format_round_trips():
    table = format_offload_results(FAKE)
    assert table.splitlines()[:2] == ["scheduler: s=1", "offload: o=2"] and table.count("\n| 1000 |") == 6
    assert json.loads(format_offload_results(FAKE, "json"))[0]["offload_settings"] == "o=2"
    assert format_offload_results(FAKE, "csv").splitlines()[0].startswith("gpu_blocks,cpu_blocks,eviction_policy,hit_rate")
    with pytest.raises(ValueError, match="fmt must be one of"): format_offload_results(FAKE, "xml")
    with pytest.raises(TypeError, match=r"results\[0\] must be a OffloadSizeResult"): format_offload_results([{}])


def test_doubling_gains_compare_each_point_with_its_two_neighbours():
    gains = doubling_gains(FAKE)
    assert [(d["eviction_policy"], d["gpu_blocks"], d["cpu_blocks"]) for d in gains] == [("lru", 1000, 1000), ("arc", 1000, 1000)]
    assert gains[0]["double_gpu"] == pytest.approx(0.1) and gains[0]["double_cpu"] == pytest.approx(0.05)


@pytest.mark.parametrize("draw", [offload_heatmap_svg, offload_curves_svg])
def test_pictures_are_legible_and_hold_every_point(draw):
    svg = draw(FAKE, "a title")
    sizes = [float(s) for s in re.findall(r"font-size: ([0-9.]+)px", svg)]
    assert sizes and min(sizes) >= 11
    width = float(re.search(r'viewBox="0 0 ([0-9.]+) ', svg).group(1))
    assert width <= 1280  # drawn 1280 px wide, the 11-unit text is at least 11 px
    assert "a title" in svg and draw(FAKE, "a title") == svg  # deterministic
    if draw is offload_heatmap_svg:
        assert all(f"{r.hit_rate:.3f}" in svg for r in FAKE) and "LRU: hit rate" in svg and "ARC: hit rate" in svg
    else:
        assert all(f"{p}, CPU {c}" in svg for p in ("LRU", "ARC") for c in ("0", "1k", "2k"))


def cli(*argv, tmp_path=None) -> tuple[int, str, str]:
    "Run `kvref sweep` in this process: exit status, stdout, stderr."
    import contextlib, io
    from kvref.cli import sweep_main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): status = sweep_main([str(a) for a in argv])
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "small.jsonl"
    lines = (ROOT / "golden" / "mooncake" / "synthetic-trace-last300.jsonl").read_text().splitlines(keepends=True)
    path.write_text("".join(l for l, r in zip(lines, SAMPLE) if r in SMALL))
    return path


def test_cli_grid_prints_the_settings_and_draws_both_pictures(small_trace, tmp_path):
    status, out, err = cli(small_trace, "--blocks", "900,1800", "--cpu-blocks", "0,600", "--policy", "lru,arc",
                           "--block-size", "256", "--jobs", "1", "--plot", tmp_path / "grid")
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("scheduler: max_num_batched_tokens=8192") and lines[1].startswith("offload: block_size=None")
    assert len([l for l in lines if l.startswith("| 900 |") or l.startswith("| 1800 |")]) == 8
    assert "<svg" in (tmp_path / "grid-heatmap.svg").read_text() and "<svg" in (tmp_path / "grid-curves.svg").read_text()
    status, out, _ = cli(small_trace, "--blocks", "900", "--cpu-blocks", "600", "--block-size", "256", "--format", "json")
    assert status == 0 and json.loads(out)[0]["eviction_policy"] == "lru"


@pytest.mark.parametrize("argv, words", [
    (["--cpu-blocks", "0,x"], "--cpu-blocks: invalid int value: 'x'"),
    (["--cpu-blocks", "-1"], "--cpu-blocks: invalid int value: '-1'"),
    (["--cpu-blocks", "0", "--policy", "lfu"], "--policy: 'lfu' is not lru, arc or lru,arc"),
    (["--policy", "arc"], "--policy needs --cpu-blocks"),
    (["--cpu-blocks", "600", "--async-scheduling"], "async_scheduling must be False with a CPU tier"),
    (["--cpu-blocks", "600", "--plot", "/nonexistent/dir/x"], "--plot /nonexistent/dir/x: no folder"),
    (["--blocks", "10,900", "--cpu-blocks", "600"], "--blocks 10: too small")])
def test_cli_bad_grids_are_exit_2_and_one_line(small_trace, argv, words):
    args = ["--blocks", "900", "--block-size", "256", "--jobs", "1"]
    if "--blocks" in argv: args = args[2:]
    status, out, err = cli(small_trace, *args, *argv)
    assert status == 2 and out == "" and err.count("\n") == 1 and err.startswith("kvref sweep: error: ") and words in err, err
