"""Calibration: how well the roofline cost model predicts the real engine's step times here.

Run the real engine (an LLM) on a workload, then feed each step's scheduled entries, exactly as
the real trace records them, to roofline.step_time with this machine's measured peaks
(roofline.measure_machine) and fitted overheads. Comparing step by step, rather than comparing
two whole schedules, isolates the cost model from queueing. The report gives the median absolute
relative error |modelled - real| / real per kind of step: "prefill" (only prefill chunks),
"decode" (only decodes) and "mixed" (both), and the whole run simulated beside the real one.

The overheads are what no roofline counts: Python, framework and kernel-launch time per step,
and the per-token work that runs below peak (norms, rotary embeddings, small matmuls). Both are
fitted by least squares on the relative error, each phase weighing the same, and the errors
are always measured on steps the fit did not see: by default the fit uses the even-numbered
steps of the run and the report the odd ones, so that both halves share whatever load the
machine carries as it drifts (a laptop's turbo, other jobs on a shared CPU); with fit_workload,
the fit uses a separate run and the report every step of this one.

clock="wall" times a step as its StepRecord does (perf_counter, start to end); clock="cpu" by
the CPU time of the thread that ran it, which other jobs on a shared machine cannot inflate
(with one torch thread, every op of the step runs on that thread).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from minillm import roofline
from minillm.llm import LLM
from minillm.metrics import Summary, summarize
from minillm.request import Request
from minillm.sampling import SamplingParams
from minillm.simulator import SimulationResult, simulate
from minillm.trace import StepRecord
from minillm.workload import RequestSpec, Workload

StepPhase = Literal["prefill", "decode", "mixed"]
Clock = Literal["wall", "cpu"]
PHASES: tuple[StepPhase, ...] = ("prefill", "decode", "mixed")


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
class CalibrationReport:
    """The cost model against the real engine on this machine.

    clock: how real steps were timed ("wall" or "cpu", see the module).
    overhead: fitted seconds per step; overhead_per_token: fitted seconds per new token.
    fitted_on: "even steps" (of this run; steps then holds the odd ones) or "fit run" (a
    separate run; steps holds every step of this one). median_error: per phase, the median of
    |modelled - real| / real (nan when the run has no such step). real_summary and
    simulated_summary: the real run and simulate() of the same workload with the fitted
    overheads. schedules_match: simulate() scheduled the same entries step for step (expected
    when every request arrives at 0 s; with spread arrivals the real clock shifts admissions).
    """

    hardware: roofline.Hardware
    dtype_bytes: int
    clock: Clock
    overhead: float
    overhead_per_token: float
    fitted_on: Literal["even steps", "fit run"]
    steps: list[StepComparison]
    median_error: dict[StepPhase, float]
    num_steps: dict[StepPhase, int]
    real_summary: Summary
    simulated_summary: Summary
    schedules_match: bool


def step_phase(record: StepRecord) -> StepPhase:
    """prefill, decode or mixed: which kinds of entries a step holds."""
    kinds = {e.phase for e in record.scheduled}
    return "mixed" if len(kinds) == 2 else kinds.pop()


def step_entries(record: StepRecord) -> list[tuple[int, int]]:
    """(num_new_tokens, context_len after the step) per request: roofline.step_time's entries."""
    return [(e.num_tokens, e.num_computed_tokens + e.num_tokens) for e in record.scheduled]


@dataclass(frozen=True)
class RealRun:
    """A workload served by the real engine: its Requests, its new trace records, and the CPU
    seconds of the calling thread spent in each of those steps."""

    requests: list[Request]
    trace: list[StepRecord]
    cpu_times: list[float]

    def durations(self, clock: Clock) -> list[float]:
        """Seconds per step: the StepRecord's wall time, or the thread's CPU time."""
        return [r.duration for r in self.trace] if clock == "wall" else list(self.cpu_times)


def run_real(llm: LLM, workload: Workload) -> RealRun:
    """Serve an open-loop workload on the real engine, queueing each request once its arrival
    time (seconds from the start) has passed."""
    if workload.concurrency is not None:
        raise ValueError("calibration runs open-loop workloads; got a closed loop of "
                         f"concurrency {workload.concurrency}")
    engine, vocab = llm.engine, llm.model.config.vocab_size
    pending = deque(sorted(workload, key=lambda spec: spec.arrival_time))
    requests: list[Request] = []
    cpu_times: list[float] = []
    first, start = len(engine.trace), time.perf_counter()
    while pending or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while pending and pending[0].arrival_time <= now:
            spec = pending.popleft()
            params = SamplingParams(max_tokens=spec.output_len, temperature=0.0, ignore_eos=True)
            request_id = engine.add_request(spec.token_ids(vocab), params,
                                            arrival_time=start + spec.arrival_time)
            requests.append(engine.requests[request_id])
        if engine.has_unfinished_requests():
            steps, cpu = len(engine.trace), time.thread_time()
            engine.step()
            if len(engine.trace) > steps:  # a step that only preempts leaves no record
                cpu_times.append(time.thread_time() - cpu)
        elif pending:
            time.sleep(pending[0].arrival_time - now)
    return RealRun(requests, engine.trace[first:], cpu_times)


def fit_overheads(real: Sequence[float], modelled: Sequence[float], num_tokens: Sequence[int],
                  weights: Sequence[float] | None = None) -> tuple[float, float]:
    """Overheads o per step and t per token (seconds, both >= 0) minimising the weighted squared
    relative error sum(w * ((m + o + t * n - r) / r)^2) over steps of real time r, roofline
    time m and n new tokens (weights w default to 1)."""
    w = weights or [1.0] * len(real)
    rows = [(wi ** 0.5 / r, wi ** 0.5 * n / r, wi ** 0.5 * (1 - m / r))
            for wi, r, m, n in zip(w, real, modelled, num_tokens)]
    s = {k: sum(row[i] * row[j] for row in rows) for k, (i, j) in
         {"aa": (0, 0), "bb": (1, 1), "ab": (0, 1), "ay": (0, 2), "by": (1, 2)}.items()}
    candidates = [(0.0, 0.0), (max(s["ay"] / s["aa"], 0.0), 0.0),
                  (0.0, max(s["by"] / s["bb"], 0.0))]
    det = s["aa"] * s["bb"] - s["ab"] ** 2
    if det > 0:  # both free; kept only when both come out >= 0
        both = ((s["ay"] * s["bb"] - s["by"] * s["ab"]) / det,
                (s["by"] * s["aa"] - s["ay"] * s["ab"]) / det)
        if min(both) >= 0:
            candidates.append(both)

    def loss(o: float, t: float) -> float:
        return sum((y - a * o - b * t) ** 2 for a, b, y in rows)

    return min(candidates, key=lambda c: loss(*c))


def phase_weights(trace: Sequence[StepRecord]) -> list[float]:
    """1 / (steps of the same phase): each phase weighs the same in a fit, so hundreds of decode
    steps do not drown a handful of prefill steps."""
    phases = [step_phase(r) for r in trace]
    counts = {p: phases.count(p) for p in set(phases)}
    return [1.0 / counts[p] for p in phases]


def calibrate(llm: LLM, workload: Workload, *, hw: roofline.Hardware | None = None,
              fit_workload: Workload | None = None, clock: Clock = "wall") -> CalibrationReport:
    """Compare the real engine's step times on workload with the cost model (see the module).

    hw: this machine's peaks (default: roofline.measure_machine(), which takes about 1 s).
    fit_workload: a separate run to fit the overheads on (default: the even steps of this run).
    clock: "wall" (StepRecord durations) or "cpu" (the engine thread's CPU time; needs
    torch.get_num_threads() == 1, since other threads' work would go uncounted).
    """
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    if clock == "cpu" and torch.get_num_threads() != 1:
        raise ValueError(f"clock='cpu' counts one thread's CPU time, but torch runs "
                         f"{torch.get_num_threads()} threads: torch.set_num_threads(1) first")
    hw = hw or roofline.measure_machine()
    dtype_bytes = llm.model.lm_head.weight.element_size()
    run_real(llm, at_time_zero(workload[:2]))  # warm-up: first calls allocate and compile
    fit_run = run_real(llm, fit_workload) if fit_workload is not None else None
    run = run_real(llm, workload)
    real = list(zip(run.trace, run.durations(clock)))
    fitted, evaluated = ((list(zip(fit_run.trace, fit_run.durations(clock))), real)
                         if fit_run is not None else (real[::2], real[1::2]))
    overhead, per_token = _fit(fitted, llm, hw, dtype_bytes)
    steps = [StepComparison(r.step, step_phase(r), r.num_tokens, seconds,
                            m + overhead + per_token * r.num_tokens)
             for (r, seconds), m in zip(evaluated, _roofline_times(
                 [r for r, _ in evaluated], llm, hw, dtype_bytes))]
    sim = simulate_like(llm, workload, hw, dtype_bytes, overhead, per_token)
    return CalibrationReport(
        hardware=hw, dtype_bytes=dtype_bytes, clock=clock, overhead=overhead,
        overhead_per_token=per_token, fitted_on="fit run" if fit_run else "even steps",
        steps=steps, median_error={p: _median_abs_error(steps, p) for p in PHASES},
        num_steps={p: sum(s.phase == p for s in steps) for p in PHASES},
        real_summary=summarize(r.metrics for r in run.requests),
        simulated_summary=sim.summary(), schedules_match=_schedule(sim.trace) == _schedule(
            run.trace))


def _fit(steps: Sequence[tuple[StepRecord, float]], llm: LLM, hw: roofline.Hardware,
         dtype_bytes: int) -> tuple[float, float]:
    """fit_overheads over (record, real seconds) pairs, each phase weighing the same."""
    trace = [r for r, _ in steps]
    return fit_overheads([seconds for _, seconds in steps],
                         _roofline_times(trace, llm, hw, dtype_bytes),
                         [r.num_tokens for r in trace], phase_weights(trace))


def at_time_zero(specs: Sequence[RequestSpec]) -> Workload:
    """The same requests, all arriving at 0 s, open loop."""
    return Workload([dataclasses.replace(s, arrival_time=0.0) for s in specs])


def simulate_like(llm: LLM, workload: Workload, hw: roofline.Hardware, dtype_bytes: int,
                  overhead: float = 0.0, overhead_per_token: float = 0.0) -> SimulationResult:
    """simulate() of workload with llm's model shape and every scheduling setting of its engine,
    KV pool size included, on hw."""
    c = llm.config
    return simulate(llm.model.config, hw, workload, dtype_bytes=dtype_bytes, overhead=overhead,
                    overhead_per_token=overhead_per_token, block_size=c.block_size,
                    max_num_seqs=c.max_num_seqs, max_num_batched_tokens=c.max_num_batched_tokens,
                    enable_chunked_prefill=c.enable_chunked_prefill,
                    enable_prefix_caching=c.enable_prefix_caching, scheduling=c.scheduling,
                    num_kv_blocks=c.num_kv_blocks, max_model_len=c.max_model_len)


def _roofline_times(trace: Sequence[StepRecord], llm: LLM, hw: roofline.Hardware,
                    dtype_bytes: int) -> list[float]:
    model = llm.model.config
    return [roofline.step_time(model, hw, step_entries(r), dtype_bytes).time for r in trace]


def _schedule(trace: Sequence[StepRecord]) -> list[list[tuple[str, int, int]]]:
    """Each step's entries without request ids (the real engine numbers its requests on)."""
    return [[(e.phase, e.num_tokens, e.num_computed_tokens) for e in r.scheduled] for r in trace]


def _median_abs_error(steps: Sequence[StepComparison], phase: StepPhase) -> float:
    errors = [abs(s.error) for s in steps if s.phase == phase]
    return statistics.median(errors) if errors else math.nan
