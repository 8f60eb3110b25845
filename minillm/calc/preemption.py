"""What preempting one request costs on a GPU: recompute its K/V, or swap them out and back.

When the KV pool runs out, the scheduler evicts a running request (the victim). It pays later,
when the victim resumes, in one of two currencies:

- recompute (vLLM's default): the victim's blocks are freed and, on resumption, its whole
  context is prefilled again. Extra work: the FLOPs of a prefill of context_len tokens, about
  2 * weights * S + attention over S * (S + 1) / 2 (query, key) pairs, so it grows faster than
  the context (the attention term is quadratic).
- swap: the victim's K/V are copied to host memory and back over the host link (PCIe, or
  NVLink-C2C on a GH200): 2 * S * KV bytes per token, linear in the context.

Per token, recompute costs 2 * weights / peak FLOP/s plus an attention term that grows with S;
swap costs 2 * KV bytes per token / link bandwidth, a constant. Where recompute starts cheaper
(a model whose KV is large next to its weights, e.g. full multi-head attention, on a slow
link), the attention term hands the win to swap past a crossover context length
(crossover_context_len). Grouped-query attention shrinks the KV a token holds, so for the
7B-70B models swap wins at every context even on PCIe 3; small models with a wide KV (Qwen3-0.6B,
SmolLM2-135M) or full multi-head attention recompute cheaper below a crossover, on an H100-SXM
from ~3,400 tokens (Llama-3-8B's shape with 32 KV heads) to ~24,000 (Qwen3-0.6B); NVLink-C2C
(GH200) hands swap every length.

That prices recompute in a compute-bound step, where every FLOP costs. A step that is
memory-bound (a big decode batch reading long contexts) hides a short recompute under its
reads almost for free: preemption_costs(..., running=batch) prices that case, and it is why
vLLM recomputes by default.

The prices are roofline peaks (minillm.roofline): no kernel reaches the datasheet FLOP/s and
small copies do not reach the link's peak. Pass measured rates as a Hardware to tighten them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from minillm.calc import models, roofline, sizing
from minillm.model_config import ModelConfig

Batch = Sequence[tuple[int, int]]  # (num_new_tokens, context_len) per request, as in roofline


@dataclass(frozen=True)
class PreemptionCost:
    """The modelled cost of preempting one request that holds context_len tokens of K/V.

    recompute_s: seconds of the extra prefill when it resumes; recompute_flops: its FLOPs.
    swap_s: seconds to copy its K/V out to host memory and back in; swap_bytes: the bytes
    moved, both ways together (as stats()' swap_out_bytes + swap_in_bytes count them).
    """

    context_len: int
    recompute_s: float
    swap_s: float
    recompute_flops: float
    swap_bytes: float

    @property
    def cheaper(self) -> Literal["recompute", "swap"]:
        """The cheaper way to preempt; a tie goes to recompute, vLLM's default."""
        return "swap" if self.swap_s < self.recompute_s else "recompute"


def _resolve(model: models.ModelLike, hw: roofline.Hardware | str
             ) -> tuple[ModelConfig, roofline.Hardware]:
    config = model if isinstance(model, ModelConfig) else models.as_config(model)
    return config, roofline.get_hardware(hw)


def recompute_flops(model: models.ModelLike, context_len: int) -> float:
    """FLOPs that recompute adds for a victim of context_len tokens (S).

    On resumption the victim prefills its S tokens plus the pending one, (S + 1, S + 1), in
    place of the decode step (1, S + 1) it would have run: the difference is 2 * projection
    weights * S + 4 * H * D * L * S * (S + 1) / 2, the prefill of S tokens with no lm_head
    row (the token it samples was due anyway)."""
    config = model if isinstance(model, ModelConfig) else models.as_config(model)
    s = context_len
    resume, _ = roofline.step_flops_bytes(config, [(s + 1, s + 1)])
    decode, _ = roofline.step_flops_bytes(config, [(1, s + 1)])
    return resume - decode


def _recompute_seconds(config: ModelConfig, hw: roofline.Hardware, context_len: int,
                       flops: float, dtype_bytes: float, running: Batch | None) -> float:
    if running is None:
        # Busy (compute-bound) step: the weights are read anyway, every extra FLOP costs at peak.
        return flops / hw.flops
    # The victim's resume joins `running` in one step, where it would have decoded: the step's
    # roofline time with the resume prefill, less the time with the decode.
    s = context_len
    with_resume = roofline.step_time(config, hw, [*running, (s + 1, s + 1)], dtype_bytes)
    with_decode = roofline.step_time(config, hw, [*running, (1, s + 1)], dtype_bytes)
    return with_resume.time - with_decode.time


def preemption_costs(model: models.ModelLike, hw: roofline.Hardware | str,
                     context_lens: Iterable[int], dtype_bytes: float = 2,
                     running: Batch | None = None) -> list[PreemptionCost]:
    """The cost of recompute and of swap for a victim of each context length (tokens).

    model: a name (minillm.models) or a ModelConfig; hw: a name (roofline.HARDWARE) or a
    Hardware, whose host_link (bytes/s one way) prices the swap. dtype_bytes: of the K/V.

    recompute_s: by default (running=None) the extra FLOPs / peak FLOP/s, the marginal cost in
    a busy, compute-bound step (a squeezed server is busy: that is why it preempts); this is
    what the crossover uses. Pass running, the rest of the step's batch as (new tokens,
    context) pairs, to price it as the difference of two roofline steps instead: with
    running=[] the resume runs in a step of its own, which in a memory-bound step (short
    contexts, weights read anyway) is nearly free, and a long decode batch likewise hides it.
    swap_s: 2 * S * KV bytes per token / host_link, not overlapped with compute (as the
    simulator prices it). The engine moves whole blocks: its last block, part-filled, costs
    up to one block more than this.
    """
    config, device = _resolve(model, hw)
    per_token = sizing.kv_bytes_per_token(config, dtype_bytes)
    costs = []
    for s in context_lens:
        if not isinstance(s, int) or isinstance(s, bool) or s < 1:
            raise ValueError(f"context_len must be a positive int (tokens of K/V the victim "
                             f"holds), got {s!r}")
        flops = recompute_flops(config, s)
        moved = 2 * s * per_token  # out, then back in
        costs.append(PreemptionCost(
            context_len=s,
            recompute_s=_recompute_seconds(config, device, s, flops, dtype_bytes, running),
            swap_s=moved / device.host_link,
            recompute_flops=flops,
            swap_bytes=moved,
        ))
    return costs


def crossover_context_len(model: models.ModelLike, hw: roofline.Hardware | str,
                          dtype_bytes: float = 2, max_len: int | None = None) -> int | None:
    """The shortest context length (tokens) at which swap is cheaper than recompute, with
    recompute priced in a busy step (preemption_costs' default), searched in 1..max_len
    (default: the model's max_position_embeddings).

    Below it recompute wins, from it on swap wins: recompute minus swap is a*S + b*S*(S + 1)
    with b > 0 (attention), so the sign changes at most once. None when one of them wins at
    every length up to max_len; which one: swap when it already wins at 1 token (its per-token
    copy is cheaper than the per-token compute: GQA models on PCIe 5 or NVLink-C2C), recompute
    when it still wins at max_len (preemption_costs(model, hw, [1])[0].cheaper tells them
    apart). Llama-3-8B on an H100-SXM: None (swap wins everywhere).
    """
    config, device = _resolve(model, hw)
    limit = config.max_position_embeddings if max_len is None else max_len
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"max_len must be a positive int of tokens, got {max_len!r}")

    def swap_wins(s: int) -> bool:
        return preemption_costs(config, device, [s], dtype_bytes)[0].cheaper == "swap"

    if swap_wins(1) or not swap_wins(limit):
        return None
    lo, hi = 1, limit  # recompute wins at lo, swap at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if swap_wins(mid) else (mid, hi)
    return hi


def fits(model: models.ModelLike, hw: roofline.Hardware | str, context_len: int = 2048,
         dtype_bytes: float = 2, gpu_memory_utilization: float = 0.9) -> bool:
    """Whether one GPU of hw holds the model's weights and the K/V of one context_len-token
    request in gpu_memory_utilization of its memory (vLLM's default share, 0.9): the least a
    server needs before there is anyone to preempt. Llama-3-8B in 16 bits (16.1 GB) does not fit
    a 16 GB T4; Llama-3-70B (141 GB) fits no single GPU of roofline.HARDWARE."""
    config, device = _resolve(model, hw)
    need = sizing.weight_bytes(config, dtype_bytes) + sizing.kv_cache_bytes(
        config, context_len, 1, dtype_bytes)
    return need <= device.memory * gpu_memory_utilization


def crossover_summary(model: models.ModelLike, hw: roofline.Hardware | str,
                      dtype_bytes: float = 2) -> str:
    """One cell of a crossover table: "swap from N tokens", "<mode> at every length", or, where
    the model does not fit one GPU of hw (fits), that it does not fit and why: a crossover for
    a server that cannot exist would be a number about nothing."""
    config, device = _resolve(model, hw)
    if not fits(config, device, dtype_bytes=dtype_bytes):
        weights = sizing.weight_bytes(config, dtype_bytes) / 1e9
        return f"does not fit ({weights:.0f} GB > {0.9 * device.memory / 1e9:.0f} GB)"
    crossover = crossover_context_len(config, device, dtype_bytes)
    if crossover is None:
        return f"{preemption_costs(config, device, [1], dtype_bytes)[0].cheaper} at every length"
    return f"swap from {crossover:,}"
