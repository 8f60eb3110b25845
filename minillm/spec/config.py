"""SpeculativeConfig: what LLM(speculative_config={...}) asks for, checked once (vLLM's keys)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

SpecMethod = Literal["ngram", "draft_model"]


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding's settings.

    method: "ngram" (prompt lookup: propose the tokens that followed the last n tokens' latest
        earlier occurrence in the request's own text; no draft model) or "draft_model" (a small
        model with the same tokenizer proposes them, one forward per token).
    num_speculative_tokens: k, the most tokens proposed per request per step; the target checks
        them all in one forward of k + 1 tokens.
    prompt_lookup_max, prompt_lookup_min: the longest and shortest n-gram the ngram method
        matches (longest first).
    model: the draft model's checkpoint folder (method "draft_model").
    """

    method: SpecMethod
    num_speculative_tokens: int
    prompt_lookup_max: int = 3
    prompt_lookup_min: int = 1
    model: str | None = None

    @classmethod
    def from_dict(cls, spec: dict) -> SpeculativeConfig:
        """vLLM's dict form: {"method": "ngram", "num_speculative_tokens": 4,
        "prompt_lookup_max": 3} or {"model": PATH, "num_speculative_tokens": 4}."""
        if not isinstance(spec, dict):
            raise ValueError(f"speculative_config must be a dict such as {{'method': 'ngram', "
                             f"'num_speculative_tokens': 4}}, got {spec!r}")
        known = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
                 "model"}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ValueError(f"speculative_config has unknown keys {unknown}; known: "
                             f"{sorted(known)}")
        if "num_speculative_tokens" not in spec:
            raise ValueError("speculative_config needs 'num_speculative_tokens' (k, e.g. 4)")
        method = spec.get("method", "draft_model" if spec.get("model") else None)
        if method == "draft":
            method = "draft_model"
        return cls(method=method, num_speculative_tokens=spec["num_speculative_tokens"],
                   prompt_lookup_max=spec.get("prompt_lookup_max", 3),
                   prompt_lookup_min=spec.get("prompt_lookup_min", 1),
                   model=None if spec.get("model") is None else str(spec["model"]))

    def __post_init__(self) -> None:
        if self.method not in ("ngram", "draft_model"):
            raise ValueError(f"speculative_config method must be 'ngram' or 'draft_model' (or "
                             f"give 'model': a draft checkpoint folder), got {self.method!r}")
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 32:
            raise ValueError(f"num_speculative_tokens must be an integer in [1, 32], got {k!r}")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        for name, n in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {n!r}")
        if lo > hi:
            raise ValueError(f"prompt_lookup_min={lo} exceeds prompt_lookup_max={hi}")
        if self.method == "draft_model":
            if self.model is None:
                raise ValueError("speculative_config method 'draft_model' needs 'model': the "
                                 "draft checkpoint folder (e.g. minillm.default_draft_path())")
            if not Path(self.model).is_dir():
                raise OSError(f"draft model folder {self.model!r} does not exist (minillm never "
                              "downloads weights: pass a local checkpoint folder)")
        elif self.model is not None:
            raise ValueError("speculative_config: 'model' is for method 'draft_model'; the "
                             "ngram method has no draft model")
