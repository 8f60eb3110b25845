"""Lossless, checked by sampling: speculative decoding draws from the target's distribution.

The rejection-sampling rule (minillm.spec.rejection) promises that every emitted token is
distributed exactly as the target model would sample it, whatever the proposer. Greedy identity
checks that promise only where every distribution is one-hot. This module checks it where it is
not: a tiny random model with an 8-token vocabulary, whose next-token distributions are far from
uniform, samples the first k + 2 tokens after a fixed prompt thousands of times, with and
without speculation (sample_sequences). With k = 2 the first token comes from the prefill and
the next three from the first verification and what follows it: an accepted proposal, a residual
draw after a rejection, or the bonus token when every proposal passed, so every emitted position
of a verification is counted. The exact probability of every sequence comes from plain forwards
over every prefix (exact_sequences), and Pearson's chi-square test asks, position by position,
whether the counts of each consecutive pair (x_{t-1}, x_t) could have come from it
(position_pairs, chi_square).

The power to see a 5% shift is part of the check: the same counts are tested against the exact
distribution with 0.05 of its mass moved from the likeliest pair to the next, and that test must
reject. shift_power says how often it does at a given number of samples (by simulation), which
is how the chapter sizes its samples.
"""

from __future__ import annotations

import itertools
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
from minillm.spec.ngram import propose_ngram

LOOKUP_MAX = 2  # tiny_engine's prompt_lookup_max

VOCAB = 8
TINY = ModelConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                   max_position_embeddings=64)
# Repetitive, so prompt lookup has matches to find, but only after some tokens: with
# prompt_lookup_max=2 it proposes after a first token of 1, 2 or 3 (seen in the prompt) and
# nothing after any other (proposes_nothing measures how often); those steps sample plainly.
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]
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
        spec = SpeculativeConfig("ngram", num_speculative_tokens=k, prompt_lookup_max=LOOKUP_MAX)
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
    (temperature 1): position 1 of sample_sequences with three tokens, since a third leaves room
    for a proposal after the first token, so the second is verified, not sampled plainly."""
    return position_pairs(sample_sequences(engine, num_samples, 3, prompt))[0]


def exact_pairs(target_seed: int = 0, prompt: list[int] = PROMPT) -> torch.Tensor:
    """The target's probability (V, V) of each first-two-tokens pair, p(a) * p(b | a)
    (exact_sequences of length 2)."""
    return exact_sequences(2, target_seed, prompt)


def sample_sequences(engine: Engine, num_samples: int, length: int,
                     prompt: list[int] = PROMPT) -> torch.Tensor:
    """(num_samples, length) int64: the first `length` sampled tokens of num_samples seeded
    requests (temperature 1). With length = k + 2 the first verification's every emitted
    position is in it, its bonus token included (the bonus is position k + 1)."""
    if not (isinstance(length, int) and length >= 2):
        raise ValueError(f"length must be an int >= 2 (the first verified token is the second), "
                         f"got {length!r}")
    ids = [engine.add_request(list(prompt), SamplingParams(max_tokens=length, temperature=1.0,
                                                           seed=seed, ignore_eos=True))
           for seed in range(num_samples)]
    done = {}
    while engine.has_unfinished_requests():
        done |= {o.request_id: o.token_ids for o in engine.step() if o.finished}
    return torch.tensor([done[i][:length] for i in ids], dtype=torch.int64)


def exact_sequences(length: int, target_seed: int = 0, prompt: list[int] = PROMPT
                    ) -> torch.Tensor:
    """The target's probability (V,) * length of each sequence of its first `length` tokens:
    the product of next-token probabilities along it, from plain forwards over the prompt plus
    every prefix of up to length - 1 tokens (1 + 8 + 64 + 512 forwards for length 4)."""
    plain = tiny_engine(None, target_seed=target_seed)
    params = SamplingParams(max_tokens=1, logprobs=VOCAB, ignore_eos=True)
    prefixes = [pre for n in range(length) for pre in itertools.product(range(VOCAB), repeat=n)]
    ids = {pre: plain.add_request(list(prompt) + list(pre), params) for pre in prefixes}
    done = {}
    while plain.has_unfinished_requests():
        done |= {o.request_id: o for o in plain.step() if o.finished}
    joint = torch.ones((), dtype=torch.float64)
    for n in range(length):
        # next-token probabilities after every prefix of n tokens, (V,) * n + (V,)
        probs = torch.tensor([[math.exp(done[ids[pre]].logprobs[0][v]) for v in range(VOCAB)]
                              for pre in itertools.product(range(VOCAB), repeat=n)],
                             dtype=torch.float64).view(*([VOCAB] * n), VOCAB)
        joint = joint[..., None] * probs
    return (joint / joint.sum()).float()  # the logprobs are rounded: renormalise to 1


def position_pairs(sequences: torch.Tensor) -> list[torch.Tensor]:
    """Counts (V, V) of each consecutive pair (x_{t-1}, x_t), one per position t = 1 .. L - 1
    of (N, L) sampled sequences."""
    return [torch.bincount(sequences[:, t - 1] * VOCAB + sequences[:, t],
                           minlength=VOCAB * VOCAB).view(VOCAB, VOCAB).float()
            for t in range(1, sequences.shape[1])]


def exact_position_pairs(joint: torch.Tensor) -> list[torch.Tensor]:
    """The probabilities (V, V) of each consecutive pair, one per position t = 1 .. L - 1, from
    exact_sequences' joint (V,) * L: the joint summed over the other positions."""
    length = joint.dim()
    return [joint.sum(dim=tuple(d for d in range(length) if d not in (t - 1, t)))
            for t in range(1, length)]


def proposes_nothing(first_tokens: torch.Tensor, k: int = 2,
                     prompt: list[int] = PROMPT) -> float:
    """The share of first tokens after which prompt lookup (prompt_lookup_max 2, as in
    tiny_engine) proposes nothing: its first decode step then samples plainly."""
    empty = [not propose_ngram(list(prompt) + [int(a)], k, LOOKUP_MAX) for a in first_tokens]
    return sum(empty) / max(len(empty), 1)


def shift_power(expected_probs: torch.Tensor, num_samples: int, mass: float = 0.05,
                trials: int = 1000, seed: int = 0) -> float:
    """The power of the shift check at num_samples samples, by simulation: the share of
    `trials` multinomial samples drawn from expected_probs (what a lossless engine produces)
    that chi_square rejects against shift_mass(expected_probs, mass)."""
    shifted = shift_mass(expected_probs, mass)
    gen = torch.Generator().manual_seed(seed)
    flat = expected_probs.flatten()
    rejected = 0
    for _ in range(trials):
        draws = torch.multinomial(flat, num_samples, replacement=True, generator=gen)
        counts = torch.bincount(draws, minlength=flat.numel()).float().view_as(expected_probs)
        rejected += chi_square(counts, shifted).rejects
    return rejected / trials


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
