"""Reference solutions of chapter 00's graded exercises, and model answers of its open ones."""

from __future__ import annotations

from typing import Any

from minillm.metrics import RequestMetrics


def tpot(metrics: RequestMetrics) -> float | None:
    """00.1: seconds per output token after the first: n tokens have n - 1 gaps."""
    times = metrics.token_times
    if len(times) < 2:
        return None
    return (times[-1] - times[0]) / (len(times) - 1)


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """00.2: ceil(num_tokens / block_size) without floats."""
    return -(-num_tokens // block_size)


def serve(engine: Any, prompts: list[Any], params: list[Any]) -> list[Any]:
    """00.3: queue every request, step until none is left, keep each request's last output."""
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    last = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            last[out.request_id] = out
    return [last[i] for i in ids]


SOLUTIONS = {"00.1": tpot, "00.2": blocks_needed, "00.3": serve}

MODEL_ANSWERS: dict[str, str] = {
    "00.4": """\
**Model answer.** With a 16-token budget and 16 blocks of 4 tokens, the first step prefills as
many prompt tokens as the budget allows (the first prompts whole, a longer one as a chunk); the
first step to mix a prefill chunk with decodes is the one right after the first prompt finishes
its prefill, while later prompts still have tokens left: in `BatchTimeline` it is the first
column with both colours. Eight prompts of a few dozen tokens need more than 16 blocks of 4
tokens once they decode, so the pool runs dry: `stats()["num_preemptions"]` is above zero, and
the timeline shows a preempted request going back to prefill (recompute) and being re-admitted
later. Halving the budget to 8 tokens spreads every prefill over twice as many steps, so the last
prompt's TTFT grows (roughly doubles when prefill dominates it), while the decodes of the others
keep getting one token per step.

**Rubric (full credit).**
- Names the step (index in `llm.trace`) where `scheduled` first holds both a "prefill" and a
  "decode" entry, and explains why it is then (a prompt finished prefill, others still chunking).
- Reads preemptions from `stats()` (and shows one in the timeline or the trace's `preempted`),
  and says why the pool ran dry (blocks needed vs 16 available).
- Measures the last prompt's TTFT at both budgets (from `metrics.ttft`) and explains the change
  with the number of prefill steps, not with guesses.
""",
}
