"""What a model's outputs are worth, measured: perplexity on held-out text through the engine.

Quantization and other shortcuts trade quality for bytes; this module measures the quality
side. perplexity(llm) runs the held-out play (The Tempest, which the shipped model never saw in
training: see its model card) through the engine's own model, paged KV cache and attention
backend, in windows of `window` tokens, and returns exp(mean next-token cross-entropy). The
token stream and the windows are the training script's (minillm.train: <eos> text <eos>,
non-overlapping windows), so for the shipped model the loss reproduces the model card's val
figure, and a quantized LLM (quantization="int8", ...) is measured exactly as the original.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from minillm.batch import build_batch
from minillm.llm import LLM
from minillm.quant.kv_pool import allocate_kv_cache
from minillm.request import Request, ScheduledRequest
from minillm.sampling import SamplingParams

HELD_OUT = Path(__file__).parent / "assets" / "the_tempest.txt"


def held_out_text() -> str:
    """The Tempest (Project Gutenberg, public domain): the shipped model's validation play."""
    return HELD_OUT.read_text()


@dataclass(frozen=True)
class Perplexity:
    """loss: mean next-token cross-entropy in nats over num_tokens predicted tokens."""

    loss: float
    num_tokens: int

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)


def token_stream(llm: LLM, text: str) -> list[int]:
    """<eos> text <eos>, as minillm.train encodes a document."""
    if llm.tokenizer is None:
        raise ValueError("this LLM has no tokenizer (random weights): perplexity needs text")
    eos, fast = llm.tokenizer.eos_token_id, getattr(llm.tokenizer, "backend_tokenizer", None)
    # The fast tokenizer's own encoder, as training used: the wrapper warns on long texts.
    ids = fast.encode(text).ids if fast is not None else llm.tokenizer.encode(text)
    return [eos, *ids, eos]


@torch.no_grad()
def perplexity(llm: LLM, text: str | None = None, window: int = 256,
               windows_per_step: int = 8) -> Perplexity:
    """Perplexity of llm on text (default: the held-out play), in non-overlapping windows of
    window + 1 tokens (window predictions each), windows_per_step windows per forward pass.

    Runs on a KV pool of its own, so requests in flight in the engine are not disturbed."""
    if not isinstance(window, int) or not 2 <= window < llm.config.max_model_len:
        raise ValueError(f"window must be an int in [2, max_model_len={llm.config.max_model_len})"
                         f", got {window!r}")
    ids = token_stream(llm, held_out_text() if text is None else text)
    if len(ids) < window + 1:
        raise ValueError(f"the text has {len(ids)} tokens: fewer than one window of {window} + 1")
    engine, P = llm.engine, llm.config.block_size
    windows = [ids[i * window:(i + 1) * window + 1] for i in range((len(ids) - 1) // window)]
    blocks_each = -(-(window + 1) // P)
    mc = engine.model.config
    # In the engine's KV dtype, with its scales: an int8 or fp8 pool is measured as it serves.
    kv_cache = allocate_kv_cache(mc.num_hidden_layers, blocks_each * windows_per_step, P,
                                 mc.num_key_value_heads, mc.head_dim, engine.runner.kv_cache.dtype,
                                 engine.device)
    total, count = 0.0, 0
    for start in range(0, len(windows), windows_per_step):
        scheduled = []
        for j, tokens in enumerate(windows[start:start + windows_per_step]):
            req = Request(f"ppl-{start + j}", tokens[:-1], SamplingParams(), 0.0)
            req.block_table = list(range(j * blocks_each, (j + 1) * blocks_each))
            scheduled.append(ScheduledRequest(req, window, 0, "prefill"))
        batch = build_batch(scheduled, P, engine.device)
        hidden = engine.model(batch.input_ids, batch.positions, kv_cache, batch.attn,
                              engine.runner.backend, kv_scales=engine.runner.kv_scales)
        logits = engine.model.compute_logits(hidden).float()  # (T, V)
        targets = torch.tensor([t for w in windows[start:start + windows_per_step]
                                for t in w[1:]], device=logits.device)
        total += F.cross_entropy(logits, targets, reduction="sum").item()
        count += len(targets)
    return Perplexity(total / count, count)


# In 16 bits a near-tie greedy pick may flip between runs that batch, cache or preempt the same
# requests differently (their matmuls have other shapes and round differently); below this share
# of identical answers something other than rounding changed them.
MOST_ANSWERS = 0.5


def same_answers(reference: list[list[int]], others: list[list[list[int]]],
                 dtype: torch.dtype) -> tuple[list[float], bool]:
    """The share of requests whose greedy answer in each other run is the reference's, token for
    token, and whether that is what the dtype promises: every answer in fp32, where runs that
    differ only in scheduling compute the same numbers here; most of them (MOST_ANSWERS) in bf16
    or fp16, where a prefill or a batch of another shape rounds differently."""
    shares = []
    for run in others:
        if len(run) != len(reference):
            raise ValueError(f"a run has {len(run)} answers, the reference {len(reference)}")
        shares.append(sum(a == b for a, b in zip(reference, run)) / max(len(reference), 1))
    bar = 1.0 if dtype == torch.float32 else MOST_ANSWERS
    return shares, all(share >= bar for share in shares)
