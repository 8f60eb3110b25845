"""Lossless, checked by sampling: speculative decoding draws from the target's distribution.

The rejection-sampling rule (minillm.spec.rejection) promises that every emitted token is
distributed exactly as the target model would sample it, whatever the proposer. Greedy identity
checks that promise only where every distribution is one-hot. This module checks it where it is
not: a tiny random model with an 8-token vocabulary, whose next-token distributions are far from
uniform, samples the first two tokens after a fixed prompt thousands of times, with and without
speculation. The second token comes out of a verification (accepted, or drawn from the residual
after a rejection), so it is where a wrong rule would show. The exact probability of each of the
64 pairs comes from plain forwards (p(a) * p(b | a)), and Pearson's chi-square test asks whether
the counts could have come from it.

The power to see a 5% shift (the issue's bar) is part of the check: the same counts are tested
against the exact distribution with 0.05 of its mass moved from the likeliest pair to the next,
and that test must reject.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass

import torch

from minillm.config import EngineConfig
from minillm.engine import Engine
from minillm.model import LlamaForCausalLM
from minillm.model_config import ModelConfig
from minillm.sampling import SamplingParams
from minillm.spec.config import SpeculativeConfig

VOCAB = 8
TINY = ModelConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                   max_position_embeddings=64)
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]  # repetitive: prompt lookup always finds something to propose
Z_999 = 3.09  # the 0.999 quantile of N(0, 1): a test at the 0.1% level


def tiny_random_model(seed: int) -> LlamaForCausalLM:
    """TINY with random weights large enough (std 0.4) that its next-token distributions are
    far from uniform: a uniform target would hide a biased rule."""
    model = LlamaForCausalLM.random(TINY)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.4)
    return model


def tiny_engine(method: str | None, k: int = 2, target_seed: int = 0,
                draft_seed: int = 1) -> Engine:
    """An engine over tiny_random_model(target_seed). method: None (plain), "ngram" (prompt
    lookup) or "draft_model" (tiny_random_model(draft_seed) proposes: it disagrees with the
    target, so rejections and residual draws happen)."""
    spec, draft = None, None
    if method == "ngram":
        spec = SpeculativeConfig("ngram", num_speculative_tokens=k, prompt_lookup_max=2)
    elif method == "draft_model":
        # The folder must exist but is not read: the draft is handed over in memory.
        spec = SpeculativeConfig("draft_model", num_speculative_tokens=k,
                                 model=tempfile.gettempdir())
        draft = tiny_random_model(draft_seed)
    elif method is not None:
        raise ValueError(f"method must be None, 'ngram' or 'draft_model', got {method!r}")
    config = EngineConfig(num_kv_blocks=2048, max_model_len=64, max_num_seqs=256,
                          max_num_batched_tokens=4096, speculative_config=spec)
    return Engine(tiny_random_model(target_seed), None, config, draft_model=draft)


def sample_pairs(engine: Engine, num_samples: int, prompt: list[int] = PROMPT) -> torch.Tensor:
    """Counts (V, V) of the first two sampled tokens of num_samples seeded requests
    (temperature 1). max_tokens=3 leaves room for a proposal after the first token, so the
    second token is verified, not sampled plainly."""
    for seed in range(num_samples):
        engine.add_request(list(prompt), SamplingParams(max_tokens=3, temperature=1.0,
                                                        seed=seed, ignore_eos=True))
    counts = torch.zeros(VOCAB, VOCAB)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                counts[out.token_ids[0], out.token_ids[1]] += 1
    return counts


def exact_pairs(target_seed: int = 0, prompt: list[int] = PROMPT) -> torch.Tensor:
    """The target's probability (V, V) of each first-two-tokens pair: p(a) * p(b | a), from the
    log-probabilities of plain forwards over the prompt and the prompt plus each a."""
    plain = tiny_engine(None, target_seed=target_seed)
    params = SamplingParams(max_tokens=1, logprobs=VOCAB, ignore_eos=True)
    contexts = [list(prompt)] + [list(prompt) + [a] for a in range(VOCAB)]
    ids = [plain.add_request(context, params) for context in contexts]
    done = {}
    while plain.has_unfinished_requests():
        done |= {o.request_id: o for o in plain.step() if o.finished}
    probs = [torch.tensor([math.exp(done[i].logprobs[0][v]) for v in range(VOCAB)])
             for i in ids]
    return probs[0][:, None] * torch.stack(probs[1:])  # (V, 1) * (V, V) -> (V, V)


@dataclass(frozen=True)
class ChiSquare:
    """Pearson's goodness-of-fit test: statistic against the critical value for df degrees of
    freedom; rejects when the counts are unlikely (below the 0.1% level) to come from the
    expected distribution."""

    statistic: float
    df: int
    critical: float

    @property
    def rejects(self) -> bool:
        return self.statistic > self.critical


def chi_square(counts: torch.Tensor, expected_probs: torch.Tensor, z: float = Z_999
               ) -> ChiSquare:
    """Pearson's test of counts (any shape) against expected_probs (same shape, summing to 1).
    Cells expecting fewer than 5 samples are pooled into one (the test's usual rule). The
    critical value is Wilson and Hilferty's approximation of the chi-square quantile from the
    normal quantile z (3.09: the 0.1% level), good to a few percent for df >= 3."""
    if counts.shape != expected_probs.shape:
        raise ValueError(f"counts {tuple(counts.shape)} and expected_probs "
                         f"{tuple(expected_probs.shape)} must have one shape")
    if not math.isclose(float(expected_probs.sum()), 1.0, abs_tol=1e-4):
        raise ValueError(f"expected_probs must sum to 1, got {float(expected_probs.sum()):.6f}")
    expected = expected_probs.flatten().double() * counts.sum().double()
    observed = counts.flatten().double()
    small = expected < 5
    e, o = expected[~small], observed[~small]
    if small.any():
        e = torch.cat([e, expected[small].sum()[None]])
        o = torch.cat([o, observed[small].sum()[None]])
    statistic = float(((o - e) ** 2 / e).sum())
    df = len(e) - 1
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return ChiSquare(statistic, df, critical)


def shift_mass(probs: torch.Tensor, mass: float = 0.05) -> torch.Tensor:
    """probs with `mass` moved from its likeliest cell to the next likeliest: the smallest
    bias the test must be able to see."""
    flat = probs.flatten().clone()
    first, second = flat.topk(2).indices
    if flat[first] < mass:
        raise ValueError(f"the likeliest cell holds {float(flat[first]):.3f} < mass {mass}")
    flat[first] -= mass
    flat[second] += mass
    return flat.view_as(probs)
