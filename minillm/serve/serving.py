"""Serving measurement: replay a workload against the real engine in real time; report like vLLM.

An open-loop workload is replayed on the wall clock: a request enters the engine once its
arrival time has passed, and its TTFT counts from that arrival time, so time spent waiting for
a busy step is queueing the client really sees. A closed loop keeps `concurrency` requests in
flight and sends the next one the moment one finishes. Both are minillm.workloads.Arrivals, the
driver the simulator, the fleet and disaggregated serving release their requests with too.
Outputs have exact lengths (temperature 0, ignore_eos), and the figures are those of vLLM's
serving benchmark: request and token throughput, TTFT, TPOT, ITL and E2E percentiles, and
goodput under an SLO.

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
from minillm.workloads.streams import Arrivals, Workload

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
        """Send each request when Arrivals says (an open loop's at its arrival time, a closed
        loop's the moment a client's last request finished); sleep while nothing runs."""
        self.start = start = self.engine.clock()
        arrivals = Arrivals(self.workload)
        try:
            while arrivals or self.in_flight:
                elapsed = self.engine.clock() - start
                while arrivals and arrivals.next_time() <= elapsed:
                    sent, i = arrivals.pop()
                    self.issue(i, start + sent)
                if self.in_flight:
                    for done in self.step():
                        assert done.metrics.finished_time is not None
                        arrivals.finished(done.metrics.finished_time - start)
                elif arrivals:
                    time.sleep(max(arrivals.next_time() - elapsed, 0.0))
        finally:  # after an error: free what this run still holds
            for request_id in self.in_flight:
                self.engine.abort_request(request_id)
        return [self.outputs[str(i)] for i in range(len(self.workload))]


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
