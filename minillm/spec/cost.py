"""What speculative decoding buys: tokens per target step, and the same priced on the roofline.

A decode step reads every weight to make one token per request, and at small batch it leaves
the GPU's arithmetic idle (minillm.roofline: its intensity is about the batch size, far below
the ridge point). Speculative decoding spends that idle compute: propose k tokens cheaply (a
small draft model, or prompt lookup), then let the target check all of them in one forward of
k + 1 tokens per request, which reads the weights once, like a decode step.

If each proposed token is accepted with probability alpha, independently of the others (the
i.i.d. assumption of Leviathan et al., "Fast Inference from Transformers via Speculative
Decoding", ICML 2023, section 3.1; real acceptance varies with the text), a target step yields
the accepted run plus one token the target samples itself:

    E = 1 + alpha + alpha^2 + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)

tokens per step. The cost-adjusted speedup divides by what the step costs: the draft's k
forwards, each a decode step of its own on the roofline (its weights and its K/V read, plus a
fixed cost per forward: draft_overhead), plus a target forward of k + 1 tokens a request,
against one plain decode step. Prompt lookup's proposals cost ~nothing on the GPU. Both models'
weights and K/V must fit the device (check_fits): a batch that does not is refused, not priced.

The papers' own measurements are lower than this model's best case: Leviathan et al. report
2x-3x on T5-XXL, Chen et al. 2-2.5x on Chinchilla 70B (a 4B draft, in a distributed setup).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from minillm.calc.hardware import Hardware, get_hardware
from minillm.calc.models import ModelLike, as_config
from minillm.calc.roofline import StepCost, decode_step_time, step_time
from minillm.calc.sizing import kv_bytes_per_token, weight_bytes


def check_acceptance_rate(alpha: float) -> None:
    """A ValueError naming alpha unless it is a probability."""
    if not (isinstance(alpha, (int, float)) and 0.0 <= alpha <= 1.0):
        raise ValueError(f"acceptance rate alpha must be a probability in [0, 1], got {alpha!r}")


def _check_k(k: int, least: int = 1) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < least:
        raise ValueError(f"k (num_speculative_tokens) must be an integer >= {least}, got {k!r}")


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """E = (1 - alpha^(k+1)) / (1 - alpha): the mean tokens one target step yields when k tokens
    are proposed and each is accepted with probability alpha independently (Leviathan et al.
    2023, eq. 1): the accepted run until the first rejection, plus the target's own token.
    1 at alpha = 0 (every proposal rejected: plain decode), k + 1 at alpha = 1; always below
    both k + 1 and 1 / (1 - alpha), the limit of an endless proposal."""
    check_acceptance_rate(alpha)
    _check_k(k, least=0)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def with_verified_rows(cost: StepCost, model: ModelLike, hw: Hardware | str,
                       num_proposed: int) -> StepCost:
    """cost with the lm_head FLOPs of num_proposed more rows: roofline.step_flops_bytes counts
    one row of logits per request (the one that samples), but verification needs logits at
    every proposed position too, 2 * vocab * hidden FLOPs each (~1 GFLOP for Llama-3-8B, 7%
    of a token's matmuls). The weights are read anyway, so only the compute side grows."""
    config = as_config(model)
    extra = 2 * config.vocab_size * config.hidden_size * num_proposed
    flops = cost.flops + extra
    compute_time = flops / get_hardware(hw).flops
    return dataclasses.replace(cost, flops=flops, compute_time=compute_time,
                               time=max(compute_time, cost.memory_time) + cost.overhead)


def check_fits(model: ModelLike, hw: Hardware | str, batch: int, context_len: int,
               draft: ModelLike | None = None, dtype_bytes: float = 2, *,
               kv_dtype_bytes: float | None = None) -> None:
    """A ValueError, naming the bytes, unless `batch` sequences of context_len tokens fit on hw:
    the target's weights and K/V, and the draft's too when there is one (it runs on the same
    GPU and keeps a KV cache of its own), against the whole device memory (as
    sizing.max_concurrency counts it, with gpu_memory_utilization 1). Speculation's lookahead is
    the caller's to add to context_len. dtype_bytes and kv_dtype_bytes as in roofline.step_time."""
    device = get_hardware(hw)
    kv_bytes = dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    models = [model] if draft is None else [model, draft]
    weights = sum(weight_bytes(m, dtype_bytes) for m in models)
    kv = batch * context_len * sum(kv_bytes_per_token(m, kv_bytes) for m in models)
    if weights + kv > device.memory:
        who = "target" if draft is None else "target and draft"
        raise ValueError(
            f"batch {batch} at {context_len:,} tokens of context does not fit on {device.name}: "
            f"{who} weights {weights / 1e9:.1f} GB + K/V {kv / 1e9:.1f} GB = "
            f"{(weights + kv) / 1e9:.1f} GB > {device.memory / 1e9:.0f} GB of memory; use a "
            "smaller batch or context, quantized weights or K/V, or more GPUs")


@dataclass(frozen=True)
class SpeculativeStepCost:
    """One speculative step on the roofline. draft_steps: the draft's k forwards, each a decode
    step of its own (its weights, its K/V, its fixed cost; none for prompt lookup); verify: the
    target's forward over k + 1 tokens a request; time: all in sequence, seconds. float(cost)
    is cost.time."""

    draft_steps: tuple[StepCost, ...]
    verify: StepCost

    @property
    def draft_time(self) -> float:
        """Seconds of the draft's forwards (0 for prompt lookup)."""
        return sum(step.time for step in self.draft_steps)

    @property
    def time(self) -> float:
        return self.draft_time + self.verify.time

    def __float__(self) -> float:
        return self.time


def speculative_step_time(model: ModelLike, hw: Hardware | str, batch: int, context_len: int,
                          k: int, draft: ModelLike | None = None, dtype_bytes: float = 2,
                          overhead: float = 0.0, *, kv_dtype_bytes: float | None = None,
                          draft_overhead: float | None = None) -> SpeculativeStepCost:
    """The modelled time of one speculative step for `batch` decodes at context_len tokens
    (counting the new token, as decode_step_time does: a plain step would be (1, context_len)).

    The draft (None: prompt lookup, whose string matching on the host is not priced) runs k
    decode steps on the same GPU, at contexts context_len .. context_len + k - 1, each a step of
    its own on the roofline: the draft's weights and K/V read once a forward, plus
    draft_overhead seconds (launches, sampling the draft token, the loop between forwards;
    None: overhead, the target's). A small draft's forward is rarely at its roofline, so a
    measured draft_overhead is what makes the model honest. Then the target checks the last
    token and the k proposals in one forward of (k + 1, context_len + k) a request: k + 1 times
    the FLOPs of a decode step (logits at every position included: with_verified_rows), the
    weights still read once. overhead: seconds added to every target forward.
    dtype_bytes and kv_dtype_bytes price weights and K/V of both models, as in roofline.step_time.
    A batch whose weights and K/V (target's and draft's, at context_len + k) do not fit the
    device is refused with a ValueError (check_fits).
    """
    _check_k(k)
    if not (isinstance(batch, int) and batch >= 1 and isinstance(context_len, int)
            and context_len >= 1):
        raise ValueError(f"batch and context_len must be positive ints, got batch={batch!r}, "
                         f"context_len={context_len!r}")
    if draft_overhead is not None and not draft_overhead >= 0:
        raise ValueError(f"draft_overhead must be >= 0 seconds a forward, got {draft_overhead!r}")
    check_fits(model, hw, batch, context_len + k, draft, dtype_bytes,
               kv_dtype_bytes=kv_dtype_bytes)
    draft_steps: tuple[StepCost, ...] = ()
    if draft is not None:
        per_forward = overhead if draft_overhead is None else draft_overhead
        draft_steps = tuple(decode_step_time(draft, hw, batch, context_len + i, dtype_bytes,
                                             per_forward, kv_dtype_bytes=kv_dtype_bytes)
                            for i in range(k))
    verify = step_time(model, hw, [(k + 1, context_len + k)] * batch, dtype_bytes, overhead,
                       kv_dtype_bytes=kv_dtype_bytes)
    verify = with_verified_rows(verify, model, hw, k * batch)
    return SpeculativeStepCost(draft_steps, verify)


def speculative_speedup(model: ModelLike, hw: Hardware | str, batch: int, context_len: int,
                        k: int, alpha: float, draft: ModelLike | None = None,
                        dtype_bytes: float = 2, overhead: float = 0.0, *,
                        kv_dtype_bytes: float | None = None,
                        draft_overhead: float | None = None) -> float:
    """Output tokens per second with speculation over without: E(alpha, k) / speculative step
    time against 1 / decode step time, for `batch` decodes at context_len (see
    speculative_step_time for the arguments; a batch that does not fit raises ValueError).
    Above 1 speculation pays.

    It is largest at batch 1, where a decode step is bound by reading the weights and checking
    k + 1 tokens costs about as much as making one. It shrinks as the batch grows: each request
    adds k + 1 tokens of matmul FLOPs to the verify step but only 1 to a decode step, so the
    verify step turns compute-bound first, then costs up to k + 1 decode steps while it still
    yields only E < k + 1 tokens; at large batch the decode step itself stops being
    bandwidth-bound (its intensity is about the batch size), and the idle compute speculation
    spends is gone. Long contexts delay this: the K/V reads, which speculation shares across
    the k + 1 tokens, keep both steps memory-bound."""
    E = expected_tokens_per_step(alpha, k)
    spec = speculative_step_time(model, hw, batch, context_len, k, draft, dtype_bytes, overhead,
                                 kv_dtype_bytes=kv_dtype_bytes, draft_overhead=draft_overhead)
    plain = decode_step_time(model, hw, batch, context_len, dtype_bytes, overhead,
                             kv_dtype_bytes=kv_dtype_bytes)
    return E * plain.time / spec.time


def best_num_speculative_tokens(model: ModelLike, hw: Hardware | str, batch: int,
                                context_len: int, alpha: float, draft: ModelLike | None = None,
                                max_k: int = 16, dtype_bytes: float = 2, overhead: float = 0.0,
                                *, kv_dtype_bytes: float | None = None,
                                draft_overhead: float | None = None) -> tuple[int, float]:
    """(k, speedup): the k in 1..max_k with the highest speculative_speedup, or (0, 1.0) when
    none beats plain decode (turn speculation off). A longer proposal adds alpha^k tokens to E
    but a draft forward and k + 1-token verify FLOPs to the cost, so the best k falls as alpha
    falls, as the draft gets dearer, and as the batch grows. A batch that does not fit even
    with k = 1 raises ValueError (check_fits); a k whose lookahead tips it over is skipped."""
    _check_k(max_k)
    check_fits(model, hw, batch, context_len + 1, draft, dtype_bytes,
               kv_dtype_bytes=kv_dtype_bytes)
    best = (0, 1.0)
    for k in range(1, max_k + 1):
        try:
            speedup = speculative_speedup(model, hw, batch, context_len, k, alpha, draft,
                                          dtype_bytes, overhead, kv_dtype_bytes=kv_dtype_bytes,
                                          draft_overhead=draft_overhead)
        except ValueError:  # k more tokens of K/V a sequence no longer fit: nor will longer
            break
        if speedup > best[1]:
            best = (k, speedup)
    return best
