"""Sampling: the per-request parameters and the batched sampler that turns logits into tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token of one request; defaults are vLLM's.

    temperature: 0 means greedy; higher flattens the distribution.
    top_k: keep the k most likely tokens (0 keeps all). top_p: keep the smallest set whose
    probability reaches p (nucleus sampling). seed: makes this request's samples reproducible
    whatever else shares its batches. logprobs: return the top-k log-probabilities (of the
    model's raw distribution) and the chosen token's, per generated token.
    stop: strings that end generation (not included in the text). ignore_eos: keep generating
    past the end-of-sequence token, for benchmarks with fixed output lengths.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not self.temperature >= 0:  # also rejects NaN
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            raise ValueError(f"logprobs must be None or an integer >= 0, got {self.logprobs!r}")
        if isinstance(self.stop, list) and not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(
                f"stop must be a string or a list of non-empty strings, got {self.stop!r}")
        if isinstance(self.stop, str) and not self.stop:
            raise ValueError("stop must not be the empty string")

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[dict[int, float] | None]


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
                      ) -> torch.Tensor:
    """Set logits outside each row's top-k and top-p set to -inf.

    logits (B, V) float32; top_k (B,) int64 with 0 meaning off; top_p (B,) float32 in (0, 1].
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V)
    vocab = logits.shape[-1]
    k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab)  # (B,)
    ranks = torch.arange(vocab, device=logits.device)  # (V,)
    remove = ranks[None, :] >= k[:, None]  # (B, V): past the k-th best
    probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(dim=-1)
    # A token is dropped when the tokens ranked above it already reach top_p; the best one never is.
    mass_before = probs.cumsum(dim=-1) - probs  # (B, V)
    remove |= mass_before >= top_p[:, None]
    remove[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


class Sampler:
    """Picks one token per row of logits, each row with its own request's parameters."""

    def __call__(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator],
    ) -> SampleResult:
        """logits (B, V) float32, one row per request that samples this step."""
        logits = logits.float()
        greedy = logits.argmax(dim=-1)  # (B,)
        tokens = greedy.clone()
        sampled_rows = [i for i, p in enumerate(params) if p.temperature > 0]
        if sampled_rows:
            rows = torch.tensor(sampled_rows, device=logits.device)
            temperature = torch.tensor([params[i].temperature for i in sampled_rows],
                                       device=logits.device)
            top_k = torch.tensor([params[i].top_k for i in sampled_rows], device=logits.device)
            top_p = torch.tensor([params[i].top_p for i in sampled_rows], device=logits.device)
            scaled = logits[rows] / temperature[:, None]  # (R, V)
            probs = apply_top_k_top_p(scaled, top_k, top_p).softmax(dim=-1)
            for j, i in enumerate(sampled_rows):
                # Each request draws from its own generator, so batching never changes its samples.
                tokens[i] = torch.multinomial(probs[j], 1, generator=generators[i])[0]
        token_ids = tokens.tolist()
        return SampleResult(token_ids, self._logprobs(logits, params, token_ids))

    @staticmethod
    def _logprobs(
        logits: torch.Tensor, params: list[SamplingParams], token_ids: list[int]
    ) -> list[dict[int, float] | None]:
        if all(p.logprobs is None for p in params):
            return [None] * len(params)
        logprobs = logits.log_softmax(dim=-1)  # (B, V): the model's own distribution
        result: list[dict[int, float] | None] = []
        for i, p in enumerate(params):
            if p.logprobs is None:
                result.append(None)
                continue
            top = logprobs[i].topk(p.logprobs) if p.logprobs else None
            entry = dict(zip(top.indices.tolist(), top.values.tolist())) if top is not None else {}
            entry[token_ids[i]] = logprobs[i, token_ids[i]].item()
            result.append(entry)
        return result
