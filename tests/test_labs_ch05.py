"""Chapter 05's graded exercises name the common wrong answers, and a reader's admission policy
runs in the real engine."""

from __future__ import annotations

import math

import pytest

from minillm import LLM, SamplingParams
from minillm.labs import check
from minillm.labs.ch05 import use_admission_policy
from minillm.labs.solutions.ch05 import MODEL_ANSWERS, seats_to_fill


def static_sorted(lens: list[int], b: int) -> int:
    lens = sorted(lens)
    return sum(max(lens[i:i + b]) for i in range(0, len(lens), b))


def static_without_last(lens: list[int], b: int) -> int:
    return sum(max(lens[i:i + b]) for i in range(0, len(lens) - len(lens) % b, b))


@pytest.mark.ch05
@pytest.mark.parametrize("wrong, hint", [
    (lambda lens, b: math.ceil(sum(lens) / b), "lower bound"),
    (lambda lens, b: max(lens) * math.ceil(len(lens) / b), "its own longest member"),
    (lambda lens, b: sum(lens), "decode together"),
    (static_sorted, "arrival order"),
    (static_without_last, "partly filled batch"),
])
def test_static_batch_steps_wrong_answers_are_named(wrong, hint: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert check("05.1", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch05
@pytest.mark.parametrize("wrong, hint", [
    (lambda running, seqs, k: seqs - running, "plain continuous batching"),
    (lambda running, seqs, k: seqs if seqs - running >= k else 0, "only the free seats"),
    (lambda running, seqs, k: seqs - running if seqs - running > k else 0, ">= not >"),
    (lambda running, seqs, k: k if seqs - running >= k else 0, "fill every free seat"),
])
def test_seats_to_fill_wrong_answers_are_named(wrong, hint: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert check("05.2", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch05
def test_an_in_between_policy_runs_in_the_engine() -> None:
    """min_free=2 of 4 seats: fewer steps than static, more than continuous; all tokens out."""
    lens = [9, 2, 2, 2, 7, 3, 2, 5]
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in lens]
    prompts = [[5 + i, 6, 7] for i in range(len(lens))]
    steps = {}
    for name, policy in [("continuous", 1), ("between", 2), ("static", 4)]:
        llm = LLM(max_num_seqs=4, num_kv_blocks=64)
        use_admission_policy(llm, seats_to_fill, policy)
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert [len(o.token_ids) for o in outs] == lens
        assert llm.stats()["num_free_blocks"] == llm.stats()["num_blocks"]
        steps[name] = len(llm.trace)
    assert steps["continuous"] <= steps["between"] <= steps["static"]
    assert steps["continuous"] < steps["static"]


@pytest.mark.ch05
def test_the_open_ended_exercise_has_a_model_answer() -> None:
    assert sorted(MODEL_ANSWERS) == ["05.3"]
    assert "Rubric" in MODEL_ANSWERS["05.3"]
