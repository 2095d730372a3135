"""A default `kvref sweep` against a default vLLM 0.33: the same Mooncake requests served by vLLM's own `Scheduler`
(driven on the CPU by `tests/scheduler_vllm_support.py`; each request's prompt and output synthesized as kvref's
`replay_mooncake` does) and by kvref, at each cache size: hits, queries, preemptions and steps side by side.

Run (a venv with vLLM 0.33 importable, kvref on the path):
    PYTHONPATH=$PWD:$PWD/tests VENV/bin/python bench/sweep_vs_vllm.py [--trace golden/mooncake/synthetic-trace-last300.jsonl]
        [--blocks 12500,25000] [--no-scheduler-reserve-full-isl] [--async-scheduling]
Prints a markdown table; exits 1 if any column differs.
"""
import argparse
import sys

from kvref.oracle.production_traces import (_check_fits, read_mooncake, replay_mooncake, synthesize_output,
                                     synthesize_prompt)
from scheduler_vllm_support import load_vllm, run


def vllm_workload(requests, num_blocks: int, block_size: int, reserve_full_isl: bool, async_scheduling: bool) -> dict:
    "The trace as a scheduler workload: every request waiting from step 0, outputs scripted as kvref's replay does."
    reqs = [{"id": f"m{i}", "prompt": synthesize_prompt(r.hash_ids, r.input_length),
             "max_tokens": max(1, r.output_length), "output": synthesize_output(i, max(1, r.output_length)),
             "arrival": 0, "after": None, "think": 0, "priority": 0, "cache_salt": None} for i, r in enumerate(requests)]
    config = {"num_blocks": num_blocks, "block_size": block_size, "max_num_batched_tokens": 8192, "max_num_seqs": 256,
              "enable_chunked_prefill": True, "long_prefill_token_threshold": 0, "policy": "fcfs",
              "enable_prefix_caching": True, "max_model_len": _check_fits(requests, num_blocks, block_size),
              "scheduler_reserve_full_isl": reserve_full_isl, "hash_algo": "sha256", "model_seed": 0,
              "async_scheduling": async_scheduling}
    return {"name": "mooncake", "config": config, "requests": reqs}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--trace", default="golden/mooncake/synthetic-trace-last300.jsonl")
    p.add_argument("--blocks", default="12500,25000")
    p.add_argument("--scheduler-reserve-full-isl", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=False)
    a = p.parse_args()
    requests, v, differ = list(read_mooncake(a.trace)), load_vllm(), False
    print(f"{len(requests)} requests, scheduler_reserve_full_isl={a.scheduler_reserve_full_isl}, async_scheduling={a.async_scheduling}\n")
    print("| blocks | side | hit rate | hits | queries | preemptions | steps |\n|---|---|---|---|---|---|---|")
    for n in [int(b) for b in a.blocks.split(",")]:
        records = run(vllm_workload(requests, n, 16, a.scheduler_reserve_full_isl, a.async_scheduling), v)
        hits, queries = sum(r["stats"]["hits"] for r in records), sum(r["stats"]["queries"] for r in records)
        theirs = (hits, queries, sum(len(r["preempted"]) for r in records), len(records))
        k = replay_mooncake(requests, n, scheduler_reserve_full_isl=a.scheduler_reserve_full_isl, async_scheduling=a.async_scheduling)
        ours = (k.hits, k.queries, k.preemptions, k.num_steps)
        differ |= ours != theirs
        for side, (h, q, pre, steps) in (("vLLM 0.33", theirs), ("kvref", ours)):
            print(f"| {n} | {side} | {h / q:.4f} | {h} | {q} | {pre} | {steps} |")
    return int(differ)


if __name__ == "__main__":
    sys.exit(main())
