"""A request's sampling parameters (vLLM's names and defaults), validated when they are made:
a bad value is a ValueError naming it, before any engine sees the request."""

from __future__ import annotations

import math
from dataclasses import dataclass

# Temperatures below this are greedy: logits / 1e-50 overflow float32 (inf / inf is NaN), and
# long before that the distribution is one-hot to float32's precision anyway.
MIN_TEMPERATURE = 1e-5
# torch.Generator takes seeds in [-2**63, 2**64): OpenAI's seed is an int64, vLLM's a Python int.
SEED_RANGE = (-(2**63), 2**64)


def _integer(name: str, value: object, lo: int, hi: int | None = None, what: str = "") -> int:
    """value as an int in [lo, hi], or a ValueError naming the field (a bool is no integer)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer{what}, got {value!r:.80}")
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be an integer {bound}{what}, got {value!r:.80}")
    return value


def _real(name: str, value: object, what: str) -> float:
    """value as a finite float, or a ValueError naming the field (a 400-digit int is too big)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number {what}, got {value!r:.80}")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{name} must be a finite number {what}, got an integer of "
                         f"{len(str(value))} digits") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number {what}, got {value!r}")
    return number


def check_unicode(name: str, text: str) -> str:
    """text, if UTF-8 can encode it (a lone surrogate such as "\\ud800", which JSON can carry,
    cannot, and a tokenizer then fails with a TypeError); else a ValueError naming it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{name} is not valid Unicode text ({e.reason} at character "
                         f"{e.start})") from None
    return text


def _text(name: str, value: object) -> str:
    """A non-empty string that UTF-8 can encode."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r:.80}")
    return check_unicode(name, value)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token of one request; defaults are vLLM's.

    temperature: 0 means greedy (as does anything below MIN_TEMPERATURE); higher flattens the
    distribution. top_k: keep the k most likely tokens (0 keeps all). top_p: keep the smallest
    set whose probability reaches p (nucleus sampling). seed: makes this request's samples
    reproducible whatever else shares its batches. logprobs: return the top-k log-probabilities
    (of the model's raw distribution) and the chosen token's, per generated token; the engine
    caps k at EngineConfig.max_logprobs (vLLM's 20). stop: strings that end generation (not
    included in the text). ignore_eos: keep generating past the end-of-sequence token, for
    benchmarks with fixed output lengths. min_tokens: generate at least this many tokens before
    the end-of-sequence token or a stop string may end the request (vLLM's: EOS is masked).

    Every field is checked here, type and range, so a bad value is a ValueError naming it
    before the engine sees the request, never a failure inside a step that others share.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0

    def __post_init__(self) -> None:
        _integer("max_tokens", self.max_tokens, 1)
        _integer("min_tokens", self.min_tokens, 0)
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens={self.min_tokens} must not exceed "
                             f"max_tokens={self.max_tokens}")
        temperature = _real("temperature", self.temperature, ">= 0")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        object.__setattr__(self, "temperature", 0.0 if temperature < MIN_TEMPERATURE
                           else temperature)
        # A top_k past the vocabulary keeps every token; past 2**31 it is no longer a count.
        _integer("top_k", self.top_k, 0, 2**31 - 1, " (0 disables it)")
        top_p = _real("top_p", self.top_p, "in (0, 1]")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        object.__setattr__(self, "top_p", top_p)
        if self.seed is not None:
            _integer("seed", self.seed, SEED_RANGE[0], SEED_RANGE[1] - 1)
        if self.logprobs is not None:
            _integer("logprobs", self.logprobs, 0, what=" or None")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r:.80}")
        self._check_stop()

    def _check_stop(self) -> None:
        if self.stop is None or isinstance(self.stop, str):
            if self.stop is not None:
                _text("stop", self.stop)
            return
        if not isinstance(self.stop, (list, tuple)):
            raise ValueError(f"stop must be a string or a list of non-empty strings, got "
                             f"{self.stop!r:.80}")
        for i, s in enumerate(self.stop):
            _text(f"stop[{i}]", s)
        object.__setattr__(self, "stop", list(self.stop))

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)
