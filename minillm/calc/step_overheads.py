"""What a step costs beyond its roofline time: the overheads no count of FLOPs and bytes sees.

The roofline (minillm.calc.roofline) prices a step's FLOPs and bytes at the device's peaks; a
real engine also pays per step, per token, per request and per attention pair. These four
seconds travel together, from calibration's fit to the simulator's clock, as one StepOverheads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


def attention_pairs(entries: Iterable[tuple[int, int]]) -> int:
    """(query, key) pairs that attention visits in a step: n * c - n * (n - 1) / 2 per entry of
    n new tokens ending at context c (a decode: c; a whole prefill of I tokens: I * (I + 1) / 2).
    """
    return sum(n * c - n * (n - 1) // 2 for n, c in entries)


@dataclass(frozen=True)
class StepOverheads:
    """What a step costs beyond its roofline time, in seconds, which no count of FLOPs and bytes
    sees: overhead once per step (scheduling, kernel launches), overhead_per_token per new token
    (norms, rotary embeddings, small ops below peak), overhead_per_seq per request in the batch
    (its batch metadata, sampling, a per-request attention call) and overhead_per_pair per
    attention (query, key) pair (attention_pairs: an attention that materialises its score
    matrix, as the PyTorch reference does, pays in bytes per pair that a fused kernel never
    writes). minillm.calibration fits them on this machine; step_time takes them as keywords,
    simulate, simulate_fleet and recommend as one StepOverheads (or a dict of these names)."""

    overhead: float = 0.0
    overhead_per_token: float = 0.0
    overhead_per_seq: float = 0.0
    overhead_per_pair: float = 0.0

    def __post_init__(self) -> None:
        values = self.as_tuple()
        if any(isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0
               for v in values):
            raise ValueError("overheads must be >= 0 seconds, got " + ", ".join(
                f"{name}={value!r}" for name, value in zip(OVERHEAD_TERMS, values)))

    @classmethod
    def of(cls, overheads: StepOverheads | Mapping[str, float] | None) -> StepOverheads:
        """overheads as given; a mapping of the field names (CalibrationReport.overheads()'s
        keywords, say), any other name refused by name; None: none at all."""
        if isinstance(overheads, StepOverheads):
            return overheads
        named = dict(overheads or {})
        for name in named:
            if name not in OVERHEAD_TERMS:
                raise ValueError(f"unknown overhead {name!r}; use {', '.join(OVERHEAD_TERMS)}")
        return cls(**named)

    def as_tuple(self) -> tuple[float, float, float, float]:
        """The four, in the order a cost model takes them after dtype_bytes (as step_time)."""
        return (self.overhead, self.overhead_per_token, self.overhead_per_seq,
                self.overhead_per_pair)

    def as_keywords(self) -> dict[str, float]:
        """The four as step_time's keywords."""
        return dict(zip(OVERHEAD_TERMS, self.as_tuple()))

    @staticmethod
    def terms(entries: Sequence[tuple[int, int]]) -> tuple[int, int, int, int]:
        """What each overhead multiplies in a step: (1 step, new tokens, requests, pairs)."""
        return 1, sum(n for n, _ in entries), len(entries), attention_pairs(entries)

    def seconds(self, entries: Sequence[tuple[int, int]]) -> float:
        """The overheads of one step over entries; terms with a zero coefficient go uncounted,
        since the simulator asks once a step."""
        extra = self.overhead
        if self.overhead_per_token:
            extra += self.overhead_per_token * sum(n for n, _ in entries)
        if self.overhead_per_seq:
            extra += self.overhead_per_seq * len(entries)
        if self.overhead_per_pair:
            extra += self.overhead_per_pair * attention_pairs(entries)
        return extra


OVERHEAD_TERMS = ("overhead", "overhead_per_token", "overhead_per_seq", "overhead_per_pair")
