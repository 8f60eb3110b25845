"""Chapter 11's graded exercises accept the reference solutions and name the common wrong ones.

11.1's wrong answers are the slips of a ring all-reduce (one pass, whole buffers, no latency,
a GPU alone paying); 11.2's are the deployments a reader could plausibly pick (the widest TP,
vLLM's default chunk, a TP that leaves no room for K/V, GPUs left idle), each failed with the
hint that points at the recipe's step it skipped, and a classmate's answer, which fails on a
brief of one's own (minillm.capstone.student_scenario)."""

from __future__ import annotations

import dataclasses

import pytest

from minillm.labs import check
from minillm.labs.ch11 import MIN_WORDS, RUBRIC, RUBRIC_POINTS, _failure_hint
from minillm.labs.solutions.ch11 import (
    MODEL_ANSWERS,
    SOLUTIONS,
    STUDENT,
    all_reduce_time,
    capstone,
)
from minillm.plan.capstone import SCENARIOS, evaluate, reference, student_scenario
from minillm.plan.deployment import Deployment

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


STUDENT_TP = "Butler Lampson"  # a chat brief on 8 H100s: Llama-3-70B needs TP, replicas help


@pytest.fixture(scope="module")
def reference_answer() -> dict:
    return capstone()


def test_reference_capstone_passes(reference_answer: dict,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert reference_answer["student"] == STUDENT
    assert check("11.2", reference_answer) is True
    out = capsys.readouterr().out
    assert student_scenario(STUDENT).name in out and "The configuration passes" in out
    assert all(f"- {name} ({points} points):" in out for name, points, _ in RUBRIC)
    assert len(reference_answer["reasoning"].split()) >= MIN_WORDS
    assert check("11.2", SOLUTIONS["11.2"]) is True  # the function that works it out


def answer(student: str, deployment: Deployment, **extra) -> dict:
    """A deployment with figures that are its own on student's brief (so only the deployment
    is judged), and a reasoning of the length the grader asks for."""
    run = evaluate(student_scenario(student), deployment)
    return {"student": student, **dataclasses.asdict(deployment),
            "goodput": run.goodput, "dollars_per_million_tokens": run.dollars_per_million_tokens,
            "reasoning": " ".join(["word"] * MIN_WORDS), **extra}


@pytest.mark.parametrize("student", [STUDENT, STUDENT_TP, "Fran Allen", "Radia Perlman"])
def test_a_copied_answer_fails_for_another_student(student: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Each student's recipe deployment, with its figures, passes for them and fails for every
    other: the briefs differ (model, GPUs, price, rate, traffic), so the figures do."""
    mine = answer(student, reference(student_scenario(student)).deployment)
    assert check("11.2", mine) is True
    capsys.readouterr()
    for other in {STUDENT, STUDENT_TP, "Fran Allen", "Radia Perlman"} - {student}:
        assert check("11.2", {**mine, "student": other}) is False
        out = capsys.readouterr().out
        assert out.startswith("FAIL") and student_scenario(other).name in out, out


@pytest.mark.parametrize("deployment, words", [
    (Deployment(2, replicas=4), ["TTFT: prompts queue", "holds 2 sequences"]),
    (Deployment(4, max_num_seqs=134, max_num_batched_tokens=512), ["4 of the 8 GPUs sit idle"]),
    (Deployment(1, replicas=8), ["weights of llama-3-70b alone take 141.1 GB per GPU"]),
    (Deployment(4, replicas=4), ["16 GPUs; the budget of chat brief of Butler Lampson is 8"]),
], ids=["tp2-no-kv-room", "idle-gpus", "tp1", "over-budget"])
def test_naive_deployments_fail_with_a_hint(deployment: Deployment, words: list[str],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    fields = {"student": STUDENT_TP, **dataclasses.asdict(deployment), "goodput": 1.0,
              "dollars_per_million_tokens": 1.0, "reasoning": "..."}
    assert check("11.2", fields) is False
    out = capsys.readouterr().out
    assert out.startswith("FAIL") and all(w in out for w in words), out


def test_the_chapters_brief_fails_the_obvious_answer_with_the_chunk_hint() -> None:
    """On chat-70b (the chapter's worked brief) every GPU in one engine with vLLM's defaults
    misses the SLO, and the hint names the chunk (the recipe's step 3) and the wider TP."""
    scenario = SCENARIOS["chat-70b"]
    naive = Deployment(8)
    run = evaluate(scenario, naive)
    assert run.attainment < 0.9
    hint = _failure_hint(scenario, naive, run)
    assert "TPOT: a step with a 8192-token prefill chunk" in hint
    assert "TP 8 where TP 4 already holds the weights" in hint


def test_reported_figures_must_be_the_deployments_own(reference_answer: dict,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    inflated = {**reference_answer, "goodput": reference_answer["goodput"] * 1.02}
    assert check("11.2", inflated) is False
    assert "report what evaluate(student_scenario('Ada Lovelace')" in capsys.readouterr().out
    cheap = {**reference_answer, "dollars_per_million_tokens": 0.5}
    assert check("11.2", cheap) is False
    assert "you report dollars_per_million_tokens = 0.5" in capsys.readouterr().out
    rounded = {**reference_answer, "goodput": float(f"{reference_answer['goodput']:.3g}")}
    assert check("11.2", rounded) is True  # three significant figures are the deployment's own


def test_the_reasoning_is_left_to_the_instructor_not_matched(reference_answer: dict,
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    """A sentence fails (write a paragraph, here is the rubric); a paragraph passes the
    configuration whatever words it uses, and the verdict hands the rubric to the instructor."""
    assert check("11.2", {**reference_answer, "reasoning": "TP 8 because it works."}) is False
    out = capsys.readouterr().out
    assert f"at least {MIN_WORDS} words" in out and "- recipe (2 points)" in out
    plain = " ".join(["because"] * MIN_WORDS)  # none of the old rubric's keywords
    assert check("11.2", {**reference_answer, "reasoning": plain}) is True
    out = capsys.readouterr().out
    assert f"Your instructor grades the reasoning ({MIN_WORDS} words)" in out
    assert f"{RUBRIC_POINTS} points" in out and RUBRIC_POINTS == 10


def test_the_rubric_asks_for_what_explain_does_not_give() -> None:
    """explain() prints the recipe's layout, KV, chunk, search and cost lines; every rubric item
    asks for a run of the student's own beyond them (a step past the choice, a rival layout, a
    rate sweep, an overhead, the difference from the recipe)."""
    explained = reference(student_scenario(STUDENT)).explain()
    assert explained.count("\n") >= 3
    asks = {name: what for name, _, what in RUBRIC}
    assert "one step past" in asks["binding"] and "evaluated" in asks["binding"]
    assert "rate=" in asks["headroom"] and "fewest GPUs" in asks["headroom"]
    assert "overhead" in asks["trust"] and "recommend()" in asks["recipe"]
    for phrase in ("one step past", "fewest GPUs", "overhead"):
        assert phrase not in explained


def test_malformed_answers_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert check("11.2", [4, 1, 2]) is False
    assert "answer with a dict" in capsys.readouterr().out
    assert check("11.2", {"tensor_parallel_size": 4}) is False
    assert "lacks student, pipeline_parallel_size" in capsys.readouterr().out
    fields = answer(STUDENT_TP, Deployment(4, replicas=2))
    assert check("11.2", {**fields, "student": ""}) is False
    assert "student must be a non-empty name" in capsys.readouterr().out
    no_name = {k: v for k, v in fields.items() if k != "student"}
    assert check("11.2", no_name) is False
    assert "student_scenario(name)" in capsys.readouterr().out
    assert check("11.2", {**fields, "max_num_seqs": 0}) is False
    assert "max_num_seqs must be a positive int, got 0" in capsys.readouterr().out


def test_open_ended_exercises_have_model_answers() -> None:
    assert set(MODEL_ANSWERS) == {"11.3", "11.4"}
    for text in MODEL_ANSWERS.values():
        assert text.startswith("**Model answer.**") and "modelled" in text.lower()
