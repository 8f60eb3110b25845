"""Reference solutions of chapter 09's graded exercises: diagnose a mystery deployment (09.1),
and a seat share per class inside the scheduler (09.4).

The rules go from the most specific sign to the least, as an operator triages: a counter that
only one cause moves first, the shape of the step trace next, the SLO last (several causes
break it, so it names a cause only once the others are ruled out).
"""

from __future__ import annotations

from minillm.metrics import percentile
from minillm.plan.diagnosis import Deployment, share_of_prompt_shared
from minillm.plan.failure_modes import utilisation


def diagnose(d: Deployment) -> str:
    """09.1: the cause of a mystery deployment's trouble, one of minillm.diagnosis.CAUSES."""
    # 1. Preemptions happen only when the KV pool runs dry: a storm is KV pressure, whatever
    #    else it drags along (recomputation also makes big prefill steps and long stalls).
    if d.stats()["num_preemptions"] > 0:
        return "kv_pressure"

    sizes = [len(step.scheduled) for step in d.trace]
    gaps = [gap for m in d.metrics for gap in m.itl]
    queued_p90 = percentile([m.queue_time for m in d.metrics], 90)  # seconds before a seat

    # 2. A step far over the usual 2,048-token budget, and decodes that stalled for dozens of
    #    their usual gaps: a whole long prompt prefilled in one step (no chunked prefill).
    if max(step.num_tokens for step in d.trace) > 4096 and max(gaps) > 10 * percentile(gaps, 50):
        return "long_prefill_blocking"

    # 3. Requests queue for seconds, yet the batch never passes a handful of requests and the
    #    tensor cores idle: each step reads all the weights for a few tokens (memory-bound).
    flop_utilisation, _ = utilisation(d)
    if queued_p90 > 0.5 and max(sizes) <= 8 and flop_utilisation < 0.2:
        return "memory_bound_small_batch"

    # 4. Requests queue while the batch, which can reach many seats, sits mostly near empty:
    #    seats free up and are not refilled until the whole batch drains (static batching).
    if queued_p90 > 0.5 and sum(sizes) / len(sizes) < 0.4 * max(sizes):
        return "static_batching"

    # 5. Most prompts open with a prefix another prompt shares, yet prefill computed every
    #    prompt token: no prefix cache (with one, prefill falls far below the prompt tokens).
    prefill = sum(e.num_tokens for step in d.trace for e in step.scheduled
                  if e.phase == "prefill")
    if share_of_prompt_shared(d) > 0.5 and prefill >= 0.9 * d.prompt_tokens:
        return "no_prefix_caching"

    # 6. Nothing above, and TPOT still breaks the SLO: the batch is too large for it.
    if d.summary().tpot.p99 > d.slo["tpot"]:
        return "batch_too_large"
    return "healthy"


# 09.4: seats kept free of batch jobs. The chats in flight at once are about their arrival rate
# times the seconds each runs (Little's law: 4/s x ~1.5 s, ~6), and arrivals come in bursts:
# twice that is a p99 margin, and the jobs keep the other 52 of 64 seats.
CHAT_SEATS = 12


def seat_share(request, scheduler) -> bool:
    """09.4: interactive requests (priority 0) may always take a free seat; batch requests only
    while the batch class holds fewer than max_num_seqs - CHAT_SEATS seats."""
    if request.priority == 0:
        return True
    batch_seats = sum(1 for r in scheduler.running if r.priority >= 1)
    return batch_seats < scheduler.config.max_num_seqs - CHAT_SEATS


SOLUTIONS = {"09.1": diagnose, "09.4": seat_share}

MODEL_ANSWERS: dict[str, str] = {
    "09.2": """\
**Model answer.** The host pool only has to hold the victims that are swapped out at the same
time, not the whole KV pool. On the tiny model a block is 48 KiB, so 0.05 GiB is ~1,000 blocks
and every preemption is a swap; shrink it to a few victims' worth and `num_swap_outs` falls
below `num_preemptions`: the victims that find no room are recomputed, and
`num_recomputed_tokens` climbs back toward the recompute run's. The tokens are identical in
every run. In the simulator (Llama-3-8B, H100-SXM, 2,000 blocks of 2 MiB, 200 requests of
1-2k prompt tokens at once, modelled): recompute preempts 125 times and recomputes 75,772
tokens at 2,401 tokens/s; swap with 0.1 GiB (51 host blocks) swaps 67 of 107 and still
recomputes 53,952 tokens (2,424 tokens/s); with 0.5 or 4 GiB all 93 preemptions are swaps, 17.8
GB cross PCIe 5.0, nothing is recomputed, 2,481 tokens/s. The victims' worst ITL is ~0.83-0.85 s
in all four: a victim waits for blocks far longer than its copy takes. So swap buys ~3% here and
0.5 GiB is as good as 4. Pick recompute anyway when host memory is scarce or shared (pinned
memory is taken from the OS for good), when the PCIe link is busy with other traffic (tensor
parallel or offloading), when the victims are short (their prefill hides in a memory-bound
decode step almost for free), or when steps must stay predictable: a swap stalls the step that
makes it, a recompute spreads over chunked steps.""",
    "09.3": """\
**Model answer.** Ageing's price is set by how long the urgent stream can hold every seat. In
the simulator (Llama-3-8B on an H100-SXM, 128 seats, chats of 100-300 + 100-300 tokens arriving
at 120/s for 12.5 s (1,500 of them, workload.poisson seed 0), a little more than the server
serves; five priority=1 jobs of 1,500 + 1,000 tokens arriving at 5 s; modelled;
priority_preemption="for_waiting"): with priority_aging_steps = 100 the jobs start after 1.6 s
and the chats' p99 TTFT is 2.92 s; at 1,000 the jobs wait 8.5 s and the chats' p99 is 2.38 s; at
10,000 the jobs wait 9.8 s, in effect until the chat burst ends, and the chats' p99 is 2.18 s. A
small value protects the jobs and costs the chats ~0.7 s of tail; a large one is strict
priority. On section 4's backlog the same small value is worse: the whole backlog ages past the
chats at once and the chats queue behind it. Ageing by waiting time promises nothing about
shares, only an eventual turn, and promotes everything that waited equally long at once. A rule
to ship instead (exercise 09.4 grades one): a guaranteed share of seats (and of the token
budget) per class, e.g. the batch class may always hold up to 10% of the seats and may borrow
idle ones; chats preempt borrowed seats only. It promises chats ~90% of the capacity and a TTFT
bounded by their own load, and jobs a throughput floor of 10% whatever the chats do, with no
step count to tune. Weighted fair queueing over classes (a virtual time per class, charged by
tokens computed) gives the same promise with smooth shares. Test: in the queue's order, pick the
head from the class furthest below its share, then by priority; on both workloads the jobs'
waiting time must stay below a bound set by their share and the chats' p99 must not grow on the
backlog.""",
}
