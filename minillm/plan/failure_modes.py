"""The guide's failure-modes table, reproduced: each symptom and its fix, judged by what an
operator measures.

Every row serves one workload twice in the simulator (minillm.simulator.simulate: the engine's
own scheduler on a virtual clock priced by the roofline, so every figure is modelled, Llama-3-8B
in BF16 on an H100-SXM): once with the knob that causes the symptom, once with the fix. Each run
is read as an operator reads a server, into a Dashboard: p99 TTFT, ITL and TPOT, each stream's
worst stall, goodput under the row's SLO, tokens/s, preemptions per minute, KV-cache usage,
requests running and waiting, and what nvidia-smi and DCGM would show. A row states its proof
as Claims (the fix moves a dashboard figure by at least a stated factor, or keeps one within
a stated factor) and Levels (a figure on one run past a bound: the symptom's own sign);
Reproduction.holds tests them all. Every p99 rests on at least 200 requests.

| row | symptom | fix |
|---|---|---|
| static_batching | low throughput, the batch fills and drains | continuous batching |
| long_prefill_blocking | streams freeze behind a long prompt's prefill | chunked prefill |
| kv_pressure | "OOM" at high concurrency: a paged engine preempts | cap max_num_seqs |
| memory_bound_small_batch | decode "slow", GPU "100% busy" | a bigger batch |
| batch_too_large | great throughput, TPOT over the SLO | a lower max batch |
| no_prefix_caching | shared system prompts prefilled again and again | prefix caching |

The guide's other row, tensor parallelism that stops scaling past 8 GPUs, is chapter 11's
(section 1: the all-reduces of a step on NVLink against InfiniBand). The Dashboard and the
counts behind it live in minillm.dashboard (re-exported here): they read only what an operator
has, request metrics, the step trace and stats(); minillm.diagnosis hands the same to the
reader.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from minillm.plan.dashboard import (  # noqa: F401  (batch_sizes, utilisation, ...: chapter 09's)
    LABELS,
    Dashboard,
    Traced,
    batch_sizes,
    computed_tokens,
    dashboard,
    dashboard_of,
    fmt,
    kv_usage_series,
    preemption_rate_series,
    prefill_tokens,
    utilisation,
    wasted_tokens,
)
from minillm.sim.simulator import SimulationResult, simulate
from minillm.workloads.prefixes import shared_prefix
from minillm.workloads.streams import Mixture, RequestSpec, Workload, closed_loop, poisson

MODEL, HARDWARE = "llama-3-8b", "H100-SXM"
VOCAB = 128256  # Llama-3's vocabulary: shared-prefix prompts' ids must fit it
MIN_REQUESTS = 200  # below this a p99 is one of the last two samples, not a tail estimate


# ---- what a row claims ----------------------------------------------------------------------

@dataclass(frozen=True)
class Claim:
    """The fix moves a Dashboard figure: "falls" (sick >= factor x fixed, and sick > 0),
    "rises" (fixed >= factor x sick, and fixed > 0) or "stays" (both positive, within factor
    of each other either way). A figure that is 0 on both runs bears out no claim."""

    metric: str
    change: Literal["falls", "rises", "stays"]
    factor: float

    def __post_init__(self) -> None:
        if self.metric not in LABELS:
            raise ValueError(f"unknown Dashboard figure {self.metric!r}; use one of {list(LABELS)}")
        if not self.factor >= 1:
            raise ValueError(f"a Claim's factor must be >= 1, got {self.factor!r}")

    def test(self, sick: Dashboard, fixed: Dashboard) -> bool:
        a, b = getattr(sick, self.metric), getattr(fixed, self.metric)
        if self.change == "falls":
            return a > 0 and a >= self.factor * b
        if self.change == "rises":
            return b > 0 and b >= self.factor * a
        return a > 0 and b > 0 and max(a, b) <= self.factor * min(a, b)

    def text(self) -> str:
        how = "within" if self.change == "stays" else "by at least"
        return f"{LABELS[self.metric][0]} {self.change} {how} {self.factor:g}x"


@dataclass(frozen=True)
class Level:
    """A Dashboard figure on one run ("sick", "fixed" or "both") at least, or at most, bound."""

    metric: str
    run: Literal["sick", "fixed", "both"]
    bound: float
    at_most: bool = False

    def __post_init__(self) -> None:
        if self.metric not in LABELS:
            raise ValueError(f"unknown Dashboard figure {self.metric!r}; use one of {list(LABELS)}")

    def test(self, sick: Dashboard, fixed: Dashboard) -> bool:
        runs = {"sick": [sick], "fixed": [fixed], "both": [sick, fixed]}[self.run]
        return all((getattr(d, self.metric) <= self.bound) if self.at_most
                   else (getattr(d, self.metric) >= self.bound) for d in runs)

    def text(self) -> str:
        side = "<=" if self.at_most else ">="
        return f"{LABELS[self.metric][0]} {side} {fmt(self.metric, self.bound)} ({self.run})"


@dataclass(frozen=True)
class FailureMode:
    """One row of the table: the workload, the knobs that cause the symptom and the fix's
    knobs (EngineConfig's), the SLO its goodput counts against, and the proof: claims (what the
    fix does to the dashboard) and levels (the symptom's sign)."""

    name: str
    symptom: str
    cause: str
    fix: str
    workload: Callable[[], Workload]
    sick_knobs: dict[str, Any]
    fix_knobs: dict[str, Any]
    slo: dict[str, float]
    claims: tuple[Claim, ...]
    levels: tuple[Level, ...] = ()


@dataclass(frozen=True)
class Reproduction:
    """A FailureMode run: both dashboards, both runs (for plots), and the verdict."""

    mode: FailureMode
    sick: Dashboard
    fixed: Dashboard
    sick_run: SimulationResult = field(repr=False)
    fixed_run: SimulationResult = field(repr=False)

    @property
    def name(self) -> str:
        return self.mode.name

    def checks(self) -> list[tuple[str, bool]]:
        """(what is claimed, whether these runs bear it out), claims first, then levels."""
        return [(c.text(), c.test(self.sick, self.fixed))
                for c in (*self.mode.claims, *self.mode.levels)]

    @property
    def holds(self) -> bool:
        """Enough requests for a p99, and every claim and level of the row borne out."""
        enough = min(self.sick.num_requests, self.fixed.num_requests) >= MIN_REQUESTS
        return enough and all(ok for _, ok in self.checks())


def reproduce(mode: FailureMode, fix_knobs: dict[str, Any] | None = None, *,
              sick_run: SimulationResult | None = None) -> Reproduction:
    """Serve mode's workload with its sick knobs and with fix_knobs (default: the row's fix),
    applied over the sick knobs, and read both dashboards under the row's SLO. Modelled.

    sick_run: the sick run of an earlier reproduction of mode, to reuse (the simulator is
    deterministic, so running it again would give the same run)."""
    wl = mode.workload()
    fix = mode.fix_knobs if fix_knobs is None else fix_knobs

    def serve(knobs: dict[str, Any]) -> SimulationResult:
        return simulate(MODEL, HARDWARE, wl, record_block_tables=False, **knobs)

    sick = sick_run if sick_run is not None else serve(mode.sick_knobs)
    fixed = serve(mode.sick_knobs | fix)
    return Reproduction(mode, dashboard(sick, mode.slo), dashboard(fixed, mode.slo), sick, fixed)


# ---- the six rows ---------------------------------------------------------------------------

def long_prefill_workload() -> Workload:
    """Chat traffic at 10/s (64-256-token prompts) with every 6th request an 8,000-token one."""
    specs = list(poisson(200, 10.0, (64, 256), (64, 128), seed=2))
    for i in range(0, len(specs), 6):
        specs[i] = RequestSpec(specs[i].arrival_time, 8000, 16, seed=i)
    return Workload(specs)


KV_POOL = 2048  # blocks of 16 tokens: 32,768 tokens, 4 GiB of K/V, small enough to fill
# What the pool holds of kv_pressure's requests at their mean final context (640 + 512 tokens).
KV_CAP = KV_POOL * 16 // (640 + 512)

SLO_TPOT = 0.015  # seconds: the interactive TPOT bound of batch_too_large

MODES: dict[str, FailureMode] = {m.name: m for m in (
    FailureMode(
        "static_batching", "low throughput, the batch fills then drains (sawtooth)",
        "static batching: seats idle while the batch's slowest request finishes",
        "continuous batching (scheduling='continuous')",
        lambda: poisson(200, 50.0, (128, 512), Mixture([(0.8, (16, 64)), (0.2, (256, 512))]),
                        seed=1),
        {"scheduling": "static", "max_num_seqs": 32}, {"scheduling": "continuous"},
        {"ttft": 1.0},
        (Claim("output_throughput", "rises", 2.0), Claim("ttft_p99", "falls", 10.0),
         Claim("running_mean", "rises", 2.0)),
        (Level("gpu_util", "both", 0.95),)),
    FailureMode(
        "long_prefill_blocking", "streams freeze under load (ITL spikes)",
        "a long prompt's whole prefill in one step blocks every decode (head-of-line)",
        "chunked prefill (enable_chunked_prefill=True, max_num_batched_tokens=512)",
        long_prefill_workload,
        {"enable_chunked_prefill": False, "max_num_batched_tokens": 8192},
        {"enable_chunked_prefill": True, "max_num_batched_tokens": 512},
        {"itl": 0.05},
        (Claim("itl_p99", "falls", 5.0), Claim("goodput", "rises", 2.0),
         Claim("ttft_p99", "stays", 1.25))),
    FailureMode(
        "kv_pressure", "'OOM' at high concurrency: preemptions climb, streams stall",
        "more running requests than the KV pool holds: a paged engine preempts, not crashes",
        f"cap max_num_seqs to what the pool holds ({KV_CAP}), or give the pool more memory",
        lambda: poisson(300, 10.0, (256, 1024), (256, 768), seed=3),
        {"num_kv_blocks": KV_POOL, "max_num_seqs": 256}, {"max_num_seqs": KV_CAP},
        {"itl": 0.1},
        (Claim("preemptions_per_min", "falls", 10.0), Claim("stall_p99", "falls", 5.0),
         Claim("slo_miss", "falls", 10.0), Claim("output_throughput", "stays", 1.15)),
        (Level("kv_usage_peak", "sick", 0.99), Level("kv_usage_peak", "fixed", 0.95, True))),
    FailureMode(
        "memory_bound_small_batch", "decode 'slow' while the GPU reads 100% busy",
        "a small batch: every step reads all the weights for a few tokens (bandwidth-bound)",
        "a bigger batch (max_num_seqs 4 -> 64)",
        lambda: closed_loop(256, 64, (256, 512), (128, 256), seed=4),
        {"max_num_seqs": 4}, {"max_num_seqs": 64},
        {"tpot": 0.05},
        (Claim("output_throughput", "rises", 5.0), Claim("itl_p50", "stays", 1.5),
         Claim("ttft_p99", "falls", 10.0)),
        (Level("gpu_util", "both", 0.95), Level("dram_active", "sick", 0.9),
         Level("tensor_active", "sick", 0.1, True))),
    FailureMode(
        "batch_too_large", "throughput great, TPOT p99 over the SLO",
        "the batch is too large for the latency SLO",
        "a lower max batch (max_num_seqs 256 -> 64): optimise goodput",
        lambda: closed_loop(400, 256, (1024, 1536), (256, 512), seed=5),
        {"max_num_seqs": 256}, {"max_num_seqs": 64},
        {"tpot": SLO_TPOT},
        (Claim("goodput", "rises", 2.0), Claim("tpot_p99", "falls", 1.5),
         Claim("output_throughput", "falls", 1.2))),
    FailureMode(
        "no_prefix_caching", "TTFT and ITL tails on a prefix-heavy workload",
        "no prefix reuse: every request prefills its shared system prompt again",
        "prefix caching (enable_prefix_caching=True)",
        lambda: shared_prefix(200, 4, 2048, (32, 128), (32, 128), 30.0, vocab_size=VOCAB,
                              seed=6),
        {"enable_prefix_caching": False}, {"enable_prefix_caching": True},
        {"ttft": 0.1},
        (Claim("ttft_p99", "falls", 5.0), Claim("goodput", "rises", 2.0),
         Claim("itl_p99", "falls", 2.0)),
        (Level("prefix_hit_rate", "fixed", 0.9),)),
)}

REPRODUCTIONS: dict[str, Callable[[], Reproduction]] = {
    name: (lambda mode=mode: reproduce(mode)) for name, mode in MODES.items()}


def reproduce_all() -> list[Reproduction]:
    """Every row, in the guide's order (about ten seconds of CPU in all)."""
    return [make() for make in REPRODUCTIONS.values()]


def table(rows: Sequence[Reproduction]) -> str:
    """A markdown table: symptom, cause, fix, and each claim with its figures sick -> fixed."""
    lines = ["| symptom | cause | fix | what the operator measures: sick -> fixed | holds |",
             "|---|---|---|---|---|"]
    for r in rows:
        proof = "<br>".join(
            f"{LABELS[c.metric][0]} {fmt(c.metric, getattr(r.sick, c.metric))} -> "
            f"{fmt(c.metric, getattr(r.fixed, c.metric))} ({c.change} "
            f"{'within' if c.change == 'stays' else '>='} {c.factor:g}x)"
            for c in r.mode.claims)
        lines.append(f"| {r.mode.symptom} | {r.mode.cause} | {r.mode.fix} | {proof} | "
                     f"{'yes' if r.holds else 'NO'} |")
    return "\n".join(lines)


def dashboard_rows(r: Reproduction, metrics: Sequence[str] | None = None) -> list[str]:
    """One line per Dashboard figure: label, sick, fixed (every figure unless metrics)."""
    names = metrics or [f.name for f in fields(Dashboard)]
    return [f"{LABELS[m][0]:22s} {fmt(m, getattr(r.sick, m)):>14s} -> "
            f"{fmt(m, getattr(r.fixed, m)):>14s}" for m in names]
