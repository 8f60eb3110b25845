"""What an operator reads of one run: its Dashboard, and the counts behind it.

A Dashboard is a run as a benchmark client, vLLM's /metrics and nvidia-smi / DCGM would show it:
p99 TTFT, ITL and TPOT, each stream's worst stall, goodput under an SLO, tokens/s, preemptions
per minute, KV-cache usage, requests running and waiting, and the GPU's busy, DRAM-active and
tensor-active shares (from the roofline: the simulator has no counters of its own, so those are
modelled). Everything here reads only what an operator has: request metrics, the step trace and
stats(). minillm.failure_modes proves its table's rows with it; minillm.diagnosis shows the
reader the same.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from minillm.calc import roofline
from minillm.metrics import RequestMetrics, meets_slo, percentile, summarize
from minillm.model_config import ModelConfig
from minillm.sim.simulator import SimulationResult
from minillm.trace import StepRecord


class Traced(Protocol):
    """A run's step trace with the model and GPU it ran on: a SimulationResult, or a
    minillm.diagnosis.Deployment."""

    trace: list[StepRecord]
    model: ModelConfig
    hardware: roofline.Hardware


@dataclass(frozen=True)
class Dashboard:
    """One run as an operator's dashboards show it (modelled). Seconds, tokens and requests.

    Request side (a benchmark client, or vLLM's histograms): ttft_p99, itl_p50 (the typical gap
    between two tokens: one decode step), itl_p99 (over every gap of every request), tpot_p99,
    stall_p99 (over requests, of each one's longest gap: how long the worst-hit streams froze),
    output_throughput (tokens/s of the replica), goodput (requests/s within the SLO) and
    slo_miss (the share of requests outside it).
    Engine side (vLLM's /metrics): preemptions_per_min (the rate of
    vllm:num_preemptions_total), kv_usage_mean and kv_usage_peak (vllm:kv_cache_usage_perc: the
    share of the pool's blocks held, time-weighted over the steps, and its highest),
    running_mean and waiting_mean (vllm:num_requests_running / _waiting, time-weighted),
    prefix_hit_rate (prefix-cache hits over queries, nan where the counters are not shown).
    GPU side, from the roofline (the simulator has no counters of its own): gpu_util
    (nvidia-smi's GPU-Util: the share of time some kernel runs), dram_active (DCGM's
    DRAM-active: bytes moved over what HBM moves in the run's time) and tensor_active (DCGM's
    tensor-pipe active: FLOPs over what the tensor cores do in that time).
    """

    num_requests: int
    duration: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    tpot_p99: float
    stall_p99: float
    output_throughput: float
    goodput: float
    slo_miss: float
    preemptions_per_min: float
    kv_usage_mean: float
    kv_usage_peak: float
    running_mean: float
    waiting_mean: float
    prefix_hit_rate: float
    gpu_util: float
    dram_active: float
    tensor_active: float


# How each Dashboard figure reads: its label and unit ("s", "tokens/s", "req/s", "/min",
# "share" or "requests").
LABELS: dict[str, tuple[str, str]] = {
    "num_requests": ("requests", "requests"), "duration": ("duration", "s"),
    "ttft_p99": ("TTFT p99", "s"), "itl_p50": ("ITL p50", "s"), "itl_p99": ("ITL p99", "s"),
    "tpot_p99": ("TPOT p99", "s"), "stall_p99": ("worst stall p99", "s"),
    "output_throughput": ("output tokens/s", "tokens/s"), "goodput": ("goodput", "req/s"),
    "slo_miss": ("SLO misses", "share"), "preemptions_per_min": ("preemptions", "/min"),
    "kv_usage_mean": ("KV usage mean", "share"), "kv_usage_peak": ("KV usage peak", "share"),
    "running_mean": ("requests running", "requests"),
    "waiting_mean": ("requests waiting", "requests"),
    "prefix_hit_rate": ("prefix-cache hit rate", "share"), "gpu_util": ("GPU-Util", "share"),
    "dram_active": ("DRAM-active", "share"), "tensor_active": ("tensor-active", "share")}


def fmt(metric: str, value: float) -> str:
    """A Dashboard figure with its unit: ms below a second, shares in percent."""
    unit = LABELS[metric][1]
    if math.isnan(value):
        return "n/a"
    if unit == "s":
        return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"
    if unit == "share":
        return f"{value:.1%}" if value < 0.1 else f"{value:.0%}"
    if unit == "/min":
        return f"{value:,.0f}/min"
    return f"{value:,.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}"


def _time_mean(trace: Sequence[StepRecord], value: Callable[[StepRecord], float]) -> float:
    busy = sum(step.duration for step in trace)
    return sum(value(step) * step.duration for step in trace) / busy if busy else math.nan


def trace_flops_bytes(trace: Sequence[StepRecord], model: ModelConfig) -> tuple[float, float]:
    """(FLOPs, HBM bytes) of every step of a trace, priced by roofline.step_flops_bytes."""
    flops = moved = 0.0
    for step in trace:
        f, b = roofline.step_flops_bytes(model, [(e.num_tokens, e.num_computed_tokens
                                                  + e.num_tokens) for e in step.scheduled])
        flops, moved = flops + f, moved + b
    return flops, moved


def dashboard_of(metrics: Sequence[RequestMetrics], trace: Sequence[StepRecord],
                 stats: dict[str, int], model: ModelConfig, hardware: roofline.Hardware,
                 slo: dict[str, float]) -> Dashboard:
    """The Dashboard of a run from what an operator has: the requests' metrics, the step trace,
    the engine's counters (stats(): num_blocks and num_preemptions at least) and the GPU."""
    s = summarize(metrics, slo)
    done = [m for m in metrics if m.finished_time is not None]
    pool = stats["num_blocks"]
    queries = stats.get("prefix_cache_queries", 0)
    flops, moved = trace_flops_bytes(trace, model)
    return Dashboard(
        num_requests=s.num_requests, duration=s.duration, ttft_p99=s.ttft.p99,
        itl_p50=s.itl.p50, itl_p99=s.itl.p99, tpot_p99=s.tpot.p99,
        stall_p99=percentile([max(m.itl, default=0.0) for m in done], 99),
        output_throughput=s.output_throughput, goodput=s.goodput or 0.0,
        slo_miss=1 - sum(meets_slo(m, slo) for m in done) / len(done),
        preemptions_per_min=stats["num_preemptions"] / s.duration * 60,
        kv_usage_mean=_time_mean(trace, lambda st: 1 - st.num_free_blocks / pool),
        kv_usage_peak=max(1 - st.num_free_blocks / pool for st in trace),
        running_mean=_time_mean(trace, lambda st: len(st.scheduled)),
        waiting_mean=_time_mean(trace, lambda st: st.num_waiting),
        prefix_hit_rate=stats.get("prefix_cache_hits", 0) / queries if queries else math.nan,
        gpu_util=sum(step.duration for step in trace) / s.duration,
        dram_active=moved / (s.duration * hardware.bandwidth),
        tensor_active=flops / (s.duration * hardware.flops))


def dashboard(run: SimulationResult, slo: dict[str, float]) -> Dashboard:
    """The Dashboard of a simulated run under slo (seconds, as minillm.metrics.meets_slo)."""
    return dashboard_of([o.metrics for o in run.outputs], run.trace, run.stats, run.model,
                        run.hardware, slo)


def kv_usage_series(trace: Sequence[StepRecord], num_blocks: int) -> list[tuple[float, float]]:
    """(step end in seconds, share of the pool's blocks held after it): the KV-usage gauge."""
    return [(step.end, 1 - step.num_free_blocks / num_blocks) for step in trace]


def preemption_rate_series(trace: Sequence[StepRecord], window: float = 5.0
                           ) -> list[tuple[float, float]]:
    """(step end, preemptions per minute over the window seconds before it): the rate a
    Prometheus rate() over vllm:num_preemptions_total draws."""
    times = [step.end for step in trace for _ in step.preempted]  # in step order: sorted
    return [(step.end, (bisect.bisect_right(times, step.end)
                        - bisect.bisect_right(times, step.end - window)) * 60 / window)
            for step in trace]


def batch_sizes(run: Traced) -> list[int]:
    """Requests in each step's batch, in step order."""
    return [len(step.scheduled) for step in run.trace]


def computed_tokens(run: Traced) -> int:
    """Tokens the engine pushed through the model over the run (prefill chunks plus decodes)."""
    return sum(step.num_tokens for step in run.trace)


def prefill_tokens(run: Traced) -> int:
    """Prompt tokens computed (prefill-phase tokens, recomputation after preemption included)."""
    return sum(e.num_tokens for step in run.trace for e in step.scheduled if e.phase == "prefill")


def wasted_tokens(run: SimulationResult) -> int:
    """Tokens computed more than once: every token a request needed is its prompt plus all its
    output but the last (never fed back); what a preempted request recomputes comes on top."""
    needed = sum(len(o.prompt_token_ids) + len(o.token_ids) - 1 for o in run.outputs)
    return computed_tokens(run) - needed


def utilisation(run: Traced) -> tuple[float, float]:
    """(FLOP utilisation, bandwidth utilisation) over the run's busy time, modelled: the FLOPs
    and bytes of every step (roofline.step_flops_bytes) over what the GPU's peaks allow while
    a step runs, what DCGM's tensor-active and DRAM-active read while the GPU is busy. Decode
    at a small batch B shows about B / ridge and ~1.0: memory-bound."""
    flops, moved = trace_flops_bytes(run.trace, run.model)
    busy = sum(step.duration for step in run.trace)
    return flops / (busy * run.hardware.flops), moved / (busy * run.hardware.bandwidth)
