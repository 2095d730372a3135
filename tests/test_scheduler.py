"""Scheduler invariants under hypothesis: budgets, no starvation, preemption keeps outputs, blocks come back,
and every run's trace replays to the decisions the scheduler saw."""
import pytest
from hypothesis import given, settings, strategies as st

from kvref.kv_cache_manager import KVCacheManager
from kvref.replay import replay
from kvref.scheduler import FakeModel, RequestStatus, Scheduler, run_workload
from kvref.workloads import RequestSpec, Workload, multi_turn_chat, shared_system_prompts

requests_st = st.lists(st.tuples(st.integers(0, 3),  # shared-prefix family
                                 st.integers(1, 14),  # prompt length
                                 st.integers(1, 6),  # max tokens
                                 st.integers(0, 2)),  # priority
                       min_size=1, max_size=10)


def make(specs, num_blocks, block_size, budget, max_seqs, policy="fcfs", behavior="vllm_0_33", record=True):
    s = Scheduler(KVCacheManager(num_blocks, block_size, behavior=behavior), budget, max_seqs,
                  FakeModel(seed=3), policy=policy, record_decisions=record)
    for i, (family, n, max_tokens, prio) in enumerate(specs):
        prompt = [family * 10 + (j % 5) for j in range(n)]
        s.add_request(RequestSpec(f"r{i}", prompt, [], priority=prio), max_tokens=max_tokens)
    return s


def run(s, max_steps=500):
    "Step to completion, checking per-step invariants; return the step outputs."
    outs = []
    while s.requests:
        assert len(outs) < max_steps, "a request starved"
        out = s.step(); outs.append(out)
        assert 0 <= out.total_num_scheduled_tokens <= s.max_num_batched_tokens
        assert all(n >= 1 for n in out.num_scheduled_tokens.values())
        assert len(s.running) <= s.max_num_seqs
        assert not set(out.preempted) & set(out.num_scheduled_tokens)
        for req in s.running: assert req.status is RequestStatus.RUNNING and req.request.num_computed_tokens > 0
        for req in s.waiting: assert req.request.num_computed_tokens == 0 and not s.kv.get_block_ids(req.request_id)
        held = {b for r in s.requests for b in s.kv.get_block_ids(r)}
        assert held.isdisjoint(s.kv.get_free_queue_ids())
    return outs


@given(requests_st, st.integers(2, 12), st.integers(1, 4), st.integers(1, 16), st.integers(1, 4),
       st.sampled_from(["fcfs", "priority"]), st.sampled_from(["vllm_0_33", "design_doc"]))
@settings(deadline=None)
def test_invariants_and_replay(specs, extra_blocks, block_size, budget, max_seqs, policy, behavior):
    # the pool fits the largest request on its own, so nobody starves under FCFS
    need = max(-(-(n + t) // block_size) for _, n, t, _ in specs)
    num_blocks = need + extra_blocks // 4 + (behavior == "vllm_0_33")
    s = make(specs, num_blocks, block_size, budget, max_seqs, policy, behavior)
    run(s)
    # every finished request's blocks are back in the free queue
    usable = num_blocks - (behavior == "vllm_0_33")
    assert s.kv.num_free_blocks == usable and sorted(s.kv.get_free_queue_ids()) == sorted(
        range(num_blocks - usable, num_blocks))
    # every request produced exactly max_tokens tokens
    assert all(len(q.output) == q.max_tokens for q in s.finished.values()) and len(s.finished) == len(specs)
    # the trace replays to exactly the decisions the scheduler saw
    assert list(replay(s.trace, behavior)) == s.decisions


@given(requests_st, st.integers(1, 3), st.integers(1, 12))
@settings(deadline=None)
def test_preemption_does_not_change_outputs(specs, block_size, budget):
    need = max(-(-(n + t) // block_size) for _, n, t, _ in specs)
    tight, roomy = make(specs, need + 1, block_size, budget, 8), make(specs, 400, block_size, budget, 8, record=False)
    run(tight); run(roomy)
    assert {r: q.output for r, q in tight.finished.items()} == {r: q.output for r, q in roomy.finished.items()}


def test_a_tight_pool_preempts_and_resumes():
    s = Scheduler(KVCacheManager(6, 4), max_num_batched_tokens=32)
    for rid, base in (("A", 0), ("B", 50)): s.add_request(RequestSpec(rid, list(range(base, base + 8)), []), max_tokens=6)
    outs = run(s)
    assert [o.preempted for o in outs if o.preempted] == [["B"]]
    assert s.finished["B"].num_preemptions == 1


def test_chunked_prefill_seed_004():
    s = Scheduler(KVCacheManager(32, 4), max_num_batched_tokens=10, max_num_seqs=4)
    for rid, n in (("R1", 3), ("R2", 5), ("R3", 4)):
        s.add_request(RequestSpec(rid, list(range(100 * n, 100 * n + n)), [7] * 4))
    assert [s.step().num_scheduled_tokens for _ in range(3)] == [
        {"R1": 3, "R2": 5, "R3": 2}, {"R1": 1, "R2": 1, "R3": 2}, {"R1": 1, "R2": 1, "R3": 1}]


def test_max_num_seqs_holds_back_waiting_requests():
    s = make([(0, 4, 3, 0)] * 5, 64, 4, 100, 2)
    out = s.step()
    assert list(out.num_scheduled_tokens) == ["r0", "r1"] and len(s.waiting) == 3


def test_prefix_lookup_only_when_first_scheduled():
    "A running request never adopts hits: its schedule ops after the first have hit_tokens 0."
    s = make([(0, 8, 4, 0), (0, 8, 4, 0)], 32, 4, 4, 4)
    run(s)
    firsts = set()
    for op, d in zip(s.trace, s.decisions):
        if op["op"] == "schedule" and d["allocated"]:
            if op["id"] in firsts: assert d["hit_tokens"] == 0
            firsts.add(op["id"])


def test_run_workload_multi_turn_and_replay():
    w = multi_turn_chat(num_conversations=2, num_turns=3, turn_len=6, output_len=3, block_size=4, num_blocks=24)
    r = run_workload(w, max_num_batched_tokens=16)
    assert set(r.outputs) == {x.id for x in w.requests}
    assert all(r.outputs[x.id] == x.output for x in w.requests)  # scripted outputs are emitted as written
    list(replay(r.trace))  # replays without error


def test_priority_policy_preempts_the_largest_priority():
    s = Scheduler(KVCacheManager(7, 4), max_num_batched_tokens=64, policy="priority")
    s.add_request(RequestSpec("low", list(range(8)), [], priority=5), max_tokens=8)
    s.add_request(RequestSpec("high", list(range(50, 58)), [], priority=0), max_tokens=8)
    outs = run(s)
    assert {r for o in outs for r in o.preempted} == {"low"}


def test_bad_inputs():
    kv = KVCacheManager(8, 4)
    with pytest.raises(ValueError, match="max_num_seqs must be an int >= 1"): Scheduler(kv, max_num_seqs=0)
    s = Scheduler(kv)
    s.add_request(RequestSpec("a", [1], [2]))
    with pytest.raises(ValueError, match="'a' was already added"): s.add_request(RequestSpec("a", [1], [2]))
    with pytest.raises(ValueError, match="max_tokens must be >= 1"): s.add_request(RequestSpec("b", [1], []))
    with pytest.raises(ValueError, match="did not finish in 20 steps"):
        run_workload(Workload("big", [RequestSpec("x", list(range(64)), [1])], {"num_blocks": 3, "block_size": 4}),
                     max_steps=20)
