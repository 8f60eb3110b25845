"""Speculative decoding in the simulator (minillm.simulator), which runs no model.

The scheduler reserves 1 + k tokens for each decode as in the engine; what the simulator lacks
is a model to propose and check them. SimulatedSpeculation stands in for both: each proposed
token is accepted with probability acceptance_rate until the first rejection (the i.i.d. model
behind minillm.spec.cost.expected_tokens_per_step, so a long run's mean accepted length checks
that formula), and a draft model's forwards are priced on the roofline like the target's.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minillm.calc.models import ModelLike, as_config
from minillm.model_config import ModelConfig
from minillm.request import ScheduledRequest
from minillm.spec.config import SpeculativeConfig
from minillm.spec.cost import check_acceptance_rate


def is_speculative(s: ScheduledRequest) -> bool:
    """A decode that carries proposals: its last token plus num_tokens - 1 proposed ones."""
    return s.phase == "decode" and s.num_tokens > 1


@dataclass
class SimulatedSpeculation:
    """Acceptance drawn at acceptance_rate (seeded: runs repeat) and the draft model, if any,
    whose forwards each step pays for. Counts what LLM.stats() reports as spec_decode_*."""

    acceptance_rate: float
    draft: ModelConfig | None = None
    seed: int = 0
    num_drafts: int = 0  # decodes that carried proposals, one per request per step
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_acceptance_rate(self.acceptance_rate)
        self.rng = random.Random(self.seed)

    def accept(self, num_proposed: int) -> int:
        """How many of num_proposed tokens the target accepts: the run before the first
        rejection, each accepted with probability acceptance_rate."""
        accepted = 0
        while accepted < num_proposed and self.rng.random() < self.acceptance_rate:
            accepted += 1
        self.num_drafts += 1
        self.num_draft_tokens += num_proposed
        self.num_accepted_tokens += accepted
        return accepted

    def draft_forwards(self, scheduled: Sequence[ScheduledRequest]
                       ) -> list[list[tuple[int, int]]]:
        """The draft's forwards in a step, each a roofline batch of (new tokens, context):
        forward i proposes token i + 1 for every decode with more than i proposals; the first
        also runs the step's prefill chunks, whose K/V the draft needs to propose later."""
        proposals = [(s.num_tokens - 1, s.num_computed_tokens + 1)  # (k, context at token 1)
                     for s in scheduled if is_speculative(s)]
        longest = max((k for k, _ in proposals), default=0)
        forwards = [[(1, context + i) for k, context in proposals if k > i]
                    for i in range(max(longest, 1))]
        forwards[0] = [(s.num_tokens, s.num_computed_tokens + s.num_tokens)
                       for s in scheduled if s.phase == "prefill"] + forwards[0]
        return [batch for batch in forwards if batch]

    def draft_time(self, scheduled: Sequence[ScheduledRequest],
                   price: Callable[[ModelConfig, list[tuple[int, int]]], float]) -> float:
        """Seconds of the draft's forwards in this step (0 without a draft model: prompt
        lookup's matching runs on the host, unpriced); price(model, batch) times one forward."""
        if self.draft is None:
            return 0.0
        return sum(price(self.draft, batch) for batch in self.draft_forwards(scheduled))

    def stats(self) -> dict[str, int]:
        return {"spec_decode_num_drafts": self.num_drafts,
                "spec_decode_num_draft_tokens": self.num_draft_tokens,
                "spec_decode_num_accepted_tokens": self.num_accepted_tokens}


def _method(spec: object) -> str | None:
    """speculative_config's method, read as SpeculativeConfig.from_dict reads it."""
    if isinstance(spec, SpeculativeConfig):
        return spec.method
    if isinstance(spec, dict):
        method = spec.get("method", "draft_model" if spec.get("model") else None)
        return "draft_model" if method == "draft" else method
    return None  # not a config: EngineConfig says what is wrong with it


def split_speculation(engine_kwargs: dict[str, Any], acceptance_rate: float | None,
                      draft_model: ModelLike | None, seed: int = 0
                      ) -> tuple[dict[str, Any], SimulatedSpeculation | None]:
    """simulate's speculative keywords, checked: (EngineConfig's kwargs, the stand-in or None).

    speculative_config goes to the EngineConfig (the scheduler reads its k). acceptance_rate is
    required with it, since no model accepts or rejects here. draft_model prices a draft and
    needs method "draft_model"; it defaults to the config.json in the config's "model" folder.
    A draft given only by shape ({"method": "draft_model", "num_speculative_tokens": 4} with
    draft_model="llama-3.2-1b") has no folder for SpeculativeConfig to check, so the EngineConfig
    records method "ngram" with the same k, and the simulation prices the draft_model.
    """
    spec = engine_kwargs.get("speculative_config")
    if spec is None:
        if acceptance_rate is not None or draft_model is not None:
            raise ValueError("acceptance_rate and draft_model price speculative decoding: pass "
                             "speculative_config={'method': 'ngram', 'num_speculative_tokens': "
                             "4} (or method 'draft_model') too")
        return engine_kwargs, None
    if acceptance_rate is None:
        raise ValueError("the simulator runs no model, so nothing accepts or rejects the "
                         "proposals: pass acceptance_rate (the chance each proposed token is "
                         "accepted, e.g. 0.7)")
    method = _method(spec)
    shape_only = isinstance(spec, dict) and method == "draft_model" and not spec.get("model")
    if shape_only:
        if draft_model is None:
            raise ValueError("speculative_config method 'draft_model' needs a draft: pass "
                             "draft_model= (a name such as 'llama-3.2-1b' or a ModelConfig) or "
                             "'model': a checkpoint folder")
        spec = {**spec, "method": "ngram"}  # the scheduler reads only k; the draft is priced
        engine_kwargs = {**engine_kwargs, "speculative_config": spec}
    elif method == "draft_model" and draft_model is None:
        folder = spec.model if isinstance(spec, SpeculativeConfig) else spec["model"]
        draft_model = ModelConfig.from_pretrained(Path(folder))
    elif method != "draft_model" and draft_model is not None:
        raise ValueError(f"draft_model={draft_model!r} prices a draft model, but speculative_"
                         f"config's method is {method!r}: use method 'draft_model'")
    draft = None if draft_model is None else as_config(draft_model)
    return engine_kwargs, SimulatedSpeculation(acceptance_rate, draft, seed)
