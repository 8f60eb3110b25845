"""Graded exercises of chapter 11 (beyond one GPU): a ring all-reduce, and the capstone.

11.1: the reader's all_reduce_time(nbytes, n, bandwidth, latency), graded against
minillm.collectives.all_reduce_time on messages from latency-bound (kilobytes) to
bandwidth-bound (gigabytes) and groups of 1 to 16 GPUs, each common slip named by the ratio it
leaves (one pass instead of two, whole buffers instead of shards, no latency); then inside the
multi-GPU model, where it must give the same TPOT for Llama-3-70B at TP 2, 4 and 8.

11.2: the capstone, on the student's own brief, minillm.capstone.student_scenario(name) (drawn
from a hash of the name, as chapter 09's diagnosis lab deals its deployments). The answer is a
dict: the student's name, the deployment (vLLM's names), the goodput and $/1M tokens
minillm.capstone.evaluate gives it on that brief, and the reasoning. The grader checks what the
configuration achieves, by one ruler: it must fit the GPUs given, meet the SLO (90% of requests)
and reach the recipe's goodput (recommend(), worked at grade time: no answer key ships) within
GOODPUT_TOLERANCE; the figures reported must be the deployment's own on that brief, so a
classmate's figures (another brief) fail. The reasoning is graded by an instructor on RUBRIC
(capstone_rubric.py), which asks for what recommend().explain() does not give; the grader only
asks that it be a paragraph of text and prints the rubric beside the figures to check it
against, since a keyword match can tell that a word is there, not that an argument holds. A
failing deployment gets a hint from what failed: the layout, the chunk that breaks TPOT, the
queue that breaks TTFT.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any
from unittest import mock

from minillm.labs.capstone_rubric import MIN_WORDS, RUBRIC_POINTS, rubric_text
from minillm.labs.capstone_rubric import RUBRIC as RUBRIC
from minillm.labs.exercise import Exercise, expect_callable

SIGNATURE = "all_reduce_time(nbytes, n, bandwidth, latency) -> seconds"
GOODPUT_TOLERANCE = 0.10  # the reader's goodput may trail the recipe's by 10%: a few hundred
# simulated requests are a noisy sample, and a deployment as good as the recipe's passes
REPORT_TOLERANCE = 0.005  # evaluate() is deterministic: 0.5% is three significant figures'
# rounding; a classmate's figures, from another brief, miss it (test_labs_ch11 checks)
DEPLOYMENT_KEYS = ("tensor_parallel_size", "pipeline_parallel_size", "replicas", "max_num_seqs",
                   "max_num_batched_tokens")

# (bytes, GPUs, link name): a training gradient (GB) and a decode step's activations (KB), on
# NVLink inside a node and InfiniBand between nodes; n = 1 has nothing to reduce. The
# bandwidth-bound cases come first: a wrong factor shows there as a clean ratio.
CASES = [(4e9, 8, "NVLink 4"), (4e9, 2, "NVLink 3"), (2e9, 16, "InfiniBand NDR"),
         (16e3, 8, "NVLink 4"), (1e6, 4, "NVLink 4"), (64e3, 16, "InfiniBand NDR"),
         (5e8, 1, "NVLink 4")]


def _check_cases(all_reduce_time: Callable) -> None:
    from minillm.calc.collectives import all_reduce_time as reference
    from minillm.calc.hardware import LINKS

    for nbytes, n, name in CASES:
        link = LINKS[name]
        got = all_reduce_time(nbytes, n, link.bandwidth, link.latency)
        want = reference(nbytes, n, link)
        assert isinstance(got, (int, float)) and math.isfinite(got), (
            f"all_reduce_time({nbytes:g}, {n}, ...) returned {got!r}; return seconds, a float")
        if n == 1:
            assert got == 0, (f"one GPU has nothing to reduce with: return 0 for n = 1, not "
                              f"{got:.3g} s")
            continue
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        where = (f"{nbytes:,.0f} bytes over {n} GPUs on {name} ({link.bandwidth / 1e9:g} GB/s, "
                 f"{link.latency * 1e6:g} us a step): you give {got * 1e6:.4g} us, the ring "
                 f"takes {want * 1e6:.4g} us")
        wire = 2 * (n - 1) / n * nbytes / link.bandwidth  # the bandwidth term of the reference
        if math.isclose(got, wire, rel_tol=1e-3):
            raise AssertionError(f"{where}. Every one of the 2 (n - 1) ring steps waits for its "
                                 "hop as well: add 2 (n - 1) x latency")
        ratio = got / want
        if math.isclose(ratio, 0.5, rel_tol=0.05):
            hint = ("a ring all-reduce is two passes, a reduce-scatter then an all-gather, "
                    "each n - 1 steps")
        elif math.isclose(ratio, n, rel_tol=0.05):
            hint = "each step moves one shard, nbytes / n, not the whole buffer"
        else:
            hint = ("2 (n - 1) steps, each sending nbytes / n over the link and paying one "
                    "latency: 2 (n - 1) / n x nbytes / bandwidth + 2 (n - 1) x latency")
        raise AssertionError(f"{where}: {hint}")


def _check_in_model(all_reduce_time: Callable) -> tuple[float, int]:
    """The reader's function in place of the model's: the same TPOT at TP 2, 4, 8. Returns the
    all-reduces' share of a TP-8 decode step and their number, for the message."""
    from minillm.calc import parallel
    from minillm.calc.models import as_config

    def adapted(nbytes: float, n: int, link: Any) -> float:
        return all_reduce_time(nbytes, n, link.bandwidth, link.latency)

    want = {tp: parallel.decode_tpot("llama-3-70b", "H100-SXM", parallel.ParallelConfig(tp), 32,
                                     2048) for tp in (2, 4, 8)}
    with mock.patch.object(parallel, "all_reduce_time", adapted):
        for tp, tpot in want.items():
            got = parallel.decode_tpot("llama-3-70b", "H100-SXM", parallel.ParallelConfig(tp), 32,
                                       2048)
            assert math.isclose(got, tpot, rel_tol=1e-6), (
                f"in the multi-GPU model, Llama-3-70B at TP {tp} (batch 32, 2,048 tokens) gets a "
                f"TPOT of {got * 1e3:.3f} ms with your function, {tpot * 1e3:.3f} ms with the "
                "model's: check the argument order (nbytes, n, bandwidth, latency)")
    step = parallel.parallel_step_time("llama-3-70b", "H100-SXM", [(1, 2048)] * 32,
                                       parallel.ParallelConfig(8))
    return step.communication_time / step.time, 2 * as_config("llama-3-70b").num_hidden_layers


def grade_all_reduce(all_reduce_time: Any) -> str:
    expect_callable(all_reduce_time, SIGNATURE)
    _check_cases(all_reduce_time)
    share, count = _check_in_model(all_reduce_time)
    return (f"right from kilobytes (latency-bound) to gigabytes (bandwidth-bound) and 1 to 16 "
            f"GPUs, and the model's TPOT is unchanged with it; in a TP-8 decode step of "
            f"Llama-3-70B, its {count} all-reduces are {share:.0%} of the time as rings "
            "(modelled); NVLink SHARP, ParallelConfig(all_reduce='nvls'), cuts that share")


# ---- 11.2: the capstone -----------------------------------------------------------------------

def _answer_fields(answer: Any) -> dict[str, Any]:
    assert isinstance(answer, dict), (
        "answer with a dict (student, the deployment, goodput, dollars_per_million_tokens, "
        f"reasoning) or a function of no arguments that returns one, not a "
        f"{type(answer).__name__}")
    missing = [k for k in ("student", *DEPLOYMENT_KEYS, "goodput", "dollars_per_million_tokens",
                           "reasoning") if k not in answer]
    assert not missing, (
        f"the answer lacks {', '.join(missing)}"
        + (" (student: your name as on the course roll; your brief is "
           "minillm.capstone.student_scenario(name))" if "student" in missing else ""))
    return answer


def _scenario(answer: dict[str, Any]) -> Any:
    from minillm.plan.capstone import student_scenario

    try:
        return student_scenario(answer["student"])
    except ValueError as err:
        raise AssertionError(str(err)) from None


def _deployment(answer: dict[str, Any]) -> Any:
    """The Deployment the answer names: the required knobs, and any other field of Deployment
    (enable_chunked_prefill, quantization, ...) the answer sets."""
    from minillm.plan.deployment import Deployment

    names = {f.name for f in dataclasses.fields(Deployment)}
    knobs = {k: v for k, v in answer.items() if k in names}
    try:
        return Deployment(**knobs)
    except ValueError as err:
        raise AssertionError(str(err)) from None


def _check_fits(scenario: Any, deployment: Any) -> Any:
    from minillm.calc import parallel
    from minillm.plan.capstone import evaluate
    from minillm.plan.deployment import GPU_MEMORY_UTILIZATION
    from minillm.quant.schemes import get_scheme

    assert deployment.gpus <= scenario.gpus, (
        f"TP {deployment.tensor_parallel_size} x PP {deployment.pipeline_parallel_size} x "
        f"{deployment.replicas} replicas is {deployment.gpus} GPUs; the budget of "
        f"{scenario.name} is {scenario.gpus}")
    layout = deployment.layout
    quantization = getattr(deployment, "quantization", None)  # weights in bf16 when None
    weight_bytes = 2 if quantization is None else get_scheme(quantization).weight_bytes
    weights = parallel.weight_bytes_per_gpu(scenario.model, layout, weight_bytes)
    usable = scenario.hardware.memory * GPU_MEMORY_UTILIZATION
    assert weights < usable, (
        f"on {scenario.name}: at TP {layout.tensor_parallel_size} x PP "
        f"{layout.pipeline_parallel_size} the weights of {scenario.model} alone take "
        f"{weights / 1e9:.1f} GB per GPU of {usable / 1e9:.0f} GB usable: split the model "
        "wider (section 1)")
    try:
        return evaluate(scenario, deployment)
    except ValueError as err:
        raise AssertionError(f"{err}") from None


def _failure_hint(scenario: Any, deployment: Any, run: Any) -> str:
    """Why a deployment misses the SLO, from the metric that fails most and the knobs."""
    from minillm.calc import parallel
    from minillm.plan.deployment import GPU_MEMORY_UTILIZATION, typical_length

    layout, slo = deployment.layout, scenario.slo
    shares = ", ".join(f"{name.upper()} {run.shares[name]:.0%}" for name in slo)
    typical = typical_length(scenario.workload())  # the context of a late decode, as step 3
    lines = [f"{run.attainment:.0%} of requests meet the SLO, 90% must ({shares} meet each "
             "bound)"]
    if run.shares.get("tpot", 1) < 0.9:
        budget = deployment.max_num_batched_tokens
        step = parallel.parallel_step_time(
            scenario.model, scenario.hardware,
            [(budget, budget)] + [(1, typical)] * (deployment.max_num_seqs - 1), layout).time
        lines.append(
            f"TPOT: a step with a {budget}-token prefill chunk beside "
            f"{deployment.max_num_seqs - 1} decodes takes {step * 1e3:.0f} ms (modelled) against "
            f"a bound of {slo['tpot'] * 1e3:.0f} ms; every decode in that step waits for it. "
            "Pick max_num_batched_tokens from the mixed step (the recipe's step 3)")
    if run.shares.get("ttft", 1) < 0.9:
        room = parallel.max_concurrency(scenario.model, scenario.hardware, layout, typical,
                                        GPU_MEMORY_UTILIZATION)
        lines.append(
            f"TTFT: prompts queue. At TP {layout.tensor_parallel_size} x PP "
            f"{layout.pipeline_parallel_size} the KV cache holds {room} sequences of typical "
            f"length ({typical} tokens) per engine, and max_num_seqs is "
            f"{deployment.max_num_seqs}: more engines prefill more prompts at once, and "
            "max_num_seqs from the KV formula keeps the batch from becoming the queue")
    narrower = parallel.ParallelConfig(layout.tensor_parallel_size // 2 or 1,
                                       layout.pipeline_parallel_size)
    if (layout.tensor_parallel_size > 1 and parallel.max_concurrency(
            scenario.model, scenario.hardware, narrower, typical, GPU_MEMORY_UTILIZATION) >= 4):
        lines.append(
            f"TP {layout.tensor_parallel_size} where TP {narrower.tensor_parallel_size} already "
            "holds the weights and the K/V of many sequences: the wider TP buys a little "
            "TPOT, but halves the engines (replicas) that share the traffic")
    if deployment.gpus < scenario.gpus:
        lines.append(f"{scenario.gpus - deployment.gpus} of the {scenario.gpus} GPUs sit idle")
    return "; ".join(lines)


def _check_reported(answer: dict[str, Any], scenario: Any, run: Any) -> None:
    """The figures reported must be the deployment's own on the student's brief: evaluate() is
    deterministic, so only rounding separates them, and figures worked on a classmate's brief
    (another rate, GPU price, traffic) miss."""
    for key, figure in (("goodput", run.goodput),
                        ("dollars_per_million_tokens", run.dollars_per_million_tokens)):
        value = answer[key]
        assert (isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isclose(value, figure, rel_tol=REPORT_TOLERANCE)), (
            f"you report {key} = {value!r}; your deployment on {scenario.name} gives "
            f"{figure:.3f}: report what evaluate(student_scenario({answer['student']!r}), "
            "deployment) measures, to three significant figures or more (figures worked on "
            "another brief do not carry over)")


def grade_capstone(answer: Any) -> str:
    from minillm.plan.capstone import reference

    if callable(answer):  # the function that works the answer out, as the reference is written
        answer = answer()
    answer = _answer_fields(answer)
    scenario = _scenario(answer)
    deployment = _deployment(answer)
    run = _check_fits(scenario, deployment)
    assert run.attainment >= 0.9, f"on {scenario.name}: {_failure_hint(scenario, deployment, run)}"
    recipe = reference(scenario)  # the bar, worked by the library at grade time: no answer key
    assert run.goodput >= (1 - GOODPUT_TOLERANCE) * recipe.goodput, (
        f"the SLO is met, but the goodput is {run.goodput:.2f} req/s against the recipe's "
        f"{recipe.goodput:.2f} on {scenario.name} (modelled): "
        f"{_failure_hint(scenario, deployment, run)}")
    _check_reported(answer, scenario, run)
    reasoning = answer["reasoning"]
    assert isinstance(reasoning, str) and len(reasoning.split()) >= MIN_WORDS, (
        f"the configuration passes; now write your reasoning as text, at least {MIN_WORDS} "
        "words, for your instructor to grade on this rubric:\n" + rubric_text())
    quantized = getattr(deployment, "quantization", None)
    return (f"{scenario.name}: TP {deployment.tensor_parallel_size} x PP "
            f"{deployment.pipeline_parallel_size} x {deployment.replicas} replicas"
            f"{f' ({quantized} weights)' if quantized else ''} meets the SLO "
            f"for {run.attainment:.0%} of requests (TTFT {run.shares['ttft']:.0%}, TPOT "
            f"{run.shares['tpot']:.0%}) at {run.goodput:.2f} req/s of goodput and "
            f"${run.dollars_per_million_tokens:.2f} per 1M tokens (the recipe: "
            f"{recipe.goodput:.2f} req/s, ${recipe.dollars_per_million_tokens:.2f}; modelled). "
            f"The configuration passes. Your instructor grades the reasoning "
            f"({len(reasoning.split())} words) on this rubric, {RUBRIC_POINTS} points, checking "
            "its figures against your brief:\n" + rubric_text())


EXERCISES = [
    Exercise("11.1", "A ring all-reduce",
             "Write all_reduce_time(nbytes, n, bandwidth, latency): the seconds of a ring "
             "all-reduce of nbytes over n GPUs, links of bandwidth bytes/s one way per GPU and "
             "latency seconds per ring step.",
             grade_all_reduce),
    Exercise("11.2", "The capstone: deploy your own brief",
             "Choose a deployment for your own brief, minillm.capstone.student_scenario(name) "
             "(python -m minillm.labs capstone NAME prints it), and answer with a dict of "
             "student (the name), tensor_parallel_size, pipeline_parallel_size, replicas, "
             "max_num_seqs, max_num_batched_tokens, the goodput and dollars_per_million_tokens "
             "that minillm.capstone.evaluate gives it, and your reasoning on the rubric "
             "(RUBRIC: what recommend().explain() does not give).",
             grade_capstone),
]
