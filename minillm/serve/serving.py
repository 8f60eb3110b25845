"""Serving measurement: replay a workload against the real engine in real time; report like vLLM.

An open-loop workload is replayed on the wall clock: a request enters the engine once its
arrival time has passed, and its TTFT counts from that arrival time, so time spent waiting for
a busy step is queueing the client really sees. A closed loop keeps `concurrency` requests in
flight and sends the next one the moment one finishes. Outputs have exact lengths
(temperature 0, ignore_eos), and the figures are those of vLLM's serving benchmark: request and
token throughput, TTFT, TPOT, ITL and E2E percentiles, and goodput under an SLO.

The result is a ServingResult (minillm/serve/serving_result.py), the same report type the benchmark
client over HTTP (minillm.serve.client) gives. python -m minillm.bench serve
(minillm/bench/serve.py) sweeps rates on top of either.
"""

from __future__ import annotations

import time

from minillm.llm import LLM
from minillm.request import RequestOutput
from minillm.sampling import SamplingParams
from minillm.serve.serving_result import (
    DEFAULT_PERCENTILES,
    PERCENTILE_METRICS,
    REPORT_ROWS,
    SECTIONS,
    SLO_METRICS,
    TABLE_COLUMNS,
    RequestRecord,
    ServingResult,
    format_slo,
    json_safe,
    parse_slo,
)
from minillm.workloads.streams import Workload

__all__ = [  # the report type and its helpers are re-exported: chapters import them from here
    "DEFAULT_PERCENTILES", "PERCENTILE_METRICS", "REPORT_ROWS", "SECTIONS", "SLO_METRICS",
    "TABLE_COLUMNS", "RequestRecord", "ServingResult", "format_slo", "json_safe", "parse_slo",
    "run_serving", "warm_up",
]


class _Replay:
    """Feeds one workload to an idle engine on its clock and collects the finished outputs."""

    def __init__(self, llm: LLM, workload: Workload):
        self.engine, self.workload = llm.engine, workload
        vocab = llm.model.config.vocab_size
        self.prompts: list[str | list[int]] = [
            spec.prompt if spec.prompt is not None else spec.token_ids(vocab) for spec in workload]
        self.params = [SamplingParams(max_tokens=spec.output_len, temperature=0, ignore_eos=True)
                       for spec in workload]
        for i, (prompt, params) in enumerate(zip(self.prompts, self.params)):
            try:  # validate every request before the clock starts
                self.engine.make_request(prompt, params, request_id=str(i))
            except ValueError as e:
                raise ValueError(f"workload request {i}: {e}") from None
        self.in_flight: set[str] = set()
        self.outputs: dict[str, RequestOutput] = {}
        self.start = 0.0

    def issue(self, i: int, arrival_time: float) -> None:
        request_id = str(i)
        self.engine.add_request(self.prompts[i], self.params[i], request_id, arrival_time)
        self.in_flight.add(request_id)

    def step(self) -> list[RequestOutput]:
        """One engine step; the outputs of this run's requests that finished in it."""
        done = [o for o in self.engine.step() if o.finished and o.request_id in self.in_flight]
        for o in done:
            self.in_flight.discard(o.request_id)
            self.outputs[o.request_id] = o
        return done

    def run(self) -> list[RequestOutput]:
        self.start = self.engine.clock()
        try:
            if self.workload.is_closed_loop:
                self.run_closed()
            else:
                self.run_open()
        finally:  # after an error: free what this run still holds
            for request_id in self.in_flight:
                self.engine.abort_request(request_id)
        return [self.outputs[str(i)] for i in range(len(self.workload))]

    def run_open(self) -> None:
        """Admit each request once its arrival time has passed; sleep while nothing runs."""
        order = sorted(range(len(self.workload)), key=lambda i: self.workload[i].arrival_time)
        arrivals = [self.start + self.workload[i].arrival_time for i in order]
        nxt = 0
        while nxt < len(order) or self.in_flight:
            now = self.engine.clock()
            while nxt < len(order) and arrivals[nxt] <= now:
                self.issue(order[nxt], arrivals[nxt])
                nxt += 1
            if self.in_flight:
                self.step()
            elif nxt < len(order):
                time.sleep(max(arrivals[nxt] - now, 0.0))

    def run_closed(self) -> None:
        """Start `concurrency` requests; issue the next one the moment any finishes."""
        assert self.workload.concurrency is not None
        nxt = min(self.workload.concurrency, len(self.workload))
        for i in range(nxt):
            self.issue(i, self.start)
        while self.in_flight:
            for done in self.step():
                finished = done.metrics.finished_time
                assert finished is not None
                if nxt < len(self.workload):
                    self.issue(nxt, finished)  # the client sends its next request at once
                    nxt += 1


def warm_up(llm: LLM) -> None:
    """Run two short requests so one-time costs (kernel compiles, caches) stay out of a run."""
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    llm.generate([[1] * 16, [2] * 24], params, use_tqdm=False)


def run_serving(llm: LLM, workload: Workload, slo: dict[str, float] | None = None,
                warmup: bool = True) -> ServingResult:
    """Replay workload against llm's engine in real time (see the module docstring).

    slo maps ttft, tpot, itl or e2e to a bound in seconds (parse_slo makes one from ms).
    """
    if not isinstance(workload, Workload) or not workload:
        raise ValueError(f"run_serving needs a non-empty Workload, got {workload!r:.80}")
    if llm.engine.has_unfinished_requests():
        raise ValueError("run_serving needs an idle engine: finish or abort its requests first")
    if warmup:
        warm_up(llm)
    replay = _Replay(llm, workload)
    first_step = len(llm.engine.trace)
    outputs = replay.run()
    return ServingResult.build(workload, [RequestRecord.of(o) for o in outputs], replay.start,
                               slo, trace=llm.engine.trace[first_step:], outputs=outputs)
