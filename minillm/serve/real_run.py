"""Serve a workload on the real engine in real time, on a clock of choice: the real side of
calibration (minillm.calibration compares it step by step with the cost model).

clock="wall" runs and times everything on time.perf_counter. clock="cpu" runs the real engine
on the CPU time of its thread instead (plus the idle time it skips while waiting for the next
arrival): requests arrive, steps are timed and token times are stamped on that clock, which
other jobs on a shared machine inflate far less than the wall clock (they still share its
caches and memory bandwidth; with one torch thread, every op of a step runs on that thread).
The run is then close to the one a machine of its own would have served. On a GPU use "wall":
a thread waiting for the GPU is not running.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from minillm.engine import Engine
from minillm.llm import LLM
from minillm.request import Request
from minillm.sampling import SamplingParams
from minillm.trace import StepRecord
from minillm.workloads.streams import Arrivals, Workload

Clock = Literal["wall", "cpu"]


class CpuClock:
    """Seconds of this thread's CPU time since creation, plus the idle time skip() adds: the
    clock of a machine that runs nothing but this thread."""

    def __init__(self) -> None:
        self.origin, self.skipped = time.thread_time(), 0.0

    def __call__(self) -> float:
        return time.thread_time() - self.origin + self.skipped

    def skip(self, seconds: float) -> None:
        self.skipped += seconds


@dataclass(frozen=True)
class RealRun:
    """A workload served by the real engine: its Requests in workload order (metrics on the
    run's clock), its new trace records, and the seconds each engine.step() call took on that
    clock (the step plus the bookkeeping after it that the StepRecord does not time, i.e. the
    gap to the next step)."""

    requests: list[Request]
    trace: list[StepRecord]
    step_times: list[float]


def run_real(llm: LLM, workload: Workload, clock: Clock = "wall") -> RealRun:
    """Serve a workload on the real engine, queueing each request when Arrivals sends it (an
    open loop's once its arrival time, seconds from the start, has passed on the clock, "wall"
    or "cpu", see the module; a closed loop's when a client's last request finished)."""
    engine, vocab = llm.engine, llm.model.config.vocab_size
    cpu = CpuClock() if clock == "cpu" else None
    now: Callable[[], float] = cpu or time.perf_counter
    saved, engine.clock = engine.clock, now
    try:
        return _serve(engine, workload, vocab, now, cpu)
    finally:
        engine.clock = saved


def _serve(engine: Engine, workload: Workload, vocab: int, now: Callable[[], float],
           cpu: CpuClock | None) -> RealRun:
    arrivals = Arrivals(workload)
    requests: list[Request | None] = [None] * len(workload)
    step_times: list[float] = []
    first, start = len(engine.trace), now()
    while arrivals or engine.has_unfinished_requests():
        elapsed = now() - start
        while arrivals and arrivals.next_time() <= elapsed:
            sent, i = arrivals.pop()
            spec = workload[i]
            params = SamplingParams(max_tokens=spec.output_len, temperature=0.0, ignore_eos=True)
            request_id = engine.add_request(spec.token_ids(vocab), params,
                                            arrival_time=start + sent)
            requests[i] = engine.requests[request_id]
        if engine.has_unfinished_requests():
            steps, before = len(engine.trace), now()
            for out in engine.step():
                if out.finished:  # a closed loop's client sends its next request
                    arrivals.finished(out.metrics.finished_time - start)
            if len(engine.trace) > steps:  # a step that only preempts leaves no record
                step_times.append(now() - before)
        elif cpu is not None:  # idle on the CPU clock: jump to the next arrival
            cpu.skip(arrivals.next_time() - elapsed)
        else:
            time.sleep(max(arrivals.next_time() - elapsed, 0.0))
    return RealRun(requests, engine.trace[first:], step_times)  # type: ignore[arg-type]
