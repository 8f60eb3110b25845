"""Chapter 11's graded exercises accept the reference solutions and name the common wrong ones.

11.1's wrong answers are the slips of a ring all-reduce (one pass, whole buffers, no latency,
a GPU alone paying); 11.2's are the deployments a reader could plausibly pick (the widest TP,
vLLM's default chunk, a TP that leaves no room for K/V, GPUs left idle), each failed with the
hint that points at the recipe's step it skipped."""

from __future__ import annotations

import pytest

from minillm.capstone import SCENARIOS, evaluate
from minillm.deployment import Deployment
from minillm.labs import check
from minillm.labs.ch11 import RUBRIC
from minillm.labs.solutions.ch11 import MODEL_ANSWERS, SOLUTIONS, all_reduce_time, capstone

pytestmark = pytest.mark.ch11


def test_reference_all_reduce_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert check("11.1", SOLUTIONS["11.1"]) is True
    out = capsys.readouterr().out
    assert "160 all-reduces" in out and "(modelled)" in out


def one_pass(nbytes, n, bandwidth, latency):
    """Only the reduce-scatter: half the traffic and half the steps."""
    return 0.0 if n == 1 else (n - 1) / n * nbytes / bandwidth + (n - 1) * latency


def whole_buffers(nbytes, n, bandwidth, latency):
    """Each step sends the whole buffer instead of one shard."""
    return 0.0 if n == 1 else 2 * (n - 1) * nbytes / bandwidth + 2 * (n - 1) * latency


def no_latency(nbytes, n, bandwidth, latency):
    return 0.0 if n == 1 else 2 * (n - 1) / n * nbytes / bandwidth


def alone_pays(nbytes, n, bandwidth, latency):
    """Right for n > 1, but a single GPU is charged a latency."""
    return all_reduce_time(nbytes, n, bandwidth, latency) + (latency if n == 1 else 0.0)


def swapped(nbytes, n, latency, bandwidth):
    """The right formula with the last two arguments read in the wrong order."""
    return all_reduce_time(nbytes, n, bandwidth, latency)


@pytest.mark.parametrize("wrong, words", [
    (one_pass, "two passes"),
    (whole_buffers, "one shard"),
    (no_latency, "add 2 (n - 1) x latency"),
    (alone_pays, "return 0 for n = 1"),
    (swapped, "2 (n - 1) / n x nbytes / bandwidth"),
    (lambda nbytes, n, bandwidth, latency: "fast", "return seconds"),
    (42, "pass a function"),
], ids=["one-pass", "whole-buffers", "no-latency", "alone-pays", "swapped", "not-a-number",
        "not-a-function"])
def test_wrong_all_reduces_fail_with_their_hint(wrong, words: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert check("11.1", wrong) is False
    out = capsys.readouterr().out
    assert out.startswith("FAIL") and words in out, out


@pytest.fixture(scope="module")
def reference_answer() -> dict:
    return capstone()


def test_reference_capstone_passes(reference_answer: dict,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert check("11.2", reference_answer) is True
    out = capsys.readouterr().out
    assert "meets the SLO" in out and all(f"- {name}:" in out for name, *_ in RUBRIC)
    assert check("11.2", SOLUTIONS["11.2"]) is True  # the function that works it out


def answer(deployment: Deployment, **extra) -> dict:
    """A deployment with figures that are its own (so only the deployment is judged)."""
    run = evaluate(SCENARIOS["chat-70b"], deployment)
    reasoning = capstone()["reasoning"]
    return {**deployment.engine_kwargs(), "replicas": deployment.replicas,
            "goodput": run.goodput, "dollars_per_million_tokens": run.dollars_per_million_tokens,
            "reasoning": reasoning, **extra}


@pytest.mark.parametrize("deployment, words", [
    # The naive answer: every GPU in one engine, vLLM's default scheduler settings.
    (Deployment(8), ["TPOT: a step with a 8192-token prefill chunk",
                     "TP 8 where TP 4 already holds the weights"]),
    (Deployment(4, replicas=2), ["8192-token prefill chunk", "the recipe's step 3"]),
    (Deployment(2, replicas=4), ["TTFT: prompts queue", "holds 2 sequences"]),
    (Deployment(4, max_num_seqs=134, max_num_batched_tokens=512), ["4 of the 8 GPUs sit idle"]),
    (Deployment(1, replicas=8), ["weights alone take 141.1 GB per GPU"]),
    (Deployment(4, replicas=4), ["16 GPUs; the budget is 8"]),
], ids=["tp8-defaults", "default-chunk", "tp2-no-kv-room", "idle-gpus", "tp1", "over-budget"])
def test_naive_deployments_fail_with_a_hint(deployment: Deployment, words: list[str],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    fields = {**deployment.engine_kwargs(), "replicas": deployment.replicas, "goodput": 1.0,
              "dollars_per_million_tokens": 1.0, "reasoning": "..."}
    assert check("11.2", fields) is False
    out = capsys.readouterr().out
    assert out.startswith("FAIL") and all(w in out for w in words), out


def test_reported_figures_must_be_the_deployments_own(reference_answer: dict,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    inflated = {**reference_answer, "goodput": reference_answer["goodput"] * 1.3}
    assert check("11.2", inflated) is False
    assert "report what minillm.capstone.evaluate" in capsys.readouterr().out
    cheap = {**reference_answer, "dollars_per_million_tokens": 0.5}
    assert check("11.2", cheap) is False
    assert "you report dollars_per_million_tokens = 0.5" in capsys.readouterr().out


def test_reasoning_is_checked_against_the_rubric(reference_answer: dict,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert check("11.2", {**reference_answer, "reasoning": "TP 4 because it works."}) is False
    assert "at least a paragraph" in capsys.readouterr().out
    # A long reasoning that never mentions the chunk or the cost fails on those items alone.
    vague = ("Layout: TP 4 keeps the weights at 35 GB per GPU, and two replicas share the "
             "traffic. KV: 134 sequences fit, so max_num_seqs is 134. " * 3
             + "It meets the SLO with a good goodput.")
    assert check("11.2", {**reference_answer, "reasoning": vague}) is False
    out = capsys.readouterr().out
    assert "chunk (" in out and "result (" in out and "layout (" not in out, out


def test_malformed_answers_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert check("11.2", [4, 1, 2]) is False
    assert "answer with a dict" in capsys.readouterr().out
    assert check("11.2", {"tensor_parallel_size": 4}) is False
    assert "lacks pipeline_parallel_size" in capsys.readouterr().out
    bad = {**answer(Deployment(4, replicas=2)), "max_num_seqs": 0}
    assert check("11.2", bad) is False
    assert "max_num_seqs must be a positive int, got 0" in capsys.readouterr().out


def test_open_ended_exercises_have_model_answers() -> None:
    assert set(MODEL_ANSWERS) == {"11.3", "11.4"}
    for text in MODEL_ANSWERS.values():
        assert text.startswith("**Model answer.**") and "modelled" in text.lower()
