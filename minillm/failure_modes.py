"""The guide's failure-modes table, reproduced: each symptom and its fix, side by side.

Every reproduction serves one workload twice in the simulator (minillm.simulator.simulate: the
engine's own scheduler on a virtual clock priced by the roofline, so every figure is modelled,
Llama-3-8B in BF16 on an H100-SXM unless a function says otherwise): once with the knob that
causes the symptom, once with the fix. It returns a Reproduction with the metric that proves the
fix on both runs, the runs themselves, and a few more figures an operator would look at.

| function | symptom | fix |
|---|---|---|
| static_batching | low utilisation, sawtooth throughput | continuous batching |
| long_prefill_blocking | decodes stall behind a long prompt's prefill | chunked prefill |
| kv_pressure | preemption storm at high concurrency | cap max_num_seqs to what the pool holds |
| memory_bound_small_batch | decode "slow", compute idle, bandwidth pegged | a bigger batch |
| batch_too_large | great throughput, awful TPOT p99 | a lower max batch (goodput under an SLO) |
| no_prefix_caching | shared system prompts prefilled again and again | prefix caching |

The guide's sixth row (tensor parallelism stalling past 8 GPUs) is chapter 17's. The
measurement helpers (prefill_tokens, wasted_tokens, utilisation, ...) read only what an
operator has: request metrics, the step trace and stats(); minillm.diagnosis uses them too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from minillm import roofline
from minillm.model_config import ModelConfig
from minillm.prefix_workload import shared_prefix
from minillm.simulator import SimulationResult, simulate
from minillm.trace import StepRecord
from minillm.workload import Mixture, RequestSpec, Workload, closed_loop, poisson

MODEL, HARDWARE = "llama-3-8b", "H100-SXM"
VOCAB = 128256  # Llama-3's vocabulary: shared-prefix prompts' ids must fit it


@dataclass(frozen=True)
class Reproduction:
    """One row of the table, run: the symptom (sick) and the fix (fixed) on the same workload.

    metric: what proves the fix, in the unit named in it; better: "lower" or "higher" is good.
    sick, fixed: the metric on the two runs. margin: the factor by which the fix must improve
    the metric for the row to hold (a fixed value of 0 against a positive sick one is infinitely
    better). shows: the symptom's own sign on the sick run beyond the metric (e.g. the big batch
    really had the higher throughput). evidence: (label, sick, fixed) figures that go with it.
    sick_run, fixed_run: the SimulationResults, for plots.
    """

    name: str
    symptom: str
    cause: str
    fix: str
    metric: str
    better: Literal["lower", "higher"]
    sick: float
    fixed: float
    margin: float
    shows: bool
    evidence: tuple[tuple[str, float, float], ...]
    sick_run: SimulationResult
    fixed_run: SimulationResult

    @property
    def improvement(self) -> float:
        """How many times better the fix makes the metric (inf when the symptom is gone to 0)."""
        num, den = (self.sick, self.fixed) if self.better == "lower" else (self.fixed, self.sick)
        return math.inf if den == 0 and num > 0 else num / den if den else 1.0

    @property
    def holds(self) -> bool:
        """The symptom shows on the sick run and the fix improves the metric margin-fold."""
        return self.shows and self.improvement >= self.margin


# ---- what an operator can measure from a run ------------------------------------------------

class Traced(Protocol):
    """A run's step trace with the model and GPU it ran on: a SimulationResult, or a
    minillm.diagnosis.Deployment."""

    trace: list[StepRecord]
    model: ModelConfig
    hardware: roofline.Hardware


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


def worst_itl(run: SimulationResult) -> float:
    """The longest gap between two tokens of any request (seconds): the worst decode stall."""
    return max((gap for o in run.outputs for gap in o.metrics.itl), default=0.0)


def utilisation(run: Traced) -> tuple[float, float]:
    """(FLOP utilisation, bandwidth utilisation) over the run, modelled: the FLOPs and bytes of
    every step (roofline.step_flops_bytes) over what the hardware's peaks allow in the run's
    busy time. Decode at a small batch shows ~0.01 FLOP and ~1.0 bandwidth: memory-bound."""
    flops = moved = busy = 0.0
    for step in run.trace:
        entries = [(e.num_tokens, e.num_computed_tokens + e.num_tokens) for e in step.scheduled]
        f, b = roofline.step_flops_bytes(run.model, entries)
        flops, moved, busy = flops + f, moved + b, busy + step.duration
    return flops / (busy * run.hardware.flops), moved / (busy * run.hardware.bandwidth)


def _pair(sick: SimulationResult, fixed: SimulationResult,
          measure: Callable[[SimulationResult], float]) -> tuple[float, float]:
    return float(measure(sick)), float(measure(fixed))


def _run(wl: Workload | list[RequestSpec], **knobs: Any) -> SimulationResult:
    return simulate(MODEL, HARDWARE, wl, record_block_tables=False, **knobs)


# ---- the six rows ---------------------------------------------------------------------------

def static_batching() -> Reproduction:
    """200 requests at 50/s, 20% of them long answers, 32 seats: static batching holds every
    seat until the batch's slowest request ends (the batch drains to 1, then refills: the
    sawtooth), continuous batching refills a seat the step after it frees. Modelled."""
    wl = poisson(200, 50.0, (128, 512), Mixture([(0.8, (16, 64)), (0.2, (256, 512))]), seed=1)
    sick, fixed = _run(wl, scheduling="static", max_num_seqs=32), _run(wl, max_num_seqs=32)
    tput = _pair(sick, fixed, lambda r: r.summary().output_throughput)
    occupancy = _pair(sick, fixed, lambda r: sum(batch_sizes(r)) / len(r.trace))
    return Reproduction(
        "static_batching", "low GPU utilisation, sawtooth throughput",
        "static batching: seats idle while the batch's slowest request finishes",
        "continuous batching (scheduling='continuous')", "output tokens/s", "higher",
        *tput, 2.0, occupancy[0] < occupancy[1] / 2,
        (("mean batch size", *occupancy),
         ("TTFT p99 (s)", *_pair(sick, fixed, lambda r: r.summary().ttft.p99))), sick, fixed)


def long_prefill_workload() -> Workload:
    """Chat traffic at 10/s (64-256-token prompts) with every 8th request an 8,000-token prompt."""
    specs = list(poisson(200, 10.0, (64, 256), (64, 128), seed=2))
    for i in range(0, len(specs), 8):
        specs[i] = RequestSpec(specs[i].arrival_time, 8000, 16, seed=i)
    return Workload(specs)


def long_prefill_blocking() -> Reproduction:
    """A whole 8,000-token prefill in one step (~0.13 s modelled) stalls every running decode;
    chunked prefill with a 512-token budget bounds any step, so a decode never waits more than
    a chunk. Short prompts queued behind a long one still wait for its chunks under FCFS (the
    guide's other fixes: cap prompt length, disaggregate prefill), so the metric is the decodes'
    worst stall, not TTFT. Modelled."""
    wl = long_prefill_workload()
    sick = _run(wl, enable_chunked_prefill=False, max_num_batched_tokens=8192)
    fixed = _run(wl, enable_chunked_prefill=True, max_num_batched_tokens=512)
    stall = _pair(sick, fixed, worst_itl)
    biggest = _pair(sick, fixed, lambda r: max(s.num_tokens for s in r.trace))
    return Reproduction(
        "long_prefill_blocking", "TTFT and ITL spikes under load",
        "a long prompt's prefill blocks every decode (head-of-line)",
        "chunked prefill (enable_chunked_prefill=True, max_num_batched_tokens=512)",
        "worst ITL (s)", "lower", *stall, 5.0, biggest[0] >= 8000,
        (("largest step (tokens)", *biggest),
         ("ITL p99 (s)", *_pair(sick, fixed, lambda r: r.summary().itl.p99))), sick, fixed)


def kv_pressure() -> Reproduction:
    """200 requests at once into a 2,048-block pool (32,768 tokens) with up to 1,792 tokens each:
    256 seats admit more than the pool can grow, so running requests are preempted and
    recomputed over and over (92,858 tokens computed twice, victims stalled for seconds); 24
    seats never preempt here. Modelled: on an H100 the recomputation is cheap enough that the
    storm's throughput stays high; its cost is the wasted compute and the victims' stalls."""
    wl = poisson(200, math.inf, (256, 1024), (256, 768), seed=3)
    sick = _run(wl, num_kv_blocks=2048, max_num_seqs=256)
    fixed = _run(wl, num_kv_blocks=2048, max_num_seqs=24)
    preemptions = _pair(sick, fixed, lambda r: r.stats["num_preemptions"])
    return Reproduction(
        "kv_pressure", "OOM / preemption storm at high concurrency",
        "batch x context KV exceeds the pool", "cap max_num_seqs to what the pool holds (24)",
        "preemptions", "lower", *preemptions, 10.0, preemptions[0] >= 50,
        (("wasted (recomputed) tokens", *_pair(sick, fixed, wasted_tokens)),
         ("worst ITL (s)", *_pair(sick, fixed, worst_itl)),
         ("output tokens/s", *_pair(sick, fixed, lambda r: r.summary().output_throughput))),
        sick, fixed)


def memory_bound_small_batch() -> Reproduction:
    """64 clients in a closed loop served 4 at a time: each decode step reads all 16 GB of
    weights for 4 tokens, so bandwidth is pegged and the tensor cores idle; 64 seats read the
    same weights for 64 tokens. More FLOP/s would not help; a bigger batch does. Modelled."""
    wl = closed_loop(256, 64, (256, 512), (128, 256), seed=4)
    sick, fixed = _run(wl, max_num_seqs=4), _run(wl, max_num_seqs=64)
    tput = _pair(sick, fixed, lambda r: r.summary().output_throughput)
    flop_util = _pair(sick, fixed, lambda r: utilisation(r)[0])
    bw_util = _pair(sick, fixed, lambda r: utilisation(r)[1])
    return Reproduction(
        "memory_bound_small_batch", "decode 'slow' but compute idle, bandwidth pegged",
        "memory-bound by design at a small batch", "a bigger batch (max_num_seqs 4 -> 64)",
        "output tokens/s", "higher", *tput, 5.0, bw_util[0] > 0.9 and flop_util[0] < 0.1,
        (("FLOP utilisation", *flop_util), ("bandwidth utilisation", *bw_util)), sick, fixed)


SLO_TPOT = 0.015  # seconds: the interactive TPOT bound of batch_too_large


def batch_too_large() -> Reproduction:
    """256 clients with 1,024-1,536-token prompts: 256 seats give the most tokens/s, but each
    step reads 256 long contexts and carries prefill chunks of the clients' next prompts, so TPOT
    passes the 15 ms SLO for most requests; 64 seats give less throughput and far more goodput
    (requests/s within the SLO). Modelled."""
    wl = closed_loop(400, 256, (1024, 1536), (256, 512), seed=5)
    sick, fixed = _run(wl, max_num_seqs=256), _run(wl, max_num_seqs=64)
    slo = {"tpot": SLO_TPOT}
    goodput = _pair(sick, fixed, lambda r: r.summary(slo).goodput or 0.0)
    tput = _pair(sick, fixed, lambda r: r.summary().output_throughput)
    return Reproduction(
        "batch_too_large", "throughput great, p99 latency awful",
        "the batch is too large for the latency SLO",
        "a lower max batch (max_num_seqs 256 -> 64): optimise goodput",
        f"goodput (req/s, TPOT <= {SLO_TPOT * 1e3:.0f} ms)", "higher", *goodput, 2.0,
        tput[0] > tput[1] * 1.2,
        (("output tokens/s", *tput),
         ("TPOT p99 (s)", *_pair(sick, fixed, lambda r: r.summary().tpot.p99))), sick, fixed)


def no_prefix_caching() -> Reproduction:
    """200 requests sharing 4 system prompts of 2,048 tokens (short questions after them): without
    a prefix cache every request prefills its system prompt again; with one, each prompt is
    computed about once and TTFT falls with it. Modelled."""
    wl = shared_prefix(200, 4, 2048, (32, 128), (32, 128), 20.0, vocab_size=VOCAB, seed=6)
    sick, fixed = _run(wl), _run(wl, enable_prefix_caching=True)
    prefill = _pair(sick, fixed, prefill_tokens)
    return Reproduction(
        "no_prefix_caching", "prefix-heavy workload, redundant compute",
        "no prefix reuse: shared prompts recomputed", "prefix caching (enable_prefix_caching)",
        "prefill tokens computed", "lower", *prefill, 5.0,
        prefill[0] >= sum(s.prompt_len for s in wl),
        (("TTFT p50 (s)", *_pair(sick, fixed, lambda r: r.summary().ttft.p50)),
         ("TTFT p99 (s)", *_pair(sick, fixed, lambda r: r.summary().ttft.p99))), sick, fixed)


REPRODUCTIONS: dict[str, Callable[[], Reproduction]] = {
    f.__name__: f for f in (static_batching, long_prefill_blocking, kv_pressure,
                            memory_bound_small_batch, batch_too_large, no_prefix_caching)}


def reproduce_all() -> list[Reproduction]:
    """Every row, in the guide's order (a few seconds of CPU in all)."""
    return [make() for make in REPRODUCTIONS.values()]


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def table(rows: list[Reproduction]) -> str:
    """A markdown table: symptom, cause, fix, and the metric sick -> fixed, with the factor."""
    lines = ["| symptom | cause | fix | metric | sick -> fixed | better by |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.symptom} | {r.cause} | {r.fix} | {r.metric} | "
                     f"{_fmt(r.sick)} -> {_fmt(r.fixed)} | {_fmt(r.improvement)}x |")
    return "\n".join(lines)
