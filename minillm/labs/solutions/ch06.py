"""Reference solutions of chapter 06's graded exercises."""

from __future__ import annotations

from collections.abc import Callable


def chunk_schedule(prompt_len: int, budget: int, num_decodes: int) -> list[int]:
    """06.1: each step the decodes take one token each, the prompt takes the rest of the budget."""
    per_step = budget - num_decodes
    chunks, left = [], prompt_len
    while left > 0:
        chunks.append(min(left, per_step))
        left -= chunks[-1]
    return chunks


def prefill_ttft(prompt_len: int, budget: int, num_decodes: int,
                 step_time: Callable[[int], float]) -> float:
    """06.2: one step per chunk, each step carrying its chunk plus the decodes' tokens."""
    return sum(step_time(chunk + num_decodes)
               for chunk in chunk_schedule(prompt_len, budget, num_decodes))


def step_budget(num_decodes: int, step_cap: int, max_budget: int) -> int:
    """06.3: the whole budget when nobody decodes; else cap the step (at the prefill crossover,
    where it stays memory-bound), leaving room for every decode and one prompt token."""
    if num_decodes == 0:
        return max_budget
    return min(max_budget, max(step_cap, num_decodes + 1))


SOLUTIONS = {"06.1": chunk_schedule, "06.2": prefill_ttft, "06.3": step_budget}

MODEL_ANSWERS: dict[str, str] = {
    "06.4": """\
**Model answer.** The worst ITL of the chunked run is the cost of the largest step a decoder
sits through: the eight decodes plus a chunk of budget - 8 tokens (plus noise). So the budget
that meets a target of three decode steps is the largest whose budget-sized step costs about
three decode steps: sweep budgets in powers of two (then bisect between the last that meets it
and the first that does not), taking the worst ITL of the faster of two or three runs each, as
section 4 does. On a CPU with the shipped model this lands at a budget of a few dozen tokens
(a 128-token step already costs several decode steps); the long request then needs
ceil(I / (budget - 8)) steps, so its TTFT is many times the unchunked one (read it from the
sweep: at a budget of 32, 43 steps; at 16, 128).

With 32 decoders instead of 8, every step carries 32 decode tokens, so (a) a decode step itself
costs more, which raises the target if it is set in decode steps, and (b) the same budget leaves
only budget - 32 tokens for the prompt, so a budget must exceed 32 to make progress at all and
the chunk that fits under the target shrinks. The budget that meets a fixed target in
milliseconds moves down by about the 24 extra decode tokens, and the long request's TTFT grows,
since each step carries a smaller chunk.

**Rubric (10 points).**
- 3: a measured sweep (worst ITL and TTFT per budget, best of several runs) and the largest
  budget that meets the target, with its TTFT.
- 2: explains the worst ITL as one budget-sized step (decodes + chunk), not the prefill.
- 3: the 32-decoder rerun, with the budget that meets the target and its TTFT, and the reason:
  decodes take budget tokens first in every step (stall-free batching), so a chunk is
  budget - decodes, and a decode step itself costs more.
- 2: notes the noise of timing on a shared machine (repeats, best-of) and labels every number
  measured on this machine.
""",
    "06.5": """\
**Model answer** (modelled, Llama-3-8B in BF16, the section 5 workload).

H100-SXM, 10% long prompts: budgets 256 (TTFT ~117 ms, p99 ~5.2 ms, worst ~5.3 ms) and 512
(~97 ms, ~8.3 ms, worst ~8.9 ms) meet ITL p99 <= 10 ms and TTFT <= 150 ms. So, on these two
numbers alone, do 4096 (~97 ms, p99 ~7.3 ms) and 8192 (~94 ms, p99 ~6.7 ms), but their worst gaps
are ~65 and ~110 ms: a p99 SLO is met while streams still freeze, because so few gaps fall in
steps that carry a long prompt. 128 fails on TTFT (~237 ms), 1024 and 2048 on p99 (~16 and
~30 ms), chunking off on p99 (~11.5 ms) with a worst gap of ~185 ms.

With 20% long prompts only 256 (~133 ms, p99 ~5.5 ms) and 512 (~105 ms, ~8.5 ms) still meet
it: the large budgets now slow enough gaps to reach the p99 (4096: ~62 ms, 8192: ~68 ms).

A100-80GB: the prefill crossover of Llama-3-8B is ~165 tokens (312 TFLOP/s against
2.0 TB/s: a lower ridge), so only chunks up to ~150 tokens ride free (128 adds under 1% to a
step of 32 decodes; 256 adds ~55%). No budget meets the SLO there: the long prompts' TTFT is
over 300 ms even unchunked, and only a budget of 128 keeps the p99 under 10 ms (~8.9 ms) at a
TTFT of ~490 ms. The SLO has to be relaxed, or the GPU changed.

**Rubric (10 points).**
- 3: the table of budgets with TTFT, p99 and worst ITL, and which meet the SLO.
- 2: notices that large budgets can meet a p99 SLO with stalls of 60-110 ms in the worst gap,
  and says why (few gaps fall in prompt-carrying steps).
- 2: the 20% rerun and which budgets survive.
- 3: the A100's crossover computed with prefill_crossover (~165), which chunk sizes ride free
  there, and the rerun's conclusion (no budget meets this SLO on an A100).
""",
}
