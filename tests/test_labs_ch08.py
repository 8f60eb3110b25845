"""Chapter 08's graded exercises accept the reference and name the common wrong answers."""

from __future__ import annotations

import pytest

from minillm.labs import check
from minillm.labs.ch08 import (
    HIT_CASES,
    MAX_IMBALANCE,
    MIN_HIT_RATE,
    ROUTING_CASES,
    case_hits,
    constructed_prompts,
    run_router,
)
from minillm.labs.solutions.ch08 import MODEL_ANSWERS, SOLUTIONS, hit_tokens
from minillm.sim.router import PrefixAwareRouter, RoundRobinRouter


@pytest.mark.ch08
@pytest.mark.parametrize("exercise", sorted(SOLUTIONS))
def test_reference_solutions_pass(exercise: str) -> None:
    assert check(exercise, SOLUTIONS[exercise]) is True


@pytest.mark.ch08
def test_routing_cases_separate_the_routers() -> None:
    """The thresholds sit between what the blind and the unbounded routers get and what a
    bounded cache-aware router gets, with room on both sides."""
    case = ROUTING_CASES[0]
    blind = run_router(RoundRobinRouter(), case)
    aware = run_router(PrefixAwareRouter(8), case)
    assert blind.hit_rate < MIN_HIT_RATE - 0.1 < aware.hit_rate - 0.1
    assert blind.imbalance == 1.0 and aware.imbalance < MAX_IMBALANCE - 0.1
    assert aware.ttft_p99 < blind.ttft_p99 / 5, "the hits show in the tail of TTFT"
    unbounded = run_router(PrefixAwareRouter(float("inf")), ROUTING_CASES[1])
    assert unbounded.imbalance > MAX_IMBALANCE + 0.2


@pytest.mark.ch08
def test_constructed_prompts_exercise_each_rule() -> None:
    """Each case has a shared prefix that ends mid-block, a prompt whose best match is not the
    prompt just before it, and a repeated prompt of whole blocks (its last block is recomputed,
    for the step must compute the last token)."""
    for seed, block_size in HIT_CASES:
        prompts = constructed_prompts(seed, block_size)
        assert prompts[3] == prompts[0] and prompts[7] == prompts[6]
        assert len(prompts[0]) % block_size != 0 and len(prompts[7]) % block_size == 0
        hits = list(case_hits(seed, block_size))
        assert hits == hit_tokens(prompts, block_size)
        assert hits[0] == 0 and hits[-1] == 0 and hits[5] > 0
        assert hits[3] == len(prompts[3]) // block_size * block_size
        assert hits[7] == len(prompts[7]) - block_size, "the last token's block is recomputed"


def token_level(prompts, block_size):
    def lcp(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n
    return [max((lcp(p, q) for q in prompts[:i]), default=0) for i, p in enumerate(prompts)]


def no_cap(prompts, block_size):
    return [t // block_size * block_size for t in token_level(prompts, block_size)]


def previous_only(prompts, block_size):
    return [hit_tokens(prompts[max(0, i - 1):i + 1], block_size)[-1] if i else 0
            for i in range(len(prompts))]


def rounds_up(prompts, block_size):
    return [-(-min(t, len(p) - 1) // block_size) * block_size
            for t, p in zip(token_level(prompts, block_size), prompts)]


@pytest.mark.ch08
@pytest.mark.parametrize("wrong, hint", [
    (token_level, "whole blocks only"),
    (no_cap, "cannot reuse its last token"),
    (previous_only, "not just the one before"),
    (rounds_up, "round down, not up"),
])
def test_hit_count_wrong_answers_are_named(wrong, hint: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert check("08.2", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch08
@pytest.mark.parametrize("wrong, hint", [
    (lambda spec, replicas: 0, "piled onto few replicas"),
    (RoundRobinRouter(), "cached_prefix_len"),
    (PrefixAwareRouter(float("inf")), "bound the load"),
    (lambda spec, replicas: replicas[0], "never the ReplicaView"),
    (lambda spec, replicas: len(replicas), "range(4)"),
])
def test_router_wrong_answers_are_named(wrong, hint: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert check("08.1", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch08
def test_open_ended_exercises_have_model_answers() -> None:
    assert sorted(MODEL_ANSWERS) == ["08.3", "08.4"]
    assert all("Rubric" in answer for answer in MODEL_ANSWERS.values())
