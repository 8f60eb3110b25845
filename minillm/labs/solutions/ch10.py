"""Reference solutions of chapter 10's graded exercises, and the open-ended ones' model answers.

10.1 is the rule of minillm.spec.rejection.verify written for one request, one row at a time
(the engine's version does every request of the batch at once, with one read-back); 10.2 is
minillm.quant.int8.quantize_per_channel.
"""

from __future__ import annotations

import torch


def accept(p: torch.Tensor, q: torch.Tensor, proposals: list[int],
           generator: torch.Generator | None) -> list[int]:
    """10.1: the tokens one request emits: its accepted proposals, then one more.

    p (k+1, V): the target's distribution for the token after x, d_1, ..., d_k; q (k, V): the
    distributions the proposals were drawn from (one-hot for prompt lookup)."""
    emitted = []
    for i, d in enumerate(proposals):
        u = float(torch.rand((), generator=generator))
        if u * q[i, d] < p[i, d]:  # probability min(1, p(d) / q(d))
            emitted.append(d)
            continue
        residual = (p[i] - q[i]).clamp(min=0)  # what p still owes after min(p, q) went to d
        return emitted + [int(torch.multinomial(residual / residual.sum(), 1,
                                                generator=generator))]
    bonus = p[len(proposals)]  # every proposal accepted: the target's own next token
    return emitted + [int(torch.multinomial(bonus, 1, generator=generator))]


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """10.2: weight (N, K) -> (q (N, K) int8, scale (N,) fp32), symmetric, one scale a row."""
    w = weight.float()
    absmax = w.abs().amax(dim=1)  # (N,)
    scale = torch.where(absmax > 0, absmax / 127, torch.ones_like(absmax))  # dead rows: 1
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)  # (N, K)
    return q, scale


SOLUTIONS = {"10.1": accept, "10.2": quantize}

MODEL_ANSWERS: dict[str, str] = {
    "10.3": """\
**Model answer.** `best_num_speculative_tokens` answers the first half (Llama-3-8B on an
H100-SXM, bf16, 1,024 tokens of context, modelled). Batch 512 does not fit there: 16 GB of
weights and 69 GB of K/V (86 GB with the 1B draft's weights and K/V) exceed 80 GB, and the cost
model refuses it rather than price it. With a 1B draft (Llama-3.2-1B) and alpha = 0.8, the best
k is 4 at batch 1 and 32 (2.0x, 1.9x), 3 at batch 128 (1.8x) and 2 at batch 256 (1.7x); at
alpha 0.6 it is 2 throughout (1.5x to 1.35x): each extra proposal costs a draft forward and
k + 1 verify rows, and adds only alpha^k tokens. With prompt lookup, whose proposals cost
nothing on the GPU, the model's best k runs to its cap (16, 4.9x at alpha 0.8) at batch 1 and
falls to 4 at batch 128 (3.2x) and 3 at batch 256 (2.7x); the i.i.d. alpha is the optimistic
part there: real lookups propose short runs, and their acceptance depends on the position (the
chapter's held-out check), so vLLM's default of a few tokens is the sane choice. The papers
measured 2-3x (Leviathan et al., T5-XXL) and 2-2.5x (Chen et al., Chinchilla 70B). The
break-even batch (speedup below 1, k = 4) depends on the context as much as on alpha: at 256
tokens, prompt lookup stops paying at batch 353 (alpha 0.8) or 194 (alpha 0.6), the 1B draft at
230 or 117; at 1,024 tokens the K/V reads that verification shares across k + 1 tokens keep
both steps memory-bound, and only the draft at alpha 0.6 stops paying (batch 281); the others
still pay at the largest batch that fits (474 sequences with prompt lookup, 2.1x at alpha 0.8;
364 with the draft, whose weights and K/V take room, 1.4x). So: turn speculation down (smaller
k) as the batch grows, off for short contexts at large batch, and measure alpha on your own
traffic, by position, because the whole answer moves with it.""",
    "10.4": """\
**Model answer.** Quantizing the KV cache halves the bytes per token (bf16 to int8 or fp8), so
the same pool holds twice the tokens: Llama-3-8B on an 80 GB H100-SXM at 8k context goes from 59
to 119 sequences before the KV wall (minillm.sizing.max_concurrency with kv_dtype_bytes=1, the
whole 80 GB counted; 134 with int8 weights too). TPOT at that batch (modelled, decode_step_time
with kv_dtype_bytes=1) is 23.6 ms, the same as bf16's 23.4 ms at its 59: the K/V of 119
sequences are ~64 GB a step in fp8, as many bytes as 59 in bf16, so twice the batch runs at the
same TPOT, twice the throughput; at batch 1 fp8 K/V move TPOT by 2% (4.64 to 4.56 ms at 4k
context). The price in quality, measured on the shipped model over the whole play (35,072
tokens): fp32 K/V 4.1637 nats, int8 4.1636, fp8 4.1637, the same to the fourth decimal; the
teacher-forced greedy pick agrees with fp32's at 98.8% (int8) and 96.4% (fp8) of 2,048
positions, fp8 e4m3's 3 mantissa bits costing more than int8's 127 steps under a per-head scale.
Turn KV quantization on when the KV wall, not the weights, limits the batch: long contexts, many
concurrent users; quantize the weights instead when latency at small batch is the goal, since
there the weights are nearly all of a step's bytes (int8 weights: 1.9x at batch 1, modelled).
Check perplexity and agreement on your own model first: large models have outlier channels that
tiny ones do not.""",
}
