"""Calibration: how well the simulator predicts the real engine here, step by step and request
by request.

Run the real engine (an LLM) on a workload, then feed each step's scheduled entries, exactly as
the real trace records them, to roofline.step_time with this machine's measured peaks
(roofline.measure_machine) and fitted overheads. Comparing step by step, rather than comparing
two whole schedules, isolates the cost model from queueing: the report gives the median absolute
relative error |modelled - real| / real per kind of step, "prefill" (only prefill chunks),
"decode" (only decodes) and "mixed" (both), and its median sign (the bias). Then it simulates
the whole workload with the fitted overheads beside the real run and compares what a reader
quotes: TTFT and TPOT at p50 and p99 (RequestComparison). Both levels are needed: a step median
counts every step once, while a request's TPOT counts a step once per request in it, so the
large batches weigh the most in TPOT and the least in the median. With only a per-step and a
per-token overhead, fitted on this CPU, decode steps of one request came out right (+5%,
median) and steps of 3, 4 and 5+ requests 34%, 42% and 51% too cheap; the median decode error
stayed at ~20%, yet TPOT p50 came out at 0.63x the real one (six runs of bench simulate's
workload, 0.52-0.76x). Replaying the real schedule with modelled step times gave 0.79x: the
rest comes from open-loop feedback (a decode window that the model shortens also catches fewer
of the next requests' prefill chunks). Throughput agreed all along: an open loop below capacity
finishes when its last request arrives, whatever the steps cost.

The overheads are what no roofline counts, fitted by nonnegative least squares, each phase
weighing the same and each step's error counted against its phase's median step (a per-step
relative error pulls every fit low, since an over-estimate of a fast step costs more than the
same under-estimate): seconds per step (Python, framework, kernel launches), per new token
(norms, rotary embeddings, small ops below peak), per request in the step (its batch metadata,
sampling, and on a CPU above all its attention call: the reference backend's masked,
grouped-query attention and the gather of its blocks) and per attention (query, key) pair (the
PyTorch reference materialises the score matrix, a fused kernel does not). Errors are always
measured on steps the fit did not see: by default the fit uses the even-numbered steps of the
run and the report the odd ones, so that both halves share whatever load the machine carries
as it drifts; with fit_workload, the fit uses a separate run and the report every step of this
one.

The real run and its clocks ("wall", "cpu") live in minillm.real_run.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from minillm.calc import roofline
from minillm.llm import LLM
from minillm.metrics import Summary, summarize
from minillm.serve.real_run import Clock, run_real
from minillm.sim.simulator import SimulationResult, simulate
from minillm.trace import StepRecord
from minillm.workloads.streams import RequestSpec, Workload

StepPhase = Literal["prefill", "decode", "mixed"]
PHASES: tuple[StepPhase, ...] = ("prefill", "decode", "mixed")
REQUEST_METRICS = (("ttft", "p50"), ("ttft", "p99"), ("tpot", "p50"), ("tpot", "p99"))


@dataclass(frozen=True)
class StepComparison:
    """One real step and its modelled time (seconds, fitted overheads included)."""

    step: int
    phase: StepPhase
    num_tokens: int
    real: float
    modelled: float

    @property
    def error(self) -> float:
        """Relative error of the model: (modelled - real) / real."""
        return (self.modelled - self.real) / self.real


@dataclass(frozen=True)
class RequestComparison:
    """One request-level figure (e.g. TPOT p50, seconds) of the real and the simulated run."""

    metric: str
    real: float
    simulated: float

    @property
    def ratio(self) -> float:
        """simulated / real: 1 is perfect, 0.5 a simulator that halves the figure."""
        return self.simulated / self.real


@dataclass(frozen=True)
class CalibrationReport:
    """The cost model against the real engine on this machine, at both levels.

    clock: how the real run was clocked ("wall" or "cpu", see the module).
    overhead, overhead_per_token, overhead_per_seq, overhead_per_pair: the fitted seconds per
    step, per new token, per request in a step and per attention pair (overheads() gives them
    as one roofline.StepOverheads, for simulate). fitted_on: "even steps" (of this run; steps
    then holds the odd ones) or "fit run" (a separate run; steps holds every step of this one).
    Step level: median_error per phase, the median of |modelled - real| / real (nan when the run
    has no such step); median_bias, the median signed error (negative: under-priced).
    Request level: real_summary and simulated_summary, the real run (on its clock) and
    simulate() of the same workload with the fitted overheads; requests compares their TTFT and
    TPOT at p50 and p99. schedules_match: simulate() scheduled the same entries step for step
    (expected when every request arrives at 0 s; with spread arrivals the clocks shift
    admissions).
    """

    hardware: roofline.Hardware
    dtype_bytes: int
    clock: Clock
    overhead: float
    overhead_per_token: float
    overhead_per_seq: float
    overhead_per_pair: float
    fitted_on: Literal["even steps", "fit run"]
    steps: list[StepComparison]
    median_error: dict[StepPhase, float]
    median_bias: dict[StepPhase, float]
    num_steps: dict[StepPhase, int]
    real_summary: Summary
    simulated_summary: Summary
    schedules_match: bool

    def overheads(self) -> roofline.StepOverheads:
        """The fitted overheads, for simulate(overheads=...) and recommend."""
        return roofline.StepOverheads(self.overhead, self.overhead_per_token,
                                      self.overhead_per_seq, self.overhead_per_pair)

    @property
    def requests(self) -> list[RequestComparison]:
        """TTFT and TPOT, p50 and p99, real against simulated."""
        return [RequestComparison(f"{name} {q}", getattr(getattr(self.real_summary, name), q),
                                  getattr(getattr(self.simulated_summary, name), q))
                for name, q in REQUEST_METRICS]

    def worst_request_error(self) -> float:
        """The largest |simulated / real - 1| over the request-level figures."""
        return max(abs(c.ratio - 1) for c in self.requests)

    def table(self) -> str:
        """Both levels as text: per phase the step error and bias, then the request figures."""
        lines = [f"steps (held out, clock={self.clock}): median |error|, median signed error"]
        lines += [f"  {p:<8} {self.median_error[p]:6.1%}  {self.median_bias[p]:+6.1%}  "
                  f"({self.num_steps[p]} steps)" for p in PHASES if self.num_steps[p]]
        lines.append("requests: real, simulated (ms), simulated / real")
        lines += [f"  {c.metric:<9} {c.real * 1e3:8.1f} {c.simulated * 1e3:8.1f}  {c.ratio:5.2f}"
                  for c in self.requests]
        return "\n".join(lines)


def step_phase(record: StepRecord) -> StepPhase:
    """prefill, decode or mixed: which kinds of entries a step holds."""
    kinds = {e.phase for e in record.scheduled}
    return "mixed" if len(kinds) == 2 else kinds.pop()


def step_entries(record: StepRecord) -> list[tuple[int, int]]:
    """(num_new_tokens, context_len after the step) per request: roofline.step_time's entries."""
    return [(e.num_tokens, e.num_computed_tokens + e.num_tokens) for e in record.scheduled]


def step_terms(record: StepRecord) -> tuple[int, int, int, int]:
    """What each overhead multiplies: (1 step, new tokens, requests, attention pairs)."""
    return roofline.StepOverheads.terms(step_entries(record))


def fit_overheads(real: Sequence[float], modelled: Sequence[float],
                  terms: Sequence[Sequence[float]], weights: Sequence[float] | None = None,
                  scales: Sequence[float] | None = None) -> tuple[float, ...]:
    """Nonnegative coefficients c (seconds per unit of each term) minimising
    sum(w * ((m + c . x - r) / s)^2) over steps of real time r, roofline time m and terms x
    (e.g. step_terms: 1, tokens, requests, pairs); weights w default to 1, scales s to r (the
    relative error). A scale shared by similar steps (phase_scales) leaves the fitted times
    unbiased in total, which a per-step relative error does not: it pulls every prediction
    towards the fast steps, since an over-estimate of r costs more than the same under-estimate.

    Exact nonnegative least squares for a handful of terms: the optimum is the unconstrained
    least-squares fit on some subset of the terms with the rest at 0, so try every subset."""
    r, m = np.asarray(real, float), np.asarray(modelled, float)
    w = np.sqrt(np.asarray(weights if weights is not None else np.ones(len(r)), float))
    s = np.asarray(scales if scales is not None else r, float)
    a = np.asarray(terms, float) * (w / s)[:, None]
    y = w * (r - m) / s
    best, best_loss = np.zeros(a.shape[1]), float(y @ y)
    for size in range(1, a.shape[1] + 1):
        for subset in itertools.combinations(range(a.shape[1]), size):
            cols = list(subset)
            coef = np.linalg.lstsq(a[:, cols], y, rcond=None)[0]
            if (coef < 0).any():
                continue
            full = np.zeros(a.shape[1])
            full[cols] = coef
            loss = float(np.sum((y - a @ full) ** 2))
            if loss < best_loss:
                best, best_loss = full, loss
    return tuple(float(c) for c in best)


def phase_weights(trace: Sequence[StepRecord]) -> list[float]:
    """1 / (steps of the same phase): each phase weighs the same in a fit, so hundreds of decode
    steps do not drown a handful of prefill steps."""
    phases = [step_phase(r) for r in trace]
    counts = {p: phases.count(p) for p in set(phases)}
    return [1.0 / counts[p] for p in phases]


def phase_scales(trace: Sequence[StepRecord], seconds: Sequence[float]) -> list[float]:
    """Per step, the median real time of the steps of its phase: fit_overheads' scales, so a
    fit weighs a millisecond of error the same in every step of a phase."""
    phases = [step_phase(r) for r in trace]
    median = {p: statistics.median(t for q, t in zip(phases, seconds) if q == p)
              for p in set(phases)}
    return [median[p] for p in phases]


def calibrate(llm: LLM, workload: Workload, *, hw: roofline.Hardware | None = None,
              fit_workload: Workload | None = None, clock: Clock = "wall") -> CalibrationReport:
    """Compare the real engine with the cost model, step by step and request by request (see
    the module).

    hw: this machine's peaks (default: roofline.measure_machine(), which takes about 1 s).
    fit_workload: a separate run to fit the overheads on (default: the even steps of this run).
    clock: "wall" (time.perf_counter) or "cpu" (the engine thread's CPU time; needs
    torch.get_num_threads() == 1, since other threads' work would go uncounted).
    """
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    if clock == "cpu" and torch.get_num_threads() != 1:
        raise ValueError(f"clock='cpu' counts one thread's CPU time, but torch runs "
                         f"{torch.get_num_threads()} threads: torch.set_num_threads(1) first")
    hw = hw or roofline.measure_machine()
    dtype_bytes = llm.model.lm_head.weight.element_size()
    # Warm-up on the longest prompts: a size's first call allocates (else it lands in the run).
    run_real(llm, at_time_zero(sorted(workload, key=lambda s: s.prompt_len)[-2:]), clock)
    fit_run = run_real(llm, fit_workload, clock) if fit_workload is not None else None
    run = run_real(llm, workload, clock)
    real = list(zip(run.trace, run.step_times))
    fitted, evaluated = ((list(zip(fit_run.trace, fit_run.step_times)), real)
                         if fit_run is not None else (real[::2], real[1::2]))
    overheads = roofline.StepOverheads(*_fit(fitted, llm, hw, dtype_bytes))
    steps = [StepComparison(r.step, step_phase(r), r.num_tokens, seconds, _modelled(
                 r, llm, hw, dtype_bytes, overheads)) for r, seconds in evaluated]
    sim = simulate_like(llm, workload, hw, dtype_bytes, overheads)
    return CalibrationReport(
        hardware=hw, dtype_bytes=dtype_bytes, clock=clock, **overheads.as_keywords(),
        fitted_on="fit run" if fit_run else "even steps", steps=steps,
        median_error={p: _median([abs(s.error) for s in steps if s.phase == p]) for p in PHASES},
        median_bias={p: _median([s.error for s in steps if s.phase == p]) for p in PHASES},
        num_steps={p: sum(s.phase == p for s in steps) for p in PHASES},
        real_summary=summarize(r.metrics for r in run.requests),
        simulated_summary=sim.summary(), schedules_match=_schedule(sim.trace) == _schedule(
            run.trace))


def _fit(steps: Sequence[tuple[StepRecord, float]], llm: LLM, hw: roofline.Hardware,
         dtype_bytes: int) -> tuple[float, ...]:
    """fit_overheads over (record, real seconds) pairs: each phase weighs the same, and within
    a phase each step's error counts relative to the phase's median step."""
    trace, seconds = [r for r, _ in steps], [t for _, t in steps]
    return fit_overheads(seconds, [_modelled(r, llm, hw, dtype_bytes, roofline.StepOverheads())
                                   for r in trace],
                         [step_terms(r) for r in trace], phase_weights(trace),
                         phase_scales(trace, seconds))


def at_time_zero(specs: Sequence[RequestSpec]) -> Workload:
    """The same requests, all arriving at 0 s, open loop."""
    return Workload([dataclasses.replace(s, arrival_time=0.0) for s in specs])


def simulate_like(llm: LLM, workload: Workload, hw: roofline.Hardware, dtype_bytes: int,
                  overheads: roofline.StepOverheads | None = None) -> SimulationResult:
    """simulate() of workload with llm's model shape and every scheduling setting of its engine,
    KV pool size included, on hw."""
    c = llm.config
    return simulate(llm.model.config, hw, workload, dtype_bytes=dtype_bytes, overheads=overheads,
                    block_size=c.block_size,
                    max_num_seqs=c.max_num_seqs, max_num_batched_tokens=c.max_num_batched_tokens,
                    enable_chunked_prefill=c.enable_chunked_prefill,
                    enable_prefix_caching=c.enable_prefix_caching, scheduling=c.scheduling,
                    num_kv_blocks=c.num_kv_blocks, max_model_len=c.max_model_len)


def _modelled(record: StepRecord, llm: LLM, hw: roofline.Hardware, dtype_bytes: int,
              overheads: roofline.StepOverheads) -> float:
    return roofline.step_time(llm.model.config, hw, step_entries(record), dtype_bytes,
                              *overheads.as_tuple()).time


def _schedule(trace: Sequence[StepRecord]) -> list[list[tuple[str, int, int]]]:
    """Each step's entries without request ids (the real engine numbers its requests on)."""
    return [[(e.phase, e.num_tokens, e.num_computed_tokens) for e in r.scheduled] for r in trace]


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan
