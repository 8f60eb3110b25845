"""Reference solutions of chapter 01's graded exercises, and model answers of its open ones."""

from __future__ import annotations

from collections.abc import Callable


def decode_intensity(num_params: int, batch: int, dtype_bytes: float) -> float:
    """01.1: 2 FLOPs per weight per sequence; every weight read once per step for the batch."""
    return 2 * num_params * batch / (num_params * dtype_bytes)


def estimate_ttft(prompt_len: int, tokens_per_second: float, overhead_s: float) -> float:
    """01.2: a fixed per-step cost plus the prompt at the prefill rate."""
    return overhead_s + prompt_len / tokens_per_second


def max_batch_for_tpot(tpot_at: Callable[[int], float], tpot_target: float,
                       max_batch: int) -> int:
    """01.3: double the batch until TPOT breaks the target, then bisect between the last batch
    that met it and the first that broke it (TPOT does not fall as the batch grows)."""
    if tpot_at(1) > tpot_target:
        return 0
    good, bad = 1, None  # tpot_at(good) meets the target; tpot_at(bad) breaks it
    while bad is None and good < max_batch:
        probe = min(2 * good, max_batch)
        if tpot_at(probe) <= tpot_target:
            good = probe
        else:
            bad = probe
    if bad is None:
        return good  # max_batch meets it
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if tpot_at(mid) <= tpot_target else (good, mid)
    return good


SOLUTIONS = {"01.1": decode_intensity, "01.2": estimate_ttft, "01.3": max_batch_for_tpot}

MODEL_ANSWERS: dict[str, str] = {
    "01.4": """\
**Model answer.** With `LLM(cfg, num_kv_blocks=256, max_num_seqs=256)` and section 4's loop over
`[1, 2, 4, 8, 16, 32, 64, 128, 256]`, a 2-core CPU in fp32 gives steps of roughly 0.2-0.3 s at
B = 64, about 0.4-0.6 s at B = 128 and about 1 s at B = 256 (your figures will differ; report
yours with `machine.describe()`). Tokens/s keeps rising but ever more slowly: from B = 64 to 256
it gains well under 2x for 4x the batch, because the step is past this machine's decode crossover
(`cross_b`, a few tens of sequences in fp32 on one core): every extra sequence adds its 2 FLOPs
per weight at a compute roof that is already nearly reached (the timed matmuls' GFLOP/s approach
the measured peak). It is not the token budget (256 decodes spend 256 of 2,048 tokens) and not
mainly Python: the "rest" of section 4's split grows with B (attention over each sequence's KV,
sampling, per-request bookkeeping) but stays a minority of the step. The modelled H100 curve for
Llama-3-8B stays linear up to a few hundred sequences at a short context because its ridge is
~295 FLOPs per byte, and flattens earlier at long contexts because of KV reads, not FLOPs.

**Rubric (full credit).**
- Measured tokens/s and TPOT for B up to 256, printed with the machine they came from.
- Names where throughput stops growing near-linearly, and compares it with `cross_b`, this
  machine's modelled decode crossover (fp32: AI ≈ B/2 against the measured ridge).
- Rules out the token budget with the arithmetic (decodes spend one token each) and weighs the
  per-request work with section 4's split (matmuls vs the rest), not by guessing.
- Contrasts with the modelled H100 curve: linear up to the ridge at short contexts, KV-bound at
  long ones.
""",
}
