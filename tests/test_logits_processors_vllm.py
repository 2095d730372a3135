"""kvref's `PersistentBatch` against vLLM 0.33's own `InputBatch` (`vllm/v1/worker/gpu_input_batch.py` at v0.33.0)
on the CPU: the same removals, additions, condense and swaps, step by step, must leave the same slots and hand the
processors the same `BatchUpdate` (removed, added slots, moved). vLLM condenses once per step, as its model runner's
`_update_states` does; kvref condenses, swaps, then `refresh` (which condenses again and must change nothing).
Skipped, with the reason, where vLLM 0.33 does not import."""
import random

import pytest

from kvref.sample.logits_processors import PersistentBatch
from kvref.sample.sampling_params import SamplingParams


def _load_vllm():
    try:
        import torch, vllm
        import vllm.v1.worker.gpu_input_batch as gib
        from vllm import SamplingParams as VllmSamplingParams
    except Exception as e:  # any import failure means: no usable vLLM here
        return None, pytest.mark.skip(reason=f"vLLM 0.33 is not importable here ({type(e).__name__}: {e})")
    if not vllm.__version__.startswith("0.33."):
        return None, pytest.mark.skip(reason=f"needs vLLM 0.33.x, found {vllm.__version__}")
    gib.PIN_MEMORY = False  # a CPU-only machine has no pinned-memory allocator
    return (torch, gib, VllmSamplingParams), pytest.mark.skipif(False, reason="")


VLLM, pytestmark = _load_vllm()
MAX = 6


class Both:
    "One kvref `PersistentBatch` and one vLLM `InputBatch`, fed the same operations."
    def __init__(self):
        torch, gib, _ = VLLM
        self.kv = PersistentBatch(MAX)
        self.vl = gib.InputBatch(max_num_reqs=MAX, max_model_len=64, max_num_batched_tokens=64,
                                 device=torch.device("cpu"), vocab_size=32, block_sizes=[16], max_num_blocks_per_req=[4])

    def arrive(self, rid: str):
        _, gib, VllmSamplingParams = VLLM
        got = self.kv.add_request(rid, SamplingParams(), [0, 1], [])
        want = self.vl.add_request(gib.CachedRequestState(
            req_id=rid, prompt_token_ids=[0, 1], mm_features=[], sampling_params=VllmSamplingParams(), generator=None,
            block_ids=([],), num_computed_tokens=0, output_token_ids=[]))
        assert got == want, (rid, got, want)

    def finish(self, rid: str):
        assert self.kv.remove_request(rid) == self.vl.remove_request(rid)

    def step(self, swaps: list[tuple[int, int]]):
        self.kv.condense(); self.vl.condense()
        n = self.kv.num_reqs
        for i, j in swaps:
            if i < n and j < n and i != j: self.kv.swap_states(i, j); self.vl.swap_states(i, j)
        got, want = self.kv.refresh(), self.vl.batch_update_builder.get_and_reset(self.vl.num_reqs)
        assert self.kv.req_ids == self.vl._req_ids, (self.kv.req_ids, self.vl._req_ids)
        assert (got is None) == (want is None)
        if got is not None:
            assert summary(got) == summary(want), (summary(got), summary(want))


def summary(update) -> tuple:
    "An update in plain values (the two libraries' `MoveDirectionality` enums are different classes)."
    moved = [(i, j, d.name) for i, j, d in update.moved]
    return update.batch_size, list(update.removed), [a[0] for a in update.added], moved


def test_the_double_condense_case_matches_vllm():
    "The steps that once broke kvref's second condense: r2, r3, r6 finish from r4 r2 r3 r5 r6."
    b = Both()
    b.arrive("r0"); b.step([]); b.finish("r0"); b.step([])
    for r in ("r1", "r2", "r3"): b.arrive(r)
    b.step([])
    b.finish("r1")
    for r in ("r4", "r5", "r6"): b.arrive(r)
    b.step([])
    for r in ("r2", "r3", "r6"): b.finish(r)
    b.step([])
    assert b.kv.req_ids == ["r4", "r5"]


@pytest.mark.parametrize("seed", range(40))
def test_random_steps_match_vllm(seed):
    "Random finishes, arrivals and swaps: the same slots and the same update every step."
    rng, b, live, next_id = random.Random(seed), Both(), [], 0
    for _ in range(30):
        for rid in rng.sample(live, rng.randint(0, len(live))):
            b.finish(rid); live.remove(rid)
        for _ in range(rng.randint(0, MAX - len(live))):
            b.arrive(f"r{next_id}"); live.append(f"r{next_id}"); next_id += 1
        b.step([(rng.randrange(MAX), rng.randrange(MAX)) for _ in range(rng.randint(0, 2))])
