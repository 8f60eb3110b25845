"""Chapter 09's graded exercise accepts the reference diagnosis and names the common wrong ones.

Each wrong answer below is a rule a reader could plausibly write (the reference with one sign
misread); the grader must fail it and point at the metric that would have told them."""

from __future__ import annotations

import pytest

from minillm.labs import check
from minillm.labs.ch09 import GRADING, MIN_RIGHT, grading_deployment, hint
from minillm.labs.solutions.ch09 import MODEL_ANSWERS, SOLUTIONS, diagnose
from minillm.metrics import percentile
from minillm.plan.diagnosis import CAUSES, Deployment, share_of_prompt_shared


@pytest.mark.ch09
def test_reference_passes_with_every_deployment_right(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    assert check("09.1", SOLUTIONS["09.1"]) is True
    assert f"{len(GRADING)} of {len(GRADING)} right" in capsys.readouterr().out


@pytest.mark.ch09
def test_grading_set_holds_every_cause_twice() -> None:
    assert sorted(cause for _, cause in GRADING) == sorted(CAUSES * 2)
    assert len(GRADING) - MIN_RIGHT == 2
    assert all(share_of_prompt_shared(grading_deployment(i)) > 0.9
               for i, (_, cause) in enumerate(GRADING) if cause == "healthy")


def stalls(d: Deployment) -> bool:
    gaps = [gap for m in d.metrics for gap in m.itl]
    return max(gaps) > 10 * percentile(gaps, 50)


def stall_means_prefill(d: Deployment) -> str:
    """Blames any long decode stall on a long prefill, before looking at preemptions."""
    return "long_prefill_blocking" if stalls(d) else diagnose(d)


def throughput_only(d: Deployment) -> str:
    """Never compares TPOT with the SLO: great throughput looks healthy."""
    answer = diagnose(d)
    return "healthy" if answer == "batch_too_large" else answer


def sharing_means_no_cache(d: Deployment) -> str:
    """Calls shared prompts a fault without checking whether prefill reused them."""
    answer = diagnose(d)
    return "no_prefix_caching" if answer == "healthy" and share_of_prompt_shared(d) > 0.5 \
        else answer


def cache_blind(d: Deployment) -> str:
    """Never looks at prompt sharing: redundant prefill passes for healthy."""
    answer = diagnose(d)
    return "healthy" if answer == "no_prefix_caching" else answer


def queue_and_small_batch_means_static(d: Deployment) -> str:
    """Calls any queue with a small batch static batching, full or not."""
    answer = diagnose(d)
    return "static_batching" if answer == "memory_bound_small_batch" else answer


@pytest.mark.ch09
@pytest.mark.parametrize("wrong, words", [
    (lambda d: "healthy", "for every deployment"),
    (lambda d: "kv_pressure", "for every deployment"),
    (stall_means_prefill, "preemption storm a prefill problem"),
    (throughput_only, "you judged by throughput"),
    (sharing_means_no_cache, "shared prompts are not a fault"),
    (cache_blind, "nothing was reused"),
    (queue_and_small_batch_means_static, "never grows"),
    (lambda d: "oom", "return one of the causes"),
], ids=["constant-healthy", "constant-kv", "stall-is-prefill", "throughput-only",
        "sharing-is-sick", "cache-blind", "small-batch-is-static", "not-a-cause"])
def test_common_wrong_answers_fail_with_their_hint(wrong, words: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert check("09.1", wrong) is False
    out = capsys.readouterr().out
    assert out.startswith("FAIL  09.1") and words in out and "Traceback" not in out


@pytest.mark.ch09
def test_one_slip_passes_and_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    first = grading_deployment(0)  # a static_batching deployment

    def one_slip(d: Deployment) -> str:
        return "memory_bound_small_batch" if d is first else diagnose(d)

    assert check("09.1", one_slip) is True
    out = capsys.readouterr().out
    assert f"{len(GRADING) - 1} of {len(GRADING)} right; you missed one" in out
    assert "compare the largest batch with the mean batch" in out


@pytest.mark.ch09
def test_every_cause_has_a_hint_that_names_a_metric() -> None:
    for cause in CAUSES:
        other = "healthy" if cause != "healthy" else "kv_pressure"
        text = hint(cause, other)
        assert any(word in text for word in ("stats()", "trace", "tpot", "batch", "prefill",
                                             "preempt", "queue"))


@pytest.mark.ch09
def test_the_open_ended_exercises_have_model_answers_with_figures() -> None:
    assert sorted(MODEL_ANSWERS) == ["09.2", "09.3"]
    for answer in MODEL_ANSWERS.values():
        assert answer.startswith("**Model answer.**") and any(c.isdigit() for c in answer)


def batch_cap(seats: int):
    def policy(request, scheduler) -> bool:
        return request.priority == 0 or sum(r.priority >= 1 for r in scheduler.running) < seats
    return policy


@pytest.mark.ch09
def test_seat_share_reference_passes_inside_the_real_scheduler(
        capsys: pytest.CaptureFixture[str]) -> None:
    calls = []

    def counted(request, scheduler) -> bool:
        calls.append(type(scheduler).__name__)
        return SOLUTIONS["09.4"](request, scheduler)

    assert check("09.4", counted) is True
    assert "PASS  09.4" in capsys.readouterr().out
    assert calls and set(calls) == {"Scheduler"}, "the reader's rule runs in the engine's own"


@pytest.mark.ch09
@pytest.mark.parametrize("wrong, words", [
    (lambda r, s: True, "over the 1 s SLO"),  # no rule: the jobs take every seat
    (batch_cap(60), "over the 1 s SLO"),  # too few seats left for the chats' load
    (batch_cap(16), "held to too few seats"),  # chats fast, jobs starved of seats
    (lambda r, s: r.priority == 0, "the scheduler stopped"),  # jobs never admitted
    (lambda r, s: 1, "return True (it may take a seat now) or False"),
], ids=["no-rule", "chat-share-too-small", "batch-share-too-small", "never-batch", "not-bool"])
def test_seat_share_wrong_answers_fail_with_their_hint(wrong, words: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert check("09.4", wrong) is False
    out = capsys.readouterr().out
    assert out.startswith("FAIL  09.4") and words in out and "Traceback" not in out


@pytest.mark.ch09
def test_the_unfilled_seat_share_stub_is_reported_as_not_done(
        capsys: pytest.CaptureFixture[str]) -> None:
    def seat_share(request, scheduler):
        raise NotImplementedError  # the chapter's stub, called from inside the scheduler

    assert check("09.4", seat_share) is False
    assert "not done yet" in capsys.readouterr().out
