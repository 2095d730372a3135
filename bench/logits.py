"""Cost of kvref's V1 logits processors on CPU: `update_state` per step and `apply` per processor.

Batch 256, vocabulary 128k (131072), float32 logits. The unit is one `torch.softmax` over the same logits.
Run: .venv/bin/python bench/logits.py [--vocab N] [--batch N] [--repeats N]
"""
import argparse
import random
import statistics
import time

import torch

from kvref.sample.logits_processors import (
    LogitBiasLogitsProcessor, LogitsProcessorConfig, MinPLogitsProcessor, MinTokensLogitsProcessor, PersistentBatch,
    build_logitsprocs,
)
from kvref.sample.sampling_params import SamplingParams


def typical_params(rng: random.Random, vocab: int) -> SamplingParams:
    """A mix: half the requests use min_p, a quarter logit_bias (8 tokens), a quarter min_tokens (2 stop ids)."""
    return SamplingParams(
        min_p=0.05 if rng.random() < 0.5 else 0.0,
        logit_bias={rng.randrange(vocab): 1.0 for _ in range(8)} if rng.random() < 0.25 else None,
        min_tokens=64 if rng.random() < 0.25 else 0, max_tokens=128,
        stop_token_ids=[rng.randrange(vocab), rng.randrange(vocab)])


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=131072)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--churn", type=int, default=4, help="requests removed and added per churn step")
    a = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rng = random.Random(0)
    cpu = torch.device("cpu")
    config = LogitsProcessorConfig(max_num_seqs=a.batch)
    procs = build_logitsprocs(config, cpu, False, False)
    batch = PersistentBatch(a.batch, procs)
    outputs = {}
    for i in range(a.batch):
        outputs[f"r{i}"] = []
        batch.add_request(f"r{i}", typical_params(rng, a.vocab), None, outputs[f"r{i}"])
    batch.refresh()
    by_name = {type(p).__name__: p for p in procs.all}
    names = [MinTokensLogitsProcessor.__name__, LogitBiasLogitsProcessor.__name__, MinPLogitsProcessor.__name__]

    # update_state, no change: the processors get None (MinTokens still checks its tracked requests' lengths).
    idle = {n: [] for n in names}
    for _ in range(a.repeats * 20):
        for n in names:
            idle[n].append(timed(lambda: by_name[n].update_state(None)))

    # update_state with churn: k removals then k additions, condensed, one BatchUpdate.
    def churn_step(k):
        nonlocal next_id
        for rid in rng.sample(sorted(batch.req_id_to_index), k):
            batch.remove_request(rid)
        for _ in range(k):
            outputs[f"r{next_id}"] = []
            batch.add_request(f"r{next_id}", typical_params(rng, a.vocab), None, outputs[f"r{next_id}"])
            next_id += 1
        t0 = time.perf_counter()
        batch.condense()
        update = batch.batch_update_builder.get_and_reset(batch.num_reqs)
        per = {n: timed(lambda: by_name[n].update_state(update)) for n in names}
        return per, time.perf_counter() - t0

    next_id = a.batch
    churn, churn_total = {n: [] for n in names}, []
    for _ in range(a.repeats * 4):
        per, total = churn_step(a.churn)
        for n in names:
            churn[n].append(per[n])
        churn_total.append(total)
    sweep = {}
    for k in (1, 4, 16, 64):
        runs = [churn_step(k)[0] for _ in range(a.repeats * 2)]
        sweep[k] = {n: statistics.median(r[n] for r in runs) * 1e6 for n in names}

    # apply per processor, on fresh logits each time.
    logits = torch.randn(a.batch, a.vocab)
    soft, applied = [], {n: [] for n in names}
    for _ in range(a.repeats):
        soft.append(timed(lambda: torch.softmax(logits, dim=-1)))
        for n in names:
            x = logits.clone()
            applied[n].append(timed(lambda: by_name[n].apply(x)))
    unit = statistics.median(soft)

    us = lambda xs: statistics.median(xs) * 1e6
    print(f"batch {a.batch}, vocab {a.vocab}, churn {a.churn} removed + {a.churn} added per step; "
          f"unit = softmax over [{a.batch}, {a.vocab}] = {unit * 1e3:.1f} ms (median of {a.repeats})\n")
    print("| processor | update_state, no change (us) | update_state, churn (us) | apply (ms) | apply / softmax |")
    print("|---|---:|---:|---:|---:|")
    for n in names:
        print(f"| {n} | {us(idle[n]):.1f} | {us(churn[n]):.1f} | {statistics.median(applied[n]) * 1e3:.2f} | "
              f"{statistics.median(applied[n]) / unit:.3f} |")
    print(f"| condense + BatchUpdate + all three, churn step | | {us(churn_total):.1f} | | |")
    tracked = len(by_name[MinTokensLogitsProcessor.__name__].min_toks)
    print("\n| churn k (removed = added) | " + " | ".join(f"{n} (us)" for n in names) + " |")
    print("|---:|" + "---:|" * len(names))
    for k, row in sweep.items():
        print(f"| {k} | " + " | ".join(f"{row[n]:.1f}" for n in names) + " |")
    print(f"\nMinTokens tracks {tracked} requests (its no-change update scans them); "
          f"LogitBias holds {sum(map(len, by_name[LogitBiasLogitsProcessor.__name__].biases.values()))} biases "
          f"(a churn step that touches a biased request rebuilds all of them).")


if __name__ == "__main__":
    main()
