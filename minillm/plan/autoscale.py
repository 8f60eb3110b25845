"""Autoscaling a serving fleet: the signals a rule reads and the replica count it settles on.

Kubernetes' HorizontalPodAutoscaler (which KEDA drives) picks a replica count from one number
per replica and a target: desired = ceil(current * value / target), left alone while value /
target is within a tolerance of 1 (10% by default). What an LLM fleet can feed it:

- busy: the share of time the engine runs a step. This is what nvidia-smi's GPU-Util reports
  (the share of time any kernel runs), not how much of the GPU each step uses: a decode step at
  batch 4 and one at batch 256 are both 100% "busy".
- waiting: vllm:num_requests_waiting, the requests not yet admitted (vLLM production-stack's
  KEDA example scales on it with a threshold of 5 per replica).
- attainment: the share of requests that meet the SLO (minillm.metrics.meets_slo); the goodput
  rule keeps it at or above a target, e.g. 90%.

A Rule accepts or refuses one replica's Signals. Behind an even router every one of N replicas
sees demand / N, so the count a rule settles on, the fixed point its HPA loop converges to, is
ceil(demand / r*) with r* the highest per-replica rate it accepts on a sweep of one replica
(replicas_for). slo_replicas is the last step of the chapter 11 recipe: that count for a
recommended engine, from a sweep of its simulated runs. The Prometheus helpers read the same
signals from a live server's /metrics.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from minillm.metrics import meets_slo
from minillm.trace import StepRecord
from minillm.workloads.streams import RequestSpec, Workload

HPA_TOLERANCE = 0.1  # Kubernetes' default: no change while value / target is within 1 +- 0.1
SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+"
                    r"(?P<value>\S+)(?:\s+\d+)?$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


# ---- the signals ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Signals:
    """What one replica showed at one offered rate (requests/s): busy (0..1, the GPU-Util
    reading), waiting (requests, time-averaged vllm:num_requests_waiting), attainment (0..1)."""

    rate: float
    busy: float
    waiting: float
    attainment: float


def busy_fraction(intervals: Iterable[tuple[float, float]], start: float | None = None,
                  end: float | None = None) -> float:
    """The share of [start, end] covered by at least one of the (begin, end) intervals (s): for
    engine steps, GPU-Util; for requests in flight, the share of time the engine had work."""
    spans = sorted((a, b) for a, b in intervals if b > a)
    if not spans:
        return 0.0
    lo = spans[0][0] if start is None else start
    hi = max(b for _, b in spans) if end is None else end
    if not hi > lo:
        raise ValueError(f"the window [{lo}, {hi}] is empty; give end > start")
    covered, reach = 0.0, lo
    for a, b in spans:
        a, b = max(a, reach), min(b, hi)
        if b > a:
            covered += b - a
            reach = b
    return covered / (hi - lo)


def mean_waiting(trace: Sequence[StepRecord]) -> float:
    """vllm:num_requests_waiting averaged over the run's time (each step's count held until the
    next step starts, as a gauge scraped at random instants would read it)."""
    if not trace:
        raise ValueError("mean_waiting needs a trace with at least one step")
    span = trace[-1].end - trace[0].start
    if span <= 0:
        return float(trace[-1].num_waiting)
    held = [(nxt.start - rec.start) for rec, nxt in zip(trace, trace[1:])]
    held.append(trace[-1].end - trace[-1].start)
    return sum(rec.num_waiting * dt for rec, dt in zip(trace, held)) / span


def simulated_signals(rate: float, trace: Sequence[StepRecord], metrics: Iterable,
                      slo: dict[str, float]) -> Signals:
    """One replica's Signals from a simulated (or engine) run: its trace and its requests'
    RequestMetrics, at the offered rate (requests/s) it was sent."""
    done = [m for m in metrics if m.finished_time is not None]
    if not done:
        raise ValueError("no request finished: nothing to judge the SLO on")
    busy = busy_fraction((r.start, r.end) for r in trace)
    return Signals(rate, busy, mean_waiting(trace),
                   sum(meets_slo(m, slo) for m in done) / len(done))


# ---- the rules --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    """A replica is healthy when its signal is on the right side of target."""

    name: str
    signal: str  # "busy", "waiting" or "attainment"
    target: float

    def __post_init__(self) -> None:
        if self.signal not in ("busy", "waiting", "attainment"):
            raise ValueError(f"unknown signal {self.signal!r}; use busy, waiting or attainment")
        if not self.target > 0:
            raise ValueError(f"a rule's target must be positive, got {self.target!r}")

    def accepts(self, s: Signals) -> bool:
        """Whether one replica showing s needs no more replicas beside it."""
        value = getattr(s, self.signal)
        return value >= self.target if self.signal == "attainment" else value <= self.target


def gpu_util_rule(target: float = 0.7) -> Rule:
    """Scale on GPU-Util: at most target (0..1) of the time busy."""
    return Rule(f"GPU-Util <= {target:.0%}", "busy", target)


def queue_depth_rule(target: float = 5) -> Rule:
    """Scale on vllm:num_requests_waiting: at most target waiting per replica (KEDA's
    AverageValue, as production-stack's example with threshold 5)."""
    return Rule(f"waiting <= {target:g}", "waiting", target)


def goodput_rule(target: float = 0.9) -> Rule:
    """Scale on goodput: at least target (0..1) of the requests meet the SLO."""
    return Rule(f"SLO attainment >= {target:.0%}", "attainment", target)


def max_accepted_rate(rule: Rule, sweep: Sequence[Signals]) -> float | None:
    """The highest per-replica rate of sweep up to which rule accepts every point (None: it
    refuses the lowest)."""
    best = None
    for s in sorted(sweep, key=lambda s: s.rate):
        if not rule.accepts(s):
            break
        best = s.rate
    return best


def replicas_for(rule: Rule, sweep: Sequence[Signals], demand: float) -> int:
    """Replicas rule settles on for demand requests/s: ceil(demand / max_accepted_rate)."""
    if not demand > 0:
        raise ValueError(f"demand must be positive requests/s, got {demand!r}")
    rate = max_accepted_rate(rule, sweep)
    if rate is None:
        lowest = min(s.rate for s in sweep)
        raise ValueError(f"{rule.name} refuses even the sweep's lowest rate ({lowest:g}/s): "
                         "extend the sweep to lower rates")
    return max(math.ceil(demand / rate - 1e-9), 1)


def at_rate(workload: Sequence[RequestSpec], rate: float) -> Workload:
    """workload's requests with their arrival times stretched so they arrive at rate
    requests/s on average: the same lengths and the same pattern, faster or slower."""
    if not rate > 0:
        raise ValueError(f"rate must be positive requests/s, got {rate!r}")
    span = max(s.arrival_time for s in workload) - min(s.arrival_time for s in workload)
    if not span > 0:
        raise ValueError("the workload's requests all arrive at once: give an open-loop one "
                         "(minillm.workload.poisson)")
    scale = (len(workload) - 1) / span / rate
    return Workload([dataclasses.replace(s, arrival_time=s.arrival_time * scale)
                     for s in workload], rate=rate)


def slo_replicas(model: Any, hw: Any, workload: Sequence[RequestSpec], slo: dict[str, float],
                 deployment: Any, demand: float, *, target: float = 0.9,
                 rates: Sequence[float] | None = None, sim_requests: int = 300
                 ) -> tuple[int, list[Signals]]:
    """The replicas goodput_rule(target) settles on for demand requests/s, for the engine of
    deployment (minillm.deployment.Deployment; its replicas is ignored): one engine is
    simulated on sim_requests of workload's requests at each of rates (requests/s per
    engine; default 0.5x to 1.5x of demand / deployment.replicas, in quarter steps), and
    replicas_for reads the sweep. Returns the count and the sweep's Signals."""
    from minillm.plan.deployment import run_deployment  # it builds on the simulator, this does not

    one = dataclasses.replace(deployment, replicas=1)
    base = demand / deployment.replicas
    rates = [base * f for f in (0.5, 0.75, 1.0, 1.25, 1.5)] if rates is None else list(rates)
    specs = list(workload)[:sim_requests]
    sweep = []
    for rate in rates:
        run = run_deployment(model, hw, at_rate(specs, rate), slo, one,
                             sim_requests=sim_requests)
        sweep.append(simulated_signals(rate, run.result.trace,
                                       [o.metrics for o in run.result.outputs], slo))
    return replicas_for(goodput_rule(target), sweep, demand), sweep


def hpa_replicas(current: int, value: float, target: float,
                 tolerance: float = HPA_TOLERANCE) -> int:
    """One step of Kubernetes' HPA: ceil(current * value / target), unchanged within tolerance,
    and never under 1 (value: the per-replica average of the metric)."""
    if current < 1 or not target > 0:
        raise ValueError(f"need current >= 1 and target > 0, got {current!r}, {target!r}")
    ratio = value / target
    if abs(ratio - 1) <= tolerance:
        return current
    return max(math.ceil(current * ratio - 1e-9), 1)


# ---- the same signals from a live server's /metrics ---------------------------------------------

@dataclass(frozen=True)
class Sample:
    """One line of Prometheus text: a name, its labels and a value."""

    name: str
    labels: dict[str, str]
    value: float


def parse_metrics(text: str) -> list[Sample]:
    """The samples of a Prometheus text exposition (comments and blank lines skipped)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if m is None:
            raise ValueError(f"not a Prometheus sample line: {line!r}")
        labels = dict(LABEL.findall(m.group("labels") or ""))
        out.append(Sample(m.group("name"), labels, float(m.group("value"))))
    return out


def metric_value(text: str, name: str) -> float:
    """The sum of name over every label set (a fleet's total of a gauge or counter)."""
    found = [s.value for s in parse_metrics(text) if s.name == name]
    if not found:
        raise KeyError(f"{name} is not in this /metrics text")
    return sum(found)


def histogram_buckets(text: str, name: str) -> dict[float, float]:
    """A histogram's cumulative counts by upper bound (le, in its unit; +Inf is math.inf)."""
    buckets: dict[float, float] = {}
    for s in parse_metrics(text):
        if s.name == name + "_bucket":
            le = float(s.labels["le"])
            buckets[le] = buckets.get(le, 0.0) + s.value
    if not buckets:
        raise KeyError(f"{name} is not a histogram in this /metrics text")
    return buckets


def histogram_share(before: str, after: str, name: str, bound: float) -> float:
    """The share of the observations between two scrapes at or under bound, read from the
    histogram's buckets as a PromQL ratio of increase()s does; bound must be a bucket edge."""
    b0, b1 = histogram_buckets(before, name), histogram_buckets(after, name)
    if bound not in b1:
        edges = ", ".join(f"{le:g}" for le in sorted(b1) if le != math.inf)
        raise ValueError(f"{bound:g} is not a bucket edge of {name}; use one of {edges}")
    count = b1[math.inf] - b0.get(math.inf, 0.0)
    if count <= 0:
        raise ValueError(f"no {name} observation between the two scrapes")
    return (b1[bound] - b0.get(bound, 0.0)) / count
