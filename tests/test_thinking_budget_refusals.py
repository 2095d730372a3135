"""Thinking budget (issue 12): the reported vLLM reproducer, and refused calls that change nothing."""
import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from kvref.sample.logits_processors import BatchUpdate, MoveDirectionality
from kvref.sample.sampling_params import SamplingParams
from kvref.sample.thinking_budget import (ReasoningConfig, ThinkingBudgetStateHolder,
                                   contract_forcings, force_index, greedy_run, think_state)
from kvref.cli import check_runs
from kvref.sample.thinking_budget_vllm import BEHAVIORS

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "thinking_budget"
REPORTED = GOLDEN / "reported-vllm-0.33-thinking-budget.json"
CFG1, CFG3 = ReasoningConfig([100], [200]), ReasoningConfig([100], [200, 201, 202])


def add(*rows, budget=2, prompt=()):
    "A BatchUpdate adding one budgeted request per (index, live output list)."
    return BatchUpdate(len(rows), [], [(i, SamplingParams(thinking_token_budget=budget), list(prompt), out)
                                      for i, out in rows], [])


def snapshot(holder):
    return copy.deepcopy(vars(holder))


# ---------------------------------------------------------------- the reported reproducer (a wrong answer)
@pytest.mark.parametrize("behavior", BEHAVIORS)
def test_reported_prompt_block_closed_by_the_model_gives_the_next_block_its_budget(behavior):
    "vLLM 0.33 forces at position 4; kvref's vllm_0_33_v1 used to keep counting the closed block and never force."
    case = json.loads(REPORTED.read_text())["cases"][0]
    run = greedy_run(BEHAVIORS[behavior](ReasoningConfig(case["start"], case["end"]), 1),
                     case["prompt"], case["wish"], case["budget"])
    assert run == (case["emitted"], case["forced"]) == ([200, 100, 60, 60, 200, 60], [False] * 4 + [True, False])
    assert check_runs(str(REPORTED), behavior) == (1, None)


def test_recorded_runs_still_match_vllm():
    assert check_runs(str(GOLDEN / "vllm-0.33-thinking-budget-v1.json")) == (30, None)


@pytest.mark.parametrize("prompt", [[1, 2, 100], [1, 2, 100, 60]])
@pytest.mark.parametrize("gap", [0, 1, 3])
@pytest.mark.parametrize("content", [0, 1, 2])
def test_after_the_model_closes_the_prompts_block_vllm_counts_the_next_block_like_the_contract(prompt, gap, content):
    "Single-token S and E, no drafts: no documented departure applies, so the two behaviours must agree."
    wants = [60] * gap + [200] + [50] * content + [100] + [60] * 6
    runs = [greedy_run(BEHAVIORS[b](CFG1, 1), prompt, wants, 2) for b in BEHAVIORS]
    assert runs[0] == runs[1] and runs[0][1].count(True) >= 1


# ---------------------------------------------------------------- refused calls change nothing
@pytest.mark.parametrize("behavior", BEHAVIORS)
def test_update_state_refusing_row_k_leaves_rows_before_it_alone(behavior):
    h = BEHAVIORS[behavior](CFG1, 4, 2)
    h.sync_batch(add((0, []), (1, [])))
    h.update_state([[100], [100]], [[60], [60]])
    before = snapshot(h)
    with pytest.raises(ValueError, match="batch row 1 has 3 drafts"):
        h.update_state([[100, 60, 60], [100, 60]], [[60], [60, 60, 60]])
    assert snapshot(h) == before


@pytest.mark.parametrize("behavior", BEHAVIORS)
def test_sync_batch_refusing_an_added_request_applies_none_of_the_update(behavior):
    h = BEHAVIORS[behavior](CFG1, 4)
    h.sync_batch(add((0, [100])))
    before = snapshot(h)
    bad = BatchUpdate(2, [0], [(1, SamplingParams(thinking_token_budget=3), [], []),
                               (2, SamplingParams(thinking_token_budget=1), ["x"], [])], [])
    with pytest.raises(TypeError, match="prompt_tok_ids must hold ints"):
        h.sync_batch(bad)
    assert snapshot(h) == before


@pytest.mark.parametrize("behavior", BEHAVIORS)
def test_apply_to_logits_refuses_before_touching_state_or_logits(behavior):
    h = BEHAVIORS[behavior](CFG3, 4, 2)
    out = [100, 60]
    h.sync_batch(add((0, out), budget=1))
    h.update_state([out], [[60, 60]])
    before, logits = snapshot(h), torch.zeros(1, 150)
    with pytest.raises(ValueError, match=r"forced token 202 \(reasoning_end_token_ids\) is outside the 150 logits"):
        h.apply_to_logits(logits, True, [[60, 60]])
    assert snapshot(h) == before and not logits.any()
    with pytest.raises(TypeError, match="logits must be a torch.Tensor"):
        h.apply_to_logits(np.zeros((1, 300), np.float32), True, [[60, 60]])
    assert snapshot(h) == before


def test_named_errors_for_wrong_types():
    h = ThinkingBudgetStateHolder(CFG1, 2)
    h.sync_batch(add((0, [100])))
    for call, exc, msg in [
        (lambda: ThinkingBudgetStateHolder("S=100", 2), TypeError, "reasoning_config must be a ReasoningConfig"),
        (lambda: ThinkingBudgetStateHolder(CFG1, True), TypeError, "max_num_seqs must be an int >= 1"),
        (lambda: h.sync_batch("add row 0"), TypeError, "batch_update must be a BatchUpdate"),
        (lambda: h.sync_batch(add((7, []))), ValueError, "batch row 7 is outside the holder's 2 rows"),
        (lambda: h.sync_batch(BatchUpdate(1, [], [], [(0, 1, "swap")])), TypeError, "MoveDirectionality"),
        (lambda: h.sync_batch(BatchUpdate(1, [], [(0, object(), [], [])], [])), TypeError, "thinking_token_budget"),
        (lambda: h.update_state(None, None), TypeError, "output_token_ids must be a list of token lists"),
        (lambda: h.update_state([7], None), TypeError, "output_token_ids[0] must be a list of token ids"),
        (lambda: h.update_state([[100]], [[True]]), TypeError, "spec_token_ids[0] must hold ints"),
        (lambda: h.update_state([[100]], None, ["0"]), TypeError, "each repeat_indices entry must be an int"),
        (lambda: h.apply_to_logits(torch.zeros(1, 300, dtype=torch.long), False, None), TypeError, "floating point"),
        (lambda: h.apply_to_logits(torch.zeros(1, 300), "yes", None), TypeError, "predict_bonus_token must be a bool"),
        (lambda: contract_forcings([], [100], [], None, 2), TypeError, "config must be a ReasoningConfig"),
        (lambda: contract_forcings([], None, [], CFG1, 2), TypeError, "output must be a list of token ids"),
        (lambda: think_state(None, CFG1, 2), TypeError, "tokens must be a list of token ids"),
        (lambda: force_index(True, 2), TypeError, "remaining must be an int"),
        (lambda: force_index(1, -1), ValueError, "num_drafts must be an int >= 0"),
        (lambda: greedy_run("holder", [], [1], 2), TypeError, "holder must be a ThinkingBudgetStateHolder"),
        (lambda: greedy_run(ThinkingBudgetStateHolder(CFG1, 1), [], [1.5], 2), TypeError, "wants must hold ints"),
    ]:
        with pytest.raises(exc, match=__import__("re").escape(msg)):
            call()


# ---------------------------------------------------------------- memory and empty checks
def test_greedy_run_refuses_a_token_id_beyond_its_scripted_vocabulary_instead_of_allocating_it():
    "End token 1e10 used to allocate 40 GB of logits per step; 2**21 shows the limit without the blow-up."
    for cfg, wants in [(ReasoningConfig([100], [2 ** 21]), [100, 60]), (CFG1, [100, 2 ** 21])]:
        holder = ThinkingBudgetStateHolder(cfg, 1)
        with pytest.raises(ValueError, match="greedy_run's scripted vocabulary is capped at 1048576"):
            greedy_run(holder, [], wants, 1)
        assert not holder.has_tracked_requests()  # refused before the request was added


def test_check_runs_refuses_to_compare_nothing(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text('{"cases": []}')
    with pytest.raises(ValueError, match="no runs, nothing to check"):
        check_runs(str(empty))


@pytest.mark.parametrize("text, msg", [
    ('{"cases": [{"start": [100], "end": [200]}]}', "case 0: a run lacks field(s) budget"),
    ('{"cases": [{"start": [100], "end": [10000000000], "budget": 1, "prompt": [], "wish": [100, 60], '
     '"emitted": [100, 60], "forced": [false, false]}]}', "from 0 to 1048575"),
    ('{"cases": [{"start": [100], "end": [200], "budget": 1, "prompt": [], "wish": 5, "emitted": [], '
     '"forced": []}]}', "case 0: wish must be a list of token ids"),
    ('[' * 100000 + ']' * 100000, "nested too deeply"),
])
def test_check_runs_names_bad_files(tmp_path, text, msg):
    path = tmp_path / "runs.json"
    path.write_text(text)
    with pytest.raises((ValueError, TypeError), match=__import__("re").escape(msg)):
        check_runs(str(path))


# ---------------------------------------------------------------- property: any refused call changes nothing
BAD_CALLS = [
    lambda h: h.sync_batch(BatchUpdate(1, [0], [(1, SamplingParams(thinking_token_budget=1), [], []),
                                                (2, SamplingParams(thinking_token_budget=1), [-1], [])], [])),
    lambda h: h.sync_batch(BatchUpdate(1, [1], [], [(0, 99, MoveDirectionality.SWAP)])),
    lambda h: h.sync_batch(BatchUpdate(1, [True], [], [])),
    lambda h: h.update_state([[100, 60], [100, 60, 60]], [[60], [60] * 9]),
    lambda h: h.update_state([[100, 60], "oops"], None),
    lambda h: h.update_state([[100, 60]], [[60, "x"]]),
    lambda h: h.apply_to_logits(torch.zeros(2, 100), True, [[60], [60]]),
    lambda h: h.apply_to_logits(torch.zeros(2, 300).numpy(), False, None),
    lambda h: h.apply_to_logits(torch.zeros(300), False, None),
    lambda h: h.apply_to_logits(torch.zeros(2, 300), False, [[60, 60, 60, 60], []]),
]


@settings(max_examples=60, deadline=None)
@given(behavior=st.sampled_from(list(BEHAVIORS)), num_spec=st.integers(0, 2), budget=st.integers(0, 4),
       steps=st.lists(st.sampled_from([50, 60, 100, 200]), max_size=8), bad=st.sampled_from(range(len(BAD_CALLS))))
def test_every_refused_call_leaves_the_holder_unchanged(behavior, num_spec, budget, steps, bad):
    h = BEHAVIORS[behavior](CFG3, 3, num_spec)
    outs = [[], []]
    h.sync_batch(add((0, outs[0]), (1, outs[1]), budget=budget, prompt=[1]))
    for token in steps:
        drafts = [[60] * num_spec, []] if num_spec else None
        h.update_state(outs, drafts)
        h.apply_to_logits(torch.zeros(2, 300), True if num_spec else False, drafts)
        for out in outs: out.append(token)
    h.update_state(outs, [[60] * num_spec, []] if num_spec else None)
    before = snapshot(h)
    with pytest.raises((TypeError, ValueError)):
        BAD_CALLS[bad](h)
    assert snapshot(h) == before
