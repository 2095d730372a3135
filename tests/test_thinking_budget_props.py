"""Thinking budget properties: the spec against a naive rescanning model, and the holder against the spec, step by step."""
import random

import torch
from hypothesis import given, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvref.sample.logits_processors import BatchUpdate, MoveDirectionality
from kvref.sample.sampling_params import SamplingParams
from kvref.sample.thinking_budget import FORCED_LOGIT, ReasoningConfig, ThinkingBudgetStateHolder, contract_forcings
from kvref.sample.thinking_budget_vllm import BEHAVIORS

CONFIGS = [
    ReasoningConfig([100], [200]),
    ReasoningConfig([100, 101], [200, 201, 202]),
    ReasoningConfig([100], [300, 301, 200], natural_reasoning_end_token_ids=[200]),
    ReasoningConfig([100, 101], [200, 201], natural_reasoning_end_token_ids=[201, 200]),
]
ALPHABET = [50, 60, 100, 101, 200, 201, 202, 300, 301]
tokens = st.lists(st.sampled_from(ALPHABET), max_size=14)
budgets = st.one_of(st.none(), st.integers(-1, 6))


# ---------------------------------------------------------------- a deliberately naive model of the contract
def naive_forced_after(seq, S, E, N, B):
    """The token the contract forces after `seq`, re-derived by rescanning the whole list from the start."""
    if B is None or B < 0:
        return None
    def ends(m, j):  # does marker m end exactly at position j of seq?
        return len(m) > 0 and j + 1 >= len(m) and list(seq[j + 1 - len(m):j + 1]) == list(m)
    inside, spent, written = False, 0, None  # written: None while thinking freely, else tokens of E written
    for j in range(len(seq)):
        if not inside:
            if ends(S, j):
                inside, spent, written = True, 0, (0 if B == 0 else None)
            continue
        if written is None:
            if ends(N, j):
                inside = False
                continue
            spent += 1
            if spent == B:  # budget spent: how much of E did the block's own last tokens already write?
                written = 0
                for k in range(1, min(len(E) - 1, spent) + 1):
                    if list(seq[j + 1 - k:j + 1]) == list(E[:k]):
                        written = k
            continue
        if seq[j] == E[written]:
            written += 1
            if written == len(E):
                inside = False
        elif ends(N, j):
            inside = False
        else:
            written = 1 if seq[j] == E[0] else 0
    return E[written] if inside and written is not None else None


def naive_forcings(prompt, output, drafts, cfg, B):
    S, E, N = cfg.reasoning_start_token_ids, cfg.reasoning_end_token_ids, cfg.natural_end
    rows = []
    for r in range(len(drafts) + 1):
        tok = naive_forced_after([*prompt, *output, *drafts[:r]], S, E, N, B)
        if tok is not None:
            rows.append((r, tok))
            if r < len(drafts) and drafts[r] != tok:
                break
    return rows


@given(cfg=st.sampled_from(CONFIGS), prompt=tokens, output=tokens, drafts=st.lists(st.sampled_from(ALPHABET), max_size=4),
       budget=budgets)
def test_spec_matches_naive_rescan(cfg, prompt, output, drafts, budget):
    assert contract_forcings(prompt, output, drafts, cfg, budget) == naive_forcings(prompt, output, drafts, cfg, budget)


@given(cfg=st.sampled_from(CONFIGS), prompt=st.lists(st.sampled_from([50, 60]), max_size=5),
       budget=st.integers(0, 6), seed=st.integers(0, 2**16))
def test_generated_blocks_hold_exactly_the_budget(cfg, prompt, budget, seed):
    "A model that never writes an end marker itself: every block it opens holds exactly `budget` tokens, then E."
    rng = random.Random(seed)
    S, E = list(cfg.reasoning_start_token_ids), list(cfg.reasoning_end_token_ids)
    out, forced = [], []
    for _ in range(40):
        f = contract_forcings(prompt, out, [], cfg, budget)
        out.append(f[0][1] if f else rng.choice([50, 60, 100, 101]))
        forced.append(bool(f))
    i, blocks = 0, 0
    while i < len(out):
        if out[max(0, i + 1 - len(S)):i + 1] != S or forced[i]:
            assert not forced[i]
            i += 1
            continue
        q = next((k for k in range(i + 1, len(out)) if forced[k]), len(out))
        if q == len(out):
            assert len(out) - (i + 1) <= budget
            break
        assert q - (i + 1) == budget and out[q:q + len(E)] == E[:len(out) - q] and all(forced[q:q + len(E)])
        i, blocks = q + len(E), blocks + 1


# ---------------------------------------------------------------- the holder against the spec, step by step
class HolderAgainstSpec(RuleBasedStateMachine):
    "Random batches (add, finish, move, swap, preempt and resume, drafts with random acceptance) under `contract`."
    num_spec = 0
    slots = 4
    behavior = "contract"

    @initialize(cfg=st.sampled_from(CONFIGS), seed=st.integers(0, 2**16))
    def setup(self, cfg, seed):
        self.cfg, self.rng = cfg, random.Random(seed)
        self.holder = BEHAVIORS[self.behavior](cfg, self.slots, self.num_spec)
        self.live, self.parked = {}, []  # slot -> request dict; preempted requests

    def free_slot(self):
        return next(i for i in range(self.slots) if i not in self.live)

    @precondition(lambda self: len(self.live) < self.slots)
    @rule(prompt=tokens, budget=budgets)
    def add(self, prompt, budget):
        self._add({"prompt": prompt, "out": [], "budget": budget})

    def _add(self, req):
        i = self.free_slot()
        self.live[i] = req
        params = SamplingParams(thinking_token_budget=req["budget"])
        self.holder.sync_batch(BatchUpdate(len(self.live), [], [(i, params, req["prompt"], req["out"])], []))

    @precondition(lambda self: self.live)
    @rule(data=st.data(), preempt=st.booleans())
    def finish_or_preempt(self, data, preempt):
        i = data.draw(st.sampled_from(sorted(self.live)))
        req = self.live.pop(i)
        if preempt:
            self.parked.append(req)
        self.holder.sync_batch(BatchUpdate(len(self.live), [i], [], []))

    @precondition(lambda self: self.parked and len(self.live) < self.slots)
    @rule()
    def resume(self):
        self._add(self.parked.pop(0))  # re-added with its prompt and the output so far

    @precondition(lambda self: self.live)
    @rule(data=st.data(), swap=st.booleans())
    def move(self, data, swap):
        i = data.draw(st.sampled_from(sorted(self.live)))
        j = data.draw(st.sampled_from([k for k in range(self.slots) if k != i]))
        if swap:
            self.live[i], self.live[j] = self.live.get(j), self.live[i]
            if self.live[i] is None:
                del self.live[i]
            direction = MoveDirectionality.SWAP
        else:
            if j in self.live:
                return
            self.live[j] = self.live.pop(i)
            direction = MoveDirectionality.UNIDIRECTIONAL
        self.holder.sync_batch(BatchUpdate(len(self.live), [], [], [(i, j, direction)]))

    @rule()
    def step(self):
        rng, n = self.rng, self.slots
        outs = [self.live[i]["out"] if i in self.live else [] for i in range(n)]
        drafts = [[rng.choice(ALPHABET) for _ in range(rng.randint(0, self.num_spec))] if i in self.live else []
                  for i in range(n)]
        expected = {i: contract_forcings(r["prompt"], r["out"], drafts[i], self.cfg, r["budget"])
                    for i, r in self.live.items() if r["budget"] is not None}
        self.holder.update_state(outs, drafts if self.num_spec else None)
        spec = any(drafts)  # a step without drafts makes one plain call (predict_bonus_token=False), as in vLLM
        bonus = self.holder.apply_to_logits(torch.zeros(n, 400), spec, drafts if self.num_spec else None)
        starts = [sum(len(d) for d in drafts[:i]) for i in range(n)]
        target = self.holder.apply_to_logits(torch.zeros(max(starts[-1] + len(drafts[-1]), 1), 400), False, drafts) \
            if spec else None
        want_bonus = sorted((i, t) for i, rows in expected.items() for r, t in rows if r == len(drafts[i]))
        want_target = sorted((starts[i] + r, t) for i, rows in expected.items() for r, t in rows if r < len(drafts[i]))
        got_bonus = sorted(map(tuple, (bonus == FORCED_LOGIT).nonzero().tolist()))
        got_target = sorted(map(tuple, (target == FORCED_LOGIT).nonzero().tolist())) if spec else []
        if self.behavior == "contract":
            assert got_bonus == want_bonus and got_target == want_target
        else:  # vLLM's decisions differ (the departures); it must still force only E's tokens, one per row
            E = set(self.cfg.reasoning_end_token_ids)
            assert all(t in E for _, t in got_bonus + got_target)
            assert len({r for r, _ in got_bonus}) == len(got_bonus) and len({r for r, _ in got_target}) == len(got_target)
        forced_rows = {i: {} for i in range(n)}  # what was actually forced drives the emitted tokens
        for row, t in got_bonus:
            forced_rows[row][len(drafts[row]) if spec else 0] = t
        for row, t in got_target:
            i = max(k for k in range(n) if starts[k] <= row and drafts[k])
            forced_rows[i][row - starts[i]] = t
        for i, req in self.live.items():  # greedy verification with a model that agrees with each draft at random
            rows = forced_rows[i]
            for r, d in enumerate(drafts[i]):
                tok = rows.get(r, d if rng.random() < 0.7 else rng.choice(ALPHABET))
                req["out"].append(tok)
                if tok != d:
                    break
            else:
                req["out"].append(rows.get(len(drafts[i]), rng.choice(ALPHABET)))

    @invariant()
    def tracked_rows_are_the_budgeted_ones(self):
        if hasattr(self, "holder"):
            assert self.holder.has_tracked_requests() == any(r["budget"] is not None for r in self.live.values())


class SpeculativeHolderAgainstSpec(HolderAgainstSpec):
    num_spec = 3


class VllmHolderRuns(SpeculativeHolderAgainstSpec):
    "The vllm_0_33_v1 behaviour on the same random batches: no crash, only E's tokens forced, one per row."
    behavior = "vllm_0_33_v1"


TestHolderAgainstSpec = HolderAgainstSpec.TestCase
TestVllmHolderRuns = VllmHolderRuns.TestCase
TestSpeculativeHolderAgainstSpec = SpeculativeHolderAgainstSpec.TestCase
