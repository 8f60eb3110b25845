"""Graded exercise of chapter 09 (scheduling under pressure): diagnose a sick deployment.

09.1 hands the reader's diagnose(deployment) -> cause the mystery deployments of fixed seeds
(minillm.diagnosis: simulated, modelled on H100-SXM and H200 GPUs), two of each cause in
minillm.diagnosis.CAUSES, and asks for at least MIN_RIGHT of them right with every cause
recognised at least once (so mistaking one cause for another throughout fails). A wrong answer is
answered with a hint naming the metric that tells the two causes apart; the common confusions
have their own.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

from minillm.labs.exercise import Exercise, expect_callable

# (seed, cause): two deployments of each cause, fixed so every reader is graded on the same.
# Both healthy ones serve shared system prompts with the cache on (seed 9013's would not): the
# case a rule "shared prompts means no prefix caching" gets wrong.
CAUSE_ORDER = ("static_batching", "long_prefill_blocking", "kv_pressure",
               "memory_bound_small_batch", "batch_too_large", "no_prefix_caching", "healthy")
GRADING = [(9000 + i, cause) for i, cause in enumerate(CAUSE_ORDER * 2)]
GRADING[-1] = (9016, "healthy")
MIN_RIGHT = 12  # of 14: one slip per pair of causes at most (the reference gets all 14)

# What tells a cause apart, said once per cause, for a deployment of that cause called wrong.
LOOK_AT = {
    "kv_pressure": "stats()['num_preemptions'] and the preempted ids in the trace's steps: "
                   "only a KV pool that runs dry preempts",
    "long_prefill_blocking": "the largest step's tokens (sum of num_tokens in a StepRecord) and "
                             "the worst ITL against the median ITL: one huge prefill step "
                             "stalls every decode",
    "static_batching": "the batch size over the steps while requests queue (queue_time): it "
                       "fills, then drains to a few before anyone new gets a seat",
    "memory_bound_small_batch": "the batch never passes a few requests while others queue, "
                                "and failure_modes.utilisation(deployment) shows the tensor "
                                "cores idle and bandwidth pegged",
    "batch_too_large": "summary().tpot.p99 against deployment.slo['tpot'] once the other causes "
                       "are ruled out: great throughput, TPOT over the SLO",
    "no_prefix_caching": "whether the prompts share their opening tokens "
                         "(diagnosis.share_of_prompt_shared) while prefill tokens in the trace "
                         "add up to every prompt token",
    "healthy": "the signs of each cause: no preemptions, no queue, no oversized step, TPOT "
               "within the SLO, shared prompts (if any) reused by the cache",
}

# (the cause, the answer given) -> the hint for that confusion.
CONFUSIONS = {
    ("kv_pressure", "long_prefill_blocking"):
        "you called a preemption storm a prefill problem: the big prefill steps and stalls are "
        "recomputation after preemption; look at stats()['num_preemptions'] first",
    ("kv_pressure", "static_batching"):
        "you called a preemption storm static batching: requests wait because the KV pool is "
        "full, not for the batch to drain; look at stats()['num_preemptions']",
    ("static_batching", "memory_bound_small_batch"):
        "you called static batching a small batch: the batch does reach many seats, then "
        "drains; compare the largest batch with the mean batch over the steps",
    ("memory_bound_small_batch", "static_batching"):
        "you called a small max batch static batching: the batch is always full at a few "
        "requests (max and mean batch agree), it just never grows",
    ("batch_too_large", "healthy"):
        "you judged by throughput: it is great, but summary().tpot.p99 is above "
        "deployment.slo['tpot'], and the users see TPOT",
    ("no_prefix_caching", "healthy"):
        "the prompts share long prefixes (diagnosis.share_of_prompt_shared) yet the trace's "
        "prefill tokens add up to every prompt token: nothing was reused",
    ("healthy", "no_prefix_caching"):
        "shared prompts are not a fault when the cache reuses them: prefill tokens in the trace "
        "fall far below deployment.prompt_tokens",
    ("no_prefix_caching", "batch_too_large"):
        "TPOT is over the SLO, but because every request prefills its shared system prompt "
        "again: check prompt sharing against the trace's prefill tokens before blaming the batch",
}


@functools.cache
def grading_deployment(index: int) -> Any:
    """GRADING[index]'s deployment, simulated once per session (about a second)."""
    from minillm.diagnosis import mystery_deployment  # the simulator: loaded when grading

    seed, cause = GRADING[index]
    return mystery_deployment(seed, cause)


def hint(cause: str, answer: str) -> str:
    """The hint for calling a deployment of cause `answer`."""
    specific = CONFUSIONS.get((cause, answer))
    if specific:
        return specific
    return f"you called a {cause} deployment {answer}; look at {LOOK_AT[cause]}"


def grade_diagnose(diagnose: Any) -> str:
    from minillm.diagnosis import CAUSES

    expect_callable(diagnose, "diagnose(deployment) -> one of minillm.diagnosis.CAUSES")
    answers = []
    for index in range(len(GRADING)):
        answer = diagnose(grading_deployment(index))
        assert answer in CAUSES, (
            f"diagnose returned {answer!r:.60} for {grading_deployment(index).name}; return one "
            f"of the causes as a string: {', '.join(CAUSES)}")
        answers.append(answer)
    assert len(set(answers)) > 1, (
        f"you answered {answers[0]!r} for every deployment: a service can be sick in "
        f"{len(CAUSES) - 1} ways; start with stats()['num_preemptions'], the trace's batch sizes "
        "and tokens per step, queue_time and TPOT against the SLO")
    wrong = [(cause, answer) for (_, cause), answer in zip(GRADING, answers) if answer != cause]
    right = len(GRADING) - len(wrong)
    commonest = Counter(wrong).most_common(1)
    assert right >= MIN_RIGHT, (
        f"{right} of {len(GRADING)} deployments diagnosed right (at least {MIN_RIGHT} pass): "
        f"{hint(*commonest[0][0])}")
    recognised = {cause for (_, cause), answer in zip(GRADING, answers) if answer == cause}
    never = [pair for pair in wrong if pair[0] not in recognised]
    assert not never, (
        f"{right} of {len(GRADING)} right, but you never recognised {never[0][0]}: "
        f"{hint(*never[0])}")
    missed = f"; you missed one: {hint(*wrong[0])}" if wrong else ""
    return (f"{right} of {len(GRADING)} right{missed}. An operator triages from the sign only "
            "one cause makes (preemptions, an oversized step) to the one many share (TPOT over "
            "the SLO)")


EXERCISES = [
    Exercise("09.1", "Diagnose a sick deployment",
             "Write diagnose(deployment) -> the cause of its trouble, one of "
             "minillm.diagnosis.CAUSES, from what an operator sees: request metrics, the step "
             "trace, stats(), the prompts, the GPU's peaks and the SLO.",
             grade_diagnose),
]
