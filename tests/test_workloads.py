"""Workload generators: determinism, trace well-formedness, admission rules (`after`, `max_live`)."""
import json
from collections import Counter

import pytest
from hypothesis import given, strategies as st

from kvref.oracle.workloads import (WORKLOADS, RequestSpec, Workload, adversarial_tiny_pool, lora_mix, multi_turn_chat,
                             salted_tenants, shared_system_prompts, to_trace, write_trace)

SMALL = dict(shared_system_prompts=dict(num_prompts=3, num_users=4, system_len=20, user_len=5, output_len=3),
             multi_turn_chat=dict(num_conversations=3, num_turns=3, turn_len=7, output_len=4),
             long_documents=dict(num_documents=2, questions_per_document=3, document_len=50, question_len=4, output_len=2),
             adversarial_tiny_pool=dict(num_requests=10),
             salted_tenants=dict(num_tenants=3, requests_per_tenant=2, system_len=20, user_len=4, output_len=2),
             lora_mix=dict(num_adapters=2, num_requests=7, system_len=20, user_len=4, output_len=2))


def check_trace(workload: Workload, ops: list[dict], max_live: int):
    "Every request: add, then schedule/append pairs, then free; appends emit its scripted output; live <= max_live."
    assert ops[0] == {"op": "config", **workload.config}
    specs = {r.id: r for r in workload.requests}
    live, freed, emitted = set(), [], {r: [] for r in specs}
    for op in ops[1:]:
        rid = op["id"]
        if op["op"] == "add":
            assert rid not in live and rid not in freed
            spec = specs[rid]
            assert op["prompt"] == spec.prompt and op["cache_salt"] == spec.cache_salt and op["lora"] == spec.lora
            assert spec.after is None or spec.after in freed, f"{rid} admitted before {spec.after} finished"
            live.add(rid)
            assert len(live) <= max_live
        else:
            assert rid in live, f"{op} for a request that is not live"
            if op["op"] == "append": emitted[rid].extend(op["tokens"])
            if op["op"] == "free": live.remove(rid); freed.append(rid)
    assert not live and sorted(freed) == sorted(specs)
    assert all(emitted[r] == specs[r].output for r in specs)
    kinds = Counter(op["op"] for op in ops)
    assert kinds["schedule"] == kinds["append"] == sum(len(r.output) for r in workload.requests)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_generator_traces_are_well_formed(name):
    w = WORKLOADS[name](**SMALL[name])
    for max_live in (1, 3, 100):
        check_trace(w, to_trace(w, max_live=max_live), max_live)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_generators_are_deterministic_in_the_seed(name):
    a, b, c = (WORKLOADS[name](**SMALL[name], seed=s) for s in (1, 1, 2))
    assert a == b and a != c


def test_shared_prompts_share_exactly_the_system_prompt():
    w = shared_system_prompts(num_prompts=2, num_users=3, system_len=10, user_len=3)
    by_prompt = {}
    for r in w.requests: by_prompt.setdefault(r.id[:2], []).append(r.prompt)
    assert {tuple(p[:10]) for p in by_prompt["p0"]} == {tuple(by_prompt["p0"][0][:10])}
    assert by_prompt["p0"][0][:10] != by_prompt["p1"][0][:10]


def test_multi_turn_prompts_extend_the_previous_turn_and_its_answer():
    w = multi_turn_chat(num_conversations=2, num_turns=4, turn_len=3, output_len=2)
    specs = {r.id: r for r in w.requests}
    for r in w.requests:
        if r.after:
            prev = specs[r.after]
            assert r.prompt[:len(prev.prompt) + 2] == prev.prompt + prev.output


def test_tenants_and_adapters():
    assert len({r.cache_salt for r in salted_tenants(num_tenants=5).requests}) == 5
    names = [r.lora["name"] if r.lora else None for r in lora_mix(num_adapters=2, num_requests=6).requests]
    assert names == [None, "adapter-0", "adapter-1"] * 2


def test_tiny_pool_is_tiny():
    w = adversarial_tiny_pool(num_requests=5, num_blocks=4, block_size=2)
    assert w.config["num_blocks"] == 4 and all(1 <= len(r.prompt) <= 12 for r in w.requests)


@given(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 4), st.booleans()), min_size=1, max_size=12),
       st.integers(1, 5))
def test_to_trace_with_random_chains(shape, max_live):
    reqs = []
    for i, (plen, olen, chain) in enumerate(shape):
        after = f"r{i - 1}" if chain and i else None
        reqs.append(RequestSpec(f"r{i}", list(range(plen)), list(range(100, 100 + olen)), after=after))
    w = Workload("random", reqs, {"num_blocks": 8, "block_size": 2})
    check_trace(w, to_trace(w, max_live=max_live), max_live)


def test_bad_inputs():
    with pytest.raises(ValueError, match="num_users must be an int >= 1"): shared_system_prompts(num_users=0)
    with pytest.raises(TypeError, match="max_live must be an int"): to_trace(shared_system_prompts(), max_live=None)
    with pytest.raises(ValueError, match="block_size must be an int >= 1"): lora_mix(block_size=0)
    loop = [RequestSpec("a", [1], [2], after="b"), RequestSpec("b", [1], [2], after="a")]
    with pytest.raises(ValueError, match="waits for"): to_trace(Workload("loop", loop))


def test_write_trace_roundtrip(tmp_path):
    ops = to_trace(salted_tenants(**SMALL["salted_tenants"]))
    path = write_trace(ops, tmp_path / "t.jsonl")
    assert [json.loads(l) for l in path.read_text().splitlines()] == ops


def test_stats_count_a_lookup_once_per_scheduling_not_per_retry():
    from kvref.oracle.replay import replay
    from kvref.oracle.workloads import replay_stats
    ops = [{"op": "config", "num_blocks": 4, "block_size": 2, "enable_caching": True, "hash_algo": "sha256"},
           {"op": "add", "id": "a", "prompt": [1, 2, 3, 4, 5]}, {"op": "schedule", "id": "a"},
           {"op": "add", "id": "b", "prompt": [1, 2, 3, 4, 9]},
           {"op": "schedule", "id": "b"}, {"op": "schedule", "id": "b"},  # refused twice: a holds every block
           {"op": "free", "id": "a"}, {"op": "schedule", "id": "b"}]
    s = replay_stats(ops, replay(ops))
    assert (s.lookups, s.lookup_attempts, s.refusals) == (2, 4, 2)
    assert (s.hit_tokens, s.queried_tokens, s.hit_blocks, s.queried_blocks) == (4, 10, 2, 4)
    assert (s.evictions, s.peak_blocks_used, s.num_usable_blocks, s.preemptions) == (0, 3, 3, 0)
    assert "| lookups (once per scheduling) | 2 |" in s.report() and "40.0% (4/10)" in s.report()


def test_stats_on_scheduler_runs_match_the_run():
    from kvref.oracle.replay import replay
    from kvref.core.scheduler import run_workload
    from kvref.oracle.workloads import replay_stats
    w = adversarial_tiny_pool(num_requests=12, num_blocks=8, block_size=2, seed=4)
    run = run_workload(w, max_num_batched_tokens=8, max_num_seqs=4)
    s = replay_stats(run.trace, replay(run.trace))
    assert s.num_requests == 12 and s.preemptions == run.num_preemptions
    assert s.lookups == 12 + run.num_preemptions  # one per scheduling: first, and after every preemption
    assert s.lookup_attempts >= s.lookups and 0 < s.peak_usage <= 1


# ---- wrong types and sizes: named errors (issue 12) ----

@pytest.mark.parametrize("name", sorted(WORKLOADS))
@pytest.mark.parametrize("kwargs, error, message", [
    (dict(seed="x"), TypeError, "seed must be an int"), (dict(seed=1.5), TypeError, "seed must be an int"),
    (dict(block_size=True), TypeError, "block_size must be an int"), (dict(num_blocks=0), ValueError, "num_blocks must be an int >= 1"),
    (dict(block_size=None), TypeError, "block_size must be an int")])
def test_generators_refuse_bad_arguments_by_name(name, kwargs, error, message):
    with pytest.raises(error, match=message): WORKLOADS[name](**kwargs)


@pytest.mark.parametrize("fields, error, message", [
    (dict(id=None), TypeError, "request id must be a non-empty str"),
    (dict(prompt="abc"), TypeError, "prompt must be a list"),
    (dict(prompt=[1.0]), ValueError, "token ids must be ints in"),
    (dict(output=[2 ** 64]), ValueError, "token ids must be ints in"),
    (dict(lora={"name": "x", "path": 3}), ValueError, "lora must be None or a dict"),
    (dict(lora={"name": "x", "path": "p", "extra": 1}), ValueError, "lora must be None or a dict"),
    (dict(cache_salt=b"s"), TypeError, "cache_salt must be a str or None"),
    (dict(priority=1.5), TypeError, "priority must be an int")])
def test_request_spec_refuses_bad_fields_by_name(fields, error, message):
    with pytest.raises(error, match=message): RequestSpec(**{**dict(id="a", prompt=[1], output=[2]), **fields})


def test_workloads_are_checked_when_built_and_when_used():
    with pytest.raises(TypeError, match="requests must be a list of RequestSpec"): Workload("w", [("a", [1], [2])])
    with pytest.raises(TypeError, match="config must be a dict"): Workload("w", [], config=None)
    with pytest.raises(TypeError, match="workload must be a Workload"): to_trace({"requests": []})
    w = shared_system_prompts(num_prompts=1, num_users=2)
    w.requests[1].prompt = [1, -1]
    with pytest.raises(ValueError, match="request 'p0u1' prompt: token ids must be ints"): to_trace(w)
    w.requests[1].prompt, w.requests[1].after = [1], "p0u1"  # waits for itself
    with pytest.raises(ValueError, match="'p0u1' waits for 'p0u1', which never runs"): to_trace(w)
