"""Reference solution of chapter 09's graded exercise: diagnose a mystery deployment.

The rules go from the most specific sign to the least, as an operator triages: a counter that
only one cause moves first, the shape of the step trace next, the SLO last (several causes
break it, so it names a cause only once the others are ruled out).
"""

from __future__ import annotations

from minillm.diagnosis import Deployment, share_of_prompt_shared
from minillm.failure_modes import utilisation
from minillm.metrics import percentile


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


SOLUTIONS = {"09.1": diagnose}

MODEL_ANSWERS: dict[str, str] = {}
