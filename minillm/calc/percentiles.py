"""Percentiles of a sample, and how many samples a percentile needs.

percentile() interpolates linearly between the sorted samples, as numpy's default does. A p99
read off 40 requests is no p99: percentile_interval() says which sorted samples bracket the true
percentile at a given confidence (from the binomial count of samples below it, whatever the
distribution), and samples_for_percentile() the fewest samples for which both sides exist.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation, as numpy's default does."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _binomial_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) <= k), summed in log space (0.99**4000 underflows a float)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if p <= 0.0 or p >= 1.0:
        return 1.0 if p <= 0.0 else 0.0
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
            + i * math.log(p) + (n - i) * math.log1p(-p) for i in range(k + 1)]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(x - top) for x in logs))


def _check_percentile_args(q: float, confidence: float) -> None:
    if not 0 < q < 100 or not 0 < confidence < 1:
        raise ValueError(f"need 0 < q < 100 and 0 < confidence < 1, got q={q!r}, "
                         f"confidence={confidence!r}")


def percentile_interval(n: int, q: float, confidence: float = 0.95
                        ) -> tuple[int | None, int | None]:
    """Which of n samples bracket the true q-th percentile: the 1-based ranks (lo, hi) of the
    sorted samples such that x[lo] <= true percentile <= x[hi] with probability >= confidence,
    for independent samples of any continuous distribution (the count of samples below the
    true percentile is Binomial(n, q/100), so no assumption about the shape is needed).

    A side is None when n samples cannot bound it: for q=99 and n=40 even the largest sample
    lies below the true p99 with probability 0.99**40 = 67%, so there is no upper bound at all
    (samples_for_percentile gives the n where both sides exist).
    """
    _check_percentile_args(q, confidence)
    if n < 1:
        raise ValueError(f"need at least one sample, got n={n!r}")
    p, tail = q / 100.0, (1.0 - confidence) / 2.0
    lo = hi = None
    for rank in range(n, 0, -1):  # the largest rank with P(x[rank] > percentile) <= tail
        if _binomial_cdf(rank - 1, n, p) <= tail:
            lo = rank
            break
    for rank in range(1, n + 1):  # the smallest rank with P(x[rank] < percentile) <= tail
        if _binomial_cdf(rank - 1, n, p) >= 1.0 - tail:
            hi = rank
            break
    return lo, hi


def samples_for_percentile(q: float, confidence: float = 0.95) -> int:
    """The fewest samples whose percentile_interval has both sides: n with
    (q/100)**n <= (1 - confidence) / 2 and (1 - q/100)**n <= (1 - confidence) / 2.
    For a p99 at 95% confidence: 368 (a p50: 6)."""
    _check_percentile_args(q, confidence)
    p, tail = q / 100.0, (1.0 - confidence) / 2.0
    return math.ceil(max(math.log(tail) / math.log(p), math.log(tail) / math.log1p(-p)) - 1e-9)
