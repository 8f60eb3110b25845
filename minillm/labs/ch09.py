"""Graded exercises of chapter 09 (scheduling under pressure): diagnose a sick deployment, and
a seat share that runs inside the real scheduler.

09.1 hands the reader's diagnose(deployment) -> cause the mystery deployments of fixed seeds
(minillm.diagnosis: simulated, modelled on H100-SXM and H200 GPUs), two of each cause in
minillm.diagnosis.CAUSES, and asks for at least MIN_RIGHT of them right with every cause
recognised at least once (so mistaking one cause for another throughout fails). A wrong answer is
answered with a hint naming the metric that tells the two causes apart; the common confusions
have their own.

09.4 installs the reader's seat_share(request, scheduler) -> bool as the engine's
Scheduler.admission_policy and serves SHARE_WORKLOAD in the simulator (the engine's own
scheduler, FCFS, Llama-3-8B on an H100-SXM; modelled): a backlog of batch jobs (priority 1)
that would take every seat, and a chat stream (priority 0) arriving while it drains. It passes
when the chats' p99 TTFT is within CHAT_TTFT_SLO and the jobs finish no later than
JOB_SLOWDOWN_MAX times the run without any rule: interactive users protected, the batch class
not starved.
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
    from minillm.plan.diagnosis import mystery_deployment  # the simulator: loaded when grading

    seed, cause = GRADING[index]
    return mystery_deployment(seed, cause)


def hint(cause: str, answer: str) -> str:
    """The hint for calling a deployment of cause `answer`."""
    specific = CONFUSIONS.get((cause, answer))
    if specific:
        return specific
    return f"you called a {cause} deployment {answer}; look at {LOOK_AT[cause]}"


def grade_diagnose(diagnose: Any) -> str:
    from minillm.plan.diagnosis import CAUSES

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


# 09.4: 128 jobs of 1,024 + 512 tokens at t = 0, 48 chats (64-512 in, 32-256 out) at 4/s, on 64
# seats. Without a rule the jobs hold every seat and the chats' p99 TTFT is ~9 s (modelled).
SHARE_SEATS = 64
CHAT_TTFT_SLO = 1.0  # seconds, p99 over the chats
# The jobs may finish this much later than without a rule: a share that leaves the chats the
# seats they keep busy (4/s x ~1.5 s each) costs the jobs ~1.2x; a starving share costs 1.5-2.5x.
JOB_SLOWDOWN_MAX = 1.3


def share_workload() -> list[Any]:
    from minillm.workloads import streams as workload

    jobs = [workload.RequestSpec(0.0, 1024, 512, seed=i, priority=1) for i in range(128)]
    chats = [workload.RequestSpec(s.arrival_time, s.prompt_len, s.output_len, seed=1000 + i,
                                  priority=0)
             for i, s in enumerate(workload.poisson(48, 4.0, (64, 512), (32, 256), seed=1))]
    return jobs + chats


def serve_with_policy(policy: Any) -> tuple[float, float, int]:
    """(chats' p99 TTFT, seconds until the last job finished, preemptions) of share_workload
    served FCFS on SHARE_SEATS seats with policy as the scheduler's admission_policy."""
    from minillm.metrics import percentile
    from minillm.sim.simulator import simulate

    specs = share_workload()
    run = simulate("llama-3-8b", "H100-SXM", specs, max_num_seqs=SHARE_SEATS,
                   record_block_tables=False, admission_policy=policy)
    chat_ttft = [o.metrics.ttft for s, o in zip(specs, run.outputs) if s.priority == 0]
    jobs_done = max(o.metrics.finished_time for s, o in zip(specs, run.outputs) if s.priority)
    return percentile(chat_ttft, 99), jobs_done, run.stats["num_preemptions"]


@functools.cache
def unprotected_run() -> tuple[float, float, int]:
    """The same traffic with no rule: every seat goes to whoever is first in line."""
    return serve_with_policy(None)


def grade_seat_share(seat_share: Any) -> str:
    from minillm.scheduler import AdmissionStalled

    expect_callable(seat_share, "seat_share(request, scheduler) -> bool")

    def checked(request: Any, scheduler: Any) -> bool:
        answer = seat_share(request, scheduler)
        assert isinstance(answer, bool), (
            f"seat_share returned {answer!r:.40} for a priority-{request.priority} request; "
            "return True (it may take a seat now) or False (it waits)")
        return answer

    try:
        chat_p99, jobs_done, _ = serve_with_policy(checked)
    except AdmissionStalled as err:  # the scheduler's guard: an idle server refusing everyone
        raise AssertionError(
            f"the scheduler stopped: {err}. A rule must let a job in when no chat needs the seat; "
            "count the seats the batch class holds (scheduler.running) against a cap") from None
    base_p99, base_done, _ = unprotected_run()
    assert chat_p99 <= CHAT_TTFT_SLO, (
        f"the chats' p99 TTFT is {chat_p99:.2f} s (modelled; without any rule {base_p99:.1f} s), "
        f"over the {CHAT_TTFT_SLO:g} s SLO: the jobs still take the seats the chats need. Keep "
        "enough seats free of jobs for the chats in flight at once (Little's law: 4 chats/s "
        "times the seconds a chat runs)")
    assert jobs_done <= JOB_SLOWDOWN_MAX * base_done, (
        f"the chats are fast (p99 {chat_p99:.2f} s) but the jobs finished at {jobs_done:.1f} s "
        f"against {base_done:.1f} s without a rule, over {JOB_SLOWDOWN_MAX:g}x: the batch class "
        "is held to too few seats. Give it every seat the chats do not need")
    return (f"chats' p99 TTFT {chat_p99:.2f} s (was {base_p99:.1f} s without a rule), jobs done "
            f"at {jobs_done:.1f} s against {base_done:.1f} s (modelled, H100-SXM). A seat share "
            "bounds the interactive class's wait by its own load, and the batch class keeps a "
            "throughput floor, with no preemption and no step count to tune")


EXERCISES = [
    Exercise("09.1", "Diagnose a sick deployment",
             "Write diagnose(deployment) -> the cause of its trouble, one of "
             "minillm.diagnosis.CAUSES, from what an operator sees: request metrics, the step "
             "trace, stats(), the prompts, the GPU's peaks and the SLO.",
             grade_diagnose),
    Exercise("09.4", "A seat share inside the scheduler",
             "Write seat_share(request, scheduler) -> bool, the engine's admission policy: "
             "whether a waiting request may take a seat now. It runs inside the real scheduler "
             "(FCFS, 64 seats) on a backlog of batch jobs (priority 1) and a chat stream "
             f"(priority 0): the chats' p99 TTFT must stay within {CHAT_TTFT_SLO:g} s and the "
             f"jobs must finish within {JOB_SLOWDOWN_MAX:g}x of the run without a rule.",
             grade_seat_share),
]
