"""Reference solutions of chapter 03's graded exercises."""

from __future__ import annotations

import math

from minillm.model_config import ModelConfig


def kv_bytes(config: ModelConfig, seq_len: int, batch: int, dtype_bytes: float) -> float:
    """03.1: K and V, per layer, per KV head, per head dimension, per token, per sequence."""
    return (2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
            * seq_len * batch * dtype_bytes)


def max_sequences(memory_bytes: float, weight_bytes: float, kv_bytes_per_sequence: float) -> int:
    """03.2: whole sequences in what the weights leave; none when the weights do not fit."""
    free = memory_bytes - weight_bytes
    return max(math.floor(free / kv_bytes_per_sequence), 0)


SOLUTIONS = {"03.1": kv_bytes, "03.2": max_sequences}


MODEL_ANSWERS: dict[str, str] = {
    "03.3": """\
**Model answer.** Llama-3-8B on an H100-SXM (80 GB), 32 sequences:
- BF16 weights and KV: (80 - 16.06) GB / 32 = 2.0 GB a sequence, at 131,072 bytes a token:
  **~15,200 tokens** each (`max_concurrency(llama, "H100-SXM", 15244) == 32`).
- FP8 weights and KV (the calculator's dtype 1): (80 - 8.03) / 32 = 2.25 GB at 65,536 bytes a
  token: **~34,300 tokens**.
- BF16 weights, FP8 KV (`max_sequences` with the KV bytes halved): 2.0 GB at 65,536 bytes a
  token: **~30,500 tokens**. The cache's bytes, not the weights', set the context.

Llama-3-70B on an H200 (141 GB): in BF16 its 141.1 GB of weights alone do not fit, so **no**
sequence fits. In FP8 the weights take 70.6 GB, leaving 70.4 GB: 32 sequences of up to **~13,400
tokens** (163,840 bytes a token in FP8). The KV of 32 sequences outweighs the weights from
S = weights / (32 x KV bytes per token) = **~13,460 tokens** on (the same in BF16 and FP8, as
both scale with the byte width): in FP8 that is just past what fits, so at the longest context
the H200 holds, half its memory is weights and half is KV.

Section 4 with 104 blocks: 104 // 8 = **13** full-length (128-token) sequences at once, and the
engine's peak batch is 13. The preemption run with 68 blocks fits 8 full-length sequences
instead of 6: fewer preemptions (measured here: 23 instead of 26) and fewer recomputed tokens
(1,373 instead of 1,437), and the worst stall is shorter, because running requests finish
sooner and free blocks for the waiting ones; the exact numbers are this engine's schedule
(the counts do not depend on the machine, the milliseconds do).

**Rubric (10 points).** 3: the three 8B contexts within 5% (2.0 GB or 2.25 GB per sequence
shown). 3: the 70B verdicts (BF16 does not fit, FP8 fits ~13k tokens each) and the crossover
context where KV outweighs the weights, with the arithmetic. 2: the 104-block peak predicted
as 13 before running, and confirmed. 2: the preemption prediction stated before measuring and
checked against the counts (preemptions, recomputed tokens) and the worst ITL.
""",
}
