"""Latency metrics of a request (TTFT, TPOT, ITL, E2E) and their summary over many requests."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

# Percentiles and how many samples one needs are statistics, not serving: they live in
# minillm.calc.percentiles and are importable from here too.
from minillm.calc.percentiles import percentile as percentile
from minillm.calc.percentiles import percentile_interval as percentile_interval
from minillm.calc.percentiles import samples_for_percentile as samples_for_percentile


@dataclass
class RequestMetrics:
    """Timestamps of one request, in seconds on one clock (time.perf_counter or a virtual one).

    token_times[i] is when output token i was produced, so token_times[0] is the first token.
    A benchmark client over HTTP sees chunks, not tokens (a chunk may carry several tokens):
    there token_times are the arrivals of the chunks with text, and num_output_tokens is the
    server's count (its `usage`), which TPOT divides by.
    """

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_output_tokens: int | None = None  # None: one token per entry of token_times

    @property
    def output_tokens(self) -> int:
        """Tokens generated: num_output_tokens when known, else len(token_times)."""
        return len(self.token_times) if self.num_output_tokens is None else self.num_output_tokens

    @property
    def ttft(self) -> float | None:
        """Time to first token: queueing plus the whole prefill."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float | None:
        """End-to-end latency: arrival to the last token."""
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    @property
    def queue_time(self) -> float | None:
        """Time spent waiting before the scheduler first gave the request a step."""
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies: the gaps between consecutive output tokens (or chunks)."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (E2E - TTFT) / (n - 1) with n output tokens,
        from the first token's time to the last's; None when n < 2."""
        n = self.output_tokens
        if n < 2 or not self.token_times:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (n - 1)


@dataclass(frozen=True)
class Distribution:
    """Mean and the percentiles serving benchmarks report, in seconds."""

    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    count: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        mean = sum(values) / len(values) if values else math.nan
        return cls(mean, *(percentile(values, q) for q in (50, 90, 95, 99)), len(values))


@dataclass(frozen=True)
class Summary:
    """Latency distributions and throughput over a set of finished requests."""

    num_requests: int
    duration: float
    output_tokens: int
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2e: Distribution
    goodput: float | None  # requests per second that met the SLO

    @property
    def request_throughput(self) -> float:
        return self.num_requests / self.duration if self.duration > 0 else math.nan

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration if self.duration > 0 else math.nan


def meets_slo(m: RequestMetrics, slo: dict[str, float]) -> bool:
    """slo maps "ttft", "tpot", "itl" or "e2e" to a bound in seconds; itl bounds the worst gap.

    "e2el" (vLLM's name for E2E) is accepted too.
    """
    for name, bound in slo.items():
        if name not in ("ttft", "tpot", "itl", "e2e", "e2el"):
            raise ValueError(f"unknown SLO metric {name!r}; use ttft, tpot, itl or e2e")
        value = (max(m.itl, default=0.0) if name == "itl"
                 else m.e2e if name == "e2el" else getattr(m, name))
        if value is not None and value > bound:
            return False
    return True


def summarize(metrics: Iterable[RequestMetrics], slo: dict[str, float] | None = None,
              duration: float | None = None) -> Summary:
    """Summarize finished requests; the duration (s) runs from the first arrival to the last
    finish unless given (a benchmark client passes the wall time of its whole run, as vLLM's
    does)."""
    done = [m for m in metrics if m.finished_time is not None]
    if not done:
        raise ValueError("summarize needs at least one finished request")
    if duration is None:
        duration = max(m.finished_time for m in done) - min(m.arrival_time for m in done)
    good = sum(meets_slo(m, slo) for m in done) if slo else None
    return Summary(
        num_requests=len(done),
        duration=duration,
        output_tokens=sum(m.output_tokens for m in done),
        ttft=Distribution.of([m.ttft for m in done if m.ttft is not None]),
        tpot=Distribution.of([m.tpot for m in done if m.tpot is not None]),
        itl=Distribution.of([x for m in done for x in m.itl]),
        e2e=Distribution.of([m.e2e for m in done if m.e2e is not None]),
        goodput=None if good is None else (good / duration if duration > 0 else math.nan),
    )


# ---- steady state: a finite run's rates without its warm-up and its drain ---------------------

STEADY_STATE_TRIM = 0.2  # the share of the arrival span dropped at each end
FALLING_BEHIND = 0.1  # queue growth over the window, as a share of it, that means "falls behind"


@dataclass(frozen=True)
class SteadyState:
    """A run's steady state: the requests that arrived inside [start, end] (s), how many of
    them met the SLO, the run's arrival rate (requests/s, over its whole arrival span) and mean
    output tokens per request, which the offered load fixes; queue_growth: how much longer (s)
    the window's last arrivals waited to be scheduled than its first (median of each quarter);
    served_rate: requests/s from first arrival to last finish, what a run that falls behind
    actually served."""

    start: float
    end: float
    requests: int
    good: int
    arrival_rate: float
    mean_output_tokens: float
    queue_growth: float = 0.0
    served_rate: float = math.inf

    @property
    def attainment(self) -> float:
        """The share of the window's requests that met the SLO."""
        return self.good / self.requests

    @property
    def keeps_up(self) -> bool:
        """Whether the server kept up with the arrivals: its queue did not grow across the
        window by more than FALLING_BEHIND of the window's length. (A server short of the
        arrival rate by a share d sees its wait grow by about d times the time elapsed.)"""
        return self.queue_growth <= FALLING_BEHIND * (self.end - self.start)

    @property
    def rate(self) -> float:
        """Requests/s the server sustains: the arrival rate if it keeps up, else what it served."""
        return self.arrival_rate if self.keeps_up else min(self.arrival_rate, self.served_rate)

    @property
    def goodput(self) -> float:
        """Requests/s that meet the SLO in steady state: the sustained rate times the window's
        attainment."""
        return self.rate * self.attainment

    @property
    def output_throughput(self) -> float:
        """Output tokens/s the server sustains in steady state: the sustained rate times the
        mean output tokens of a request."""
        return self.rate * self.mean_output_tokens


def steady_state(metrics: Iterable[RequestMetrics], slo: dict[str, float],
                 trim: float = STEADY_STATE_TRIM) -> SteadyState:
    """The steady state of a finished open-loop run: the SLO judged on the requests arriving in
    the middle of its arrival span (trim of the span dropped at each end), rates from the whole
    arrival span.

    Why. summarize() divides by first arrival to last finish, so a run of a few hundred
    requests counts its drain: after the last arrival the batch empties while the longest
    answers finish, and that tail can be as long as the arrivals themselves (a 1,000-token
    answer at 20 ms a token is 20 s), which halves the rate. A server that keeps up serves
    requests as fast as they arrive, so its steady-state rate is the arrival rate, measured over
    the arrivals' span ((n - 1) / span), which no drain dilutes; and the tokens it sustains are
    that rate times a request's mean output. What steady state changes is who is on time: the
    first arrivals find an empty batch and no queue, the last ones a batch that no later
    request competes with, and both are served faster than in steady state, so only the
    window's requests judge the SLO. The window is not used for the rate itself: its own count
    of a Poisson stream (the middle 60% of 300 requests) is off by about 7% (one sigma,
    1 / sqrt(180)), which is noise, not information. A server that falls behind does not serve
    the arrival rate: its queue grows through the window (SteadyState.keeps_up), and then the
    rate is what it served, first arrival to last finish, drain included, so an SLO without a
    TTFT bound cannot flatter an overloaded server. Capacity itself is a rate sweep's knee
    (chapter 07). ValueError for a trim outside [0, 0.5) or an empty window."""
    if not 0 <= trim < 0.5:
        raise ValueError(f"trim must be in [0, 0.5) (the share dropped at each end), "
                         f"got {trim!r}")
    done = [m for m in metrics if m.finished_time is not None]
    if len(done) < 2:
        raise ValueError("steady_state needs at least two finished requests")
    first = min(m.arrival_time for m in done)
    span = max(m.arrival_time for m in done) - first
    if not span > 0:
        raise ValueError("every request arrived at once (a closed loop or a burst): there is "
                         "no arrival span to take a window of; use an open-loop workload")
    start, end = first + trim * span, first + (1 - trim) * span
    window = sorted((m for m in done if start <= m.arrival_time <= end),
                    key=lambda m: m.arrival_time)
    if not window:
        raise ValueError(f"no request arrived in [{start:g}, {end:g}] s; lower trim")
    return SteadyState(start, end, len(window), sum(meets_slo(m, slo) for m in window),
                       (len(done) - 1) / span,
                       sum(m.output_tokens for m in done) / len(done),
                       _queue_growth(window),
                       len(done) / (max(m.finished_time for m in done) - first))


def _queue_growth(window: list[RequestMetrics]) -> float:
    """Median wait for a first step of the window's last quarter of arrivals minus its first
    quarter's (0 with fewer than 4 requests, or without scheduling times)."""
    waits = [m.first_scheduled_time - m.arrival_time for m in window
             if m.first_scheduled_time is not None]
    quarter = len(waits) // 4
    if quarter == 0:
        return 0.0
    return statistics.median(waits[-quarter:]) - statistics.median(waits[:quarter])
