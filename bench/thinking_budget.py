"""Per-step cost of ThinkingBudgetStateHolder with 256 tracked requests as outputs grow (1k -> 100k tokens).

Run: .venv/bin/python bench/thinking_budget.py   (prints a markdown table; numbers go in bench/thinking_budget.md)
"""
import statistics
import sys
import time

import torch

from kvref.sample.logits_processors import BatchUpdate
from kvref.sample.sampling_params import SamplingParams
from kvref.sample.thinking_budget import ReasoningConfig, contract_forcings
from kvref.sample.thinking_budget_vllm import BEHAVIORS

REQS, VOCAB, STEPS = 256, 1024, 100
CFG = ReasoningConfig([100, 101], [200, 201, 202])


def workload(length):
    "256 requests: a quarter never think, the rest think with budgets far away, 16 of them cross theirs mid-run."
    reqs = []
    for i in range(REQS):
        if i % 4 == 0:
            reqs.append(([1, 2], [50] * length, 10**9))
        else:
            budget = length + 2 + (i % 50) if i % 16 == 1 else 10**9
            reqs.append(([1, 100, 101], [60] * length, budget))
    return reqs


def time_holder(behavior, length, num_spec=0, steps=STEPS):
    reqs = workload(length)
    h = BEHAVIORS[behavior](CFG, REQS, num_spec)
    h.sync_batch(BatchUpdate(REQS, [], [(i, SamplingParams(thinking_token_budget=b), p, o)
                                        for i, (p, o, b) in enumerate(reqs)], []))
    outs = [o for _, o, _ in reqs]
    drafts = [[60] * num_spec for _ in range(REQS)] if num_spec else None
    bonus = torch.zeros(REQS, VOCAB)
    target = torch.zeros(REQS * num_spec, VOCAB) if num_spec else None
    h.update_state(outs, drafts)  # the first step reads the whole output once
    samples = []
    for _ in range(steps):
        for o in outs:
            o.append(60 if o[-1] != 50 else 50)
        t0 = time.perf_counter()
        h.update_state(outs, drafts)
        h.apply_to_logits(bonus, bool(num_spec), drafts)
        if num_spec:
            h.apply_to_logits(target, False, drafts)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def time_rescan(length, steps=3):
    "The naive alternative: recompute every request's forcings from all of its tokens each step."
    reqs = workload(length)
    samples = []
    for _ in range(steps):
        t0 = time.perf_counter()
        for p, o, b in reqs:
            contract_forcings(p, o, [], CFG, b)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def main(lengths=(1_000, 10_000, 100_000)):
    print(f"| output tokens | contract us/step | vllm_0_33_v1 us/step | contract, 3 drafts | "
          f"vllm_0_33_v1, 3 drafts | rescan every step (naive) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in lengths:
        row = [time_holder(b, n) for b in BEHAVIORS] + [time_holder(b, n, 3) for b in BEHAVIORS]
        rescan = f"{time_rescan(n):,.0f}" if n <= 1_000 else "-"
        print(f"| {n:,} | " + " | ".join(f"{x:,.0f}" for x in row) + f" | {rescan} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
