"""Length distributions of prompts and outputs: Fixed, Uniform, LogNormal, Mixture, Choice.

A length argument of a workload is an int (fixed), a (lo, hi) tuple (uniform integers,
inclusive) or one of these objects; as_distribution turns any of them into an object with
.sample(rng). minillm.workloads.streams re-exports them all.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@runtime_checkable
class LengthDistribution(Protocol):
    """Anything that draws a length in tokens from a random.Random."""

    def sample(self, rng: random.Random) -> int: ...


Length = int | tuple[int, int] | LengthDistribution


def check_int(value: object, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True)
class Fixed:
    """Always n tokens."""

    n: int

    def __post_init__(self) -> None:
        check_int(self.n, "Fixed length n")

    def sample(self, rng: random.Random) -> int:
        return self.n


@dataclass(frozen=True)
class Uniform:
    """Uniform integers in [lo, hi], both inclusive; median (lo + hi) / 2."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        check_int(self.lo, "Uniform lo")
        if check_int(self.hi, "Uniform hi") < self.lo:
            raise ValueError(f"Uniform needs lo <= hi, got lo={self.lo!r}, hi={self.hi!r}")

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.lo, self.hi)


@dataclass(frozen=True)
class LogNormal:
    """Lengths whose log is normal: median tokens, sigma the spread of the log (0.5 ~ x1.65).

    Real prompt and output lengths are right-skewed like this. Draws are rounded and clipped to
    [lo, hi] (hi None: no upper bound); clipping keeps the median when lo <= median <= hi.
    """

    median: float
    sigma: float
    lo: int = 1
    hi: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.median, (int, float)) and math.isfinite(self.median)
                and self.median > 0):
            raise ValueError(f"LogNormal median must be a positive number, got {self.median!r}")
        if not (isinstance(self.sigma, (int, float)) and math.isfinite(self.sigma)
                and self.sigma >= 0):
            raise ValueError(f"LogNormal sigma must be a number >= 0, got {self.sigma!r}")
        check_int(self.lo, "LogNormal lo")
        if self.hi is not None and check_int(self.hi, "LogNormal hi") < self.lo:
            raise ValueError(f"LogNormal needs lo <= hi, got lo={self.lo!r}, hi={self.hi!r}")

    def sample(self, rng: random.Random) -> int:
        n = round(rng.lognormvariate(math.log(self.median), self.sigma))
        return max(self.lo, n if self.hi is None else min(n, self.hi))


@dataclass(frozen=True)
class Mixture:
    """Pick a component with probability proportional to its weight, then draw from it.

    components: (weight, length) pairs; a length is anything a length argument may be, e.g.
    Mixture([(0.9, Uniform(8, 32)), (0.1, Uniform(192, 256))]) for 90% short, 10% long answers.
    """

    components: tuple[tuple[float, Length], ...]

    def __init__(self, components: Sequence[tuple[float, Length]]):
        pairs = tuple((w, as_distribution(d, "a Mixture component")) for w, d in components)
        if not pairs:
            raise ValueError("Mixture needs at least one (weight, length) component")
        for w, _ in pairs:
            if not (isinstance(w, (int, float)) and math.isfinite(w) and w > 0):
                raise ValueError(f"Mixture weights must be positive numbers, got {w!r}")
        object.__setattr__(self, "components", pairs)

    def sample(self, rng: random.Random) -> int:
        weights = [w for w, _ in self.components]
        _, dist = rng.choices(self.components, weights=weights)[0]
        return dist.sample(rng)


class Choice(Mixture):
    """One of a few fixed lengths: Choice([16, 256], weights=[0.9, 0.1]); equal weights by
    default."""

    def __init__(self, values: Sequence[int], weights: Sequence[float] | None = None):
        weights = [1.0] * len(values) if weights is None else list(weights)
        if len(weights) != len(values):
            raise ValueError(f"Choice got {len(values)} values but {len(weights)} weights")
        super().__init__(list(zip(weights, values)))


def as_distribution(length: Length, name: str) -> LengthDistribution:
    """A length argument as a distribution; raises ValueError naming a bad one."""
    if isinstance(length, LengthDistribution) and not isinstance(length, type):
        return length
    if isinstance(length, int) and not isinstance(length, bool):
        if length < 1:
            raise ValueError(f"{name} must be >= 1 token, got {length!r}")
        return Fixed(length)
    if isinstance(length, tuple) and len(length) == 2:
        try:
            return Uniform(*length)
        except ValueError as e:
            raise ValueError(f"{name} range {length!r}: {e}") from None
    raise ValueError(f"{name} must be an int, a (lo, hi) tuple or a distribution with "
                     f".sample(rng), got {length!r}")
