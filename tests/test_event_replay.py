"""The event-driven replay (`kvref.oracle.event_replay.advance_decode`) held to the step-by-step scheduler in lockstep:
every golden workload, random workloads (hypothesis), and the Mooncake sample at several sizes and paces give the
same records, outputs and counters; the boundaries it computes are `_has_room`'s; planted bugs are caught."""
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from kvref.oracle import event_replay
from kvref.oracle.event_replay import _decode_events, advance_decode
from kvref.core.kv_cache_manager import KVCacheManager
from kvref.oracle.production_traces import block_hashes, read_mooncake, replay_mooncake, sweep
from kvref.core.scheduler import FakeModel, Scheduler, load_workloads, run_workload
from kvref.oracle.workloads import RequestSpec, Workload

ROOT = Path(__file__).parent.parent
GOLDEN = ROOT / "golden" / "scheduler"
WORKLOADS = load_workloads(GOLDEN / "workloads.jsonl") + load_workloads(GOLDEN / "docs" / "workloads.jsonl")
SAMPLE = list(read_mooncake(ROOT / "golden" / "mooncake" / "synthetic-trace-last300.jsonl"))


def counting(calls: list):
    "`advance_decode`, noting how many steps each call moved."
    def advance(s, last, horizon, into=None):
        calls.append(advance_decode(s, last, horizon, into)); return calls[-1]
    return advance


def lockstep(workload, **kwargs):
    "Both paths' runs, and the steps the event-driven one moved in bulk."
    calls = []
    plain, fast = run_workload(workload, **kwargs), run_workload(workload, advance=counting(calls), **kwargs)
    return plain, fast, sum(calls)


def assert_same(plain, fast):
    first = next((i for i, (a, b) in enumerate(zip(plain.records, fast.records)) if a != b), None)
    assert first is None and len(plain.records) == len(fast.records), (first, len(plain.records), len(fast.records))
    assert (plain.outputs, plain.num_preemptions) == (fast.outputs, fast.num_preemptions)


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_every_golden_workload_in_lockstep(workload):
    plain, fast, _ = lockstep(workload)
    assert_same(plain, fast)


def test_the_goldens_do_move_in_bulk():
    assert sum(lockstep(w)[2] for w in WORKLOADS) > 100


HEAD_FOLLOWS = Workload("head_hits_a_decode_block", [RequestSpec("A", list(range(1, 7)), list(range(7, 15))),
                                                     RequestSpec("H", list(range(1, 9)) + list(range(20, 28)), [30])],
                        dict(num_blocks=5, block_size=4, max_num_batched_tokens=64))


def test_a_head_refused_by_the_gate_is_admitted_when_a_decode_block_it_continues_is_cached():
    plain, fast, _ = lockstep(HEAD_FOLLOWS)
    assert [s[0] for s in plain.records[2]["sched"]] == ["A", "H"]  # admitted in the step A's block 1 fills
    assert_same(plain, fast)


# ---- random workloads: prompts that are prefixes of a few sequences, outputs that continue them ----

@st.composite
def workloads(draw):
    bs = draw(st.sampled_from([1, 2, 3, 4]))
    bases = [[10 * b + draw(st.integers(0, 2)) for _ in range(40)] for b in range(2)]
    reqs = []
    for i in range(draw(st.integers(1, 7))):
        base, a, m = draw(st.sampled_from(bases)), draw(st.integers(1, 24)), draw(st.integers(1, 12))
        out = base[a:a + m] if draw(st.booleans()) else []
        reqs.append(RequestSpec(f"r{i}", base[:a], out, arrival=draw(st.sampled_from([0, 0, 3, 9])),
                                priority=draw(st.integers(0, 2)), max_tokens=None if out else m))
    need = max(-(-(len(r.prompt) + (len(r.output) or r.max_tokens)) // bs) for r in reqs)
    config = dict(num_blocks=need + 1 + draw(st.integers(0, 4)), block_size=bs, model_seed=1,
                  enable_prefix_caching=draw(st.sampled_from([True, True, True, False])),
                  max_num_batched_tokens=draw(st.integers(2, 16)), max_num_seqs=draw(st.integers(1, 5)),
                  policy=draw(st.sampled_from(["fcfs", "priority"])), scheduler_reserve_full_isl=draw(st.booleans()),
                  long_prefill_token_threshold=draw(st.sampled_from([0, 0, 2, 3])),
                  enable_chunked_prefill=draw(st.sampled_from([True, True, False])))
    if draw(st.booleans()): config["max_model_len"] = need * bs - draw(st.integers(0, 2))
    return Workload("random", reqs, config)


@given(workloads(), st.sampled_from(["vllm_0_33", "design_doc"]))
@settings(deadline=None, max_examples=300)
def test_random_workloads_in_lockstep(workload, behavior):
    try: plain = run_workload(workload, behavior=behavior, max_steps=3000)
    except ValueError: return  # refused (a prompt at max_model_len) or stuck: the fast path must say the same
    calls = []
    assert_same(plain, run_workload(workload, behavior=behavior, advance=counting(calls)))


@given(workloads(), st.integers(1, 6))
@settings(deadline=None, max_examples=100)
def test_the_boundaries_are_where_has_room_fails(workload, steps):
    "`_decode_events` lists exactly the steps at which the plain path leaves the decode shortcut."
    c = workload.config
    s = Scheduler(KVCacheManager(c["num_blocks"] + 64, c["block_size"], enable_caching=c["enable_prefix_caching"]),
                  model=FakeModel(1), record_trace=False, max_num_batched_tokens=256)
    for r in workload.requests: s.add_request(r)
    for _ in range(steps):
        if s.requests: s.step()
    for req in list(s.running):
        if req.request.num_tokens - req.request.num_computed_tokens != 1: continue
        r, kv, found = req.request, s.kv, []
        events, table, cached = list(_decode_events(s, req, 12)), len(kv.req_to_blocks[r.request_id]), kv.num_cached_block.get(r.request_id, 0)
        for j in range(12):  # the shortcut's test, on the counts the plain path would have
            end = r.num_computed_tokens + j + 1
            if table * kv.block_size < end or (kv.enable_caching and end // kv.block_size > cached):
                found.append((j, table * kv.block_size < end))
                table, cached = max(table, -(-end // kv.block_size)), max(cached, end // kv.block_size) if kv.enable_caching else cached
        assert events == found


# ---- the Mooncake sample ----

HASHES = [block_hashes(r) for r in SAMPLE]


@pytest.mark.parametrize("num_blocks", [12_500, 25_000, 100_000, 256_000])
@pytest.mark.parametrize("ms_per_step", [None, 10.0])
def test_the_mooncake_sample_in_lockstep(num_blocks, ms_per_step):
    calls = []
    plain = replay_mooncake(SAMPLE, num_blocks, hashes=HASHES, ms_per_step=ms_per_step)
    fast = replay_mooncake(SAMPLE, num_blocks, hashes=HASHES, ms_per_step=ms_per_step, advance=counting(calls))
    assert plain == fast and sum(calls) > 0


def test_a_tight_pool_with_preemptions_in_lockstep():
    "The gate off at the smallest size: 68 preemptions (bench/sweep.md), refusals and evictions, all the same."
    reqs, kwargs = SAMPLE, dict(hashes=HASHES, scheduler_reserve_full_isl=False)
    plain = replay_mooncake(reqs, 12_500, **kwargs)
    assert plain.preemptions > 0
    assert replay_mooncake(reqs, 12_500, advance=advance_decode, **kwargs) == plain


def test_sweep_takes_the_option():
    sizes = [12_500, 50_000]
    assert sweep(SAMPLE[:40], sizes, jobs=1, advance=advance_decode) == sweep(SAMPLE[:40], sizes, jobs=1)


# ---- planted bugs: each guard is needed, and the lockstep tests see it go ----

def diverges(workload) -> bool:
    "Whether the event-driven run differs from the plain one, or fails where the plain one does not."
    plain = run_workload(workload)
    try: fast = run_workload(workload, advance=advance_decode)
    except (ValueError, AssertionError): return True
    return (plain.records, plain.outputs) != (fast.records, fast.outputs)


def test_without_the_fill_guard_the_admission_is_missed(monkeypatch):
    monkeypatch.setattr(event_replay, "_may_extend_head", lambda s, req, head: False)
    assert diverges(HEAD_FOLLOWS)


def test_a_boundary_dropped_is_caught(monkeypatch):
    real = event_replay._decode_events
    monkeypatch.setattr(event_replay, "_decode_events", lambda s, req, n: [e for e in real(s, req, n) if e[1]][1:])
    assert any(diverges(w) for w in WORKLOADS)


def test_a_finish_overrun_is_caught(monkeypatch):
    monkeypatch.setattr(event_replay, "_steps_before_finish", lambda s, req: req.max_tokens - len(req.output))
    assert any(diverges(w) for w in WORKLOADS)


def test_an_arrival_overrun_is_caught():
    calls = []
    ignore_arrivals = lambda s, last, horizon, into=None: advance_decode(s, last, None, into)
    assert any(run_workload(w).records != run_workload(w, advance=ignore_arrivals).records for w in WORKLOADS)


def test_not_moved_outside_the_settings_it_covers():
    w = next(w for w in WORKLOADS if lockstep(w)[2] > 0)
    plain, fast, moved = lockstep(w, async_scheduling=True)
    assert moved == 0 and plain.records == fast.records


class FailsAt(FakeModel):
    "A model that fails whenever a request reaches `length` tokens (a function of the tokens, as the move needs)."
    def __init__(self, length): super().__init__(1); self.length = length
    def next_token(self, token_ids):
        if len(token_ids) == self.length: raise ValueError(f"model: no token after {self.length}")
        return super().next_token(token_ids)


def test_a_model_failure_surfaces_where_the_plain_path_raises_it():
    w = Workload("fails", [RequestSpec("a", [1, 2, 3], [], max_tokens=30), RequestSpec("b", [4, 5], [], max_tokens=30)],
                 dict(num_blocks=32, block_size=4, max_num_batched_tokens=64))
    errors = []
    for advance in (None, advance_decode):
        with pytest.raises(ValueError) as e: run_workload(w, model=FailsAt(20), advance=advance)
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "no token after 20" in errors[0]
    s = Scheduler(KVCacheManager(32, 4), model=FailsAt(12), record_trace=False, max_num_batched_tokens=64)
    for r in w.requests: s.add_request(r)
    s.step(); last = s.step()
    before = [(len(r.output), r.request.num_tokens, r.request.num_computed_tokens) for r in s.running]
    assert advance_decode(s, last) == 0  # the model fails inside the move: nothing taken
    assert [(len(r.output), r.request.num_tokens, r.request.num_computed_tokens) for r in s.running] == before


def test_with_the_cpu_offload_tier_every_step_is_plain():
    "A KV connector plans loads and stores at every step: the move stands aside, and the records are vLLM's still."
    from kvref.kv_offload import OffloadConfig
    offload_workloads = load_workloads(ROOT / "golden" / "offload" / "workloads.jsonl")
    for w in offload_workloads[:6]:
        config, calls = OffloadConfig.of(w.config["offload"]), []
        plain = run_workload(w, offload=config)
        fast = run_workload(w, offload=OffloadConfig.of(w.config["offload"]), advance=counting(calls))
        assert fast.records == plain.records and sum(calls) == 0
