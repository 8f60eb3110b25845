"""Serving measurement: replay a workload against the real engine in real time; report like vLLM.

An open-loop workload is replayed on the wall clock: a request enters the engine once its
arrival time has passed, and its TTFT counts from that arrival time, so time spent waiting for
a busy step is queueing the client really sees. A closed loop keeps `concurrency` requests in
flight and sends the next one the moment one finishes. Outputs have exact lengths
(temperature 0, ignore_eos), and the figures are those of vLLM's serving benchmark: request and
token throughput, TTFT, TPOT, ITL and E2E percentiles, and goodput under an SLO.
python -m minillm.bench serve (minillm/bench/serve.py) sweeps rates on top of this module.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from minillm.llm import LLM
from minillm.metrics import Distribution, Summary, summarize
from minillm.request import RequestOutput
from minillm.sampling import SamplingParams
from minillm.trace import StepRecord
from minillm.workload import Workload

if TYPE_CHECKING:
    pass

SLO_METRICS = ("ttft", "tpot", "itl", "e2e")
STATS = {"mean": "mean", "median": "p50", "p90": "p90", "p95": "p95", "p99": "p99"}
SECTIONS = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
            "itl": "Inter-token Latency", "e2e": "End-to-end Latency"}
REPORT_ROWS = {"Successful requests:": "completed", "Benchmark duration (s):": "duration_s",
               "Total input tokens:": "total_input_tokens",
               "Total generated tokens:": "total_output_tokens",
               "Request throughput (req/s):": "request_throughput",
               "Output token throughput (tok/s):": "output_throughput",
               "Total Token throughput (tok/s):": "total_token_throughput",
               "Request goodput (req/s):": "request_goodput"}
TABLE_COLUMNS = {"TTFT p50": "median_ttft_ms", "TTFT p99": "p99_ttft_ms",
                 "TPOT p50": "median_tpot_ms", "TPOT p99": "p99_tpot_ms",
                 "ITL p99": "p99_itl_ms", "E2E p99": "p99_e2e_ms"}


def parse_slo(text: str) -> dict[str, float]:
    """'ttft:500,tpot:50' (bounds in milliseconds) -> {'ttft': 0.5, 'tpot': 0.05} (seconds).

    Metrics: ttft, tpot, e2e, and itl (which bounds a request's worst inter-token gap).
    """
    slo: dict[str, float] = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition(":")
        name = name.strip().lower()
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"SLO item {item.strip()!r} must be METRIC:MS with METRIC one of "
                             f"{', '.join(SLO_METRICS)} (e.g. 'ttft:500,tpot:50')")
        if name in slo:
            raise ValueError(f"SLO metric {name!r} is given twice in {text!r}")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"SLO bound {value.strip()!r} for {name} is not a number of "
                             "milliseconds") from None
        if not (math.isfinite(ms) and ms > 0):
            raise ValueError(f"SLO bound for {name} must be a positive number of ms, got {ms}")
        slo[name] = ms / 1000.0
    return slo


def format_slo(slo: dict[str, float]) -> str:
    return ", ".join(f"{name}<={bound * 1000:g}ms" for name, bound in slo.items())


@dataclass(frozen=True)
class ServingResult:
    """One replayed workload.

    outputs: one per workload request, in workload order (request_id is the index as a str),
    each with its RequestMetrics. trace: the engine steps of this run. start: the engine-clock
    time (s) the run began; an open-loop request i arrives at start + workload[i].arrival_time.
    summary: minillm.metrics.summarize over the outputs; its goodput is set when slo (bounds in
    seconds, as parse_slo returns) is given.
    """

    workload: Workload
    outputs: list[RequestOutput]
    trace: list[StepRecord]
    start: float
    summary: Summary
    slo: dict[str, float] | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(len(o.prompt_token_ids) for o in self.outputs)

    @property
    def total_token_throughput(self) -> float:
        """Prompt plus output tokens per second."""
        s = self.summary
        return (self.prompt_tokens + s.output_tokens) / s.duration if s.duration > 0 else math.nan

    def with_slo(self, slo: dict[str, float] | None) -> ServingResult:
        """The same run judged against another SLO (seconds)."""
        return replace(self, slo=slo, summary=summarize([o.metrics for o in self.outputs], slo))

    def as_dict(self) -> dict[str, float | int | None]:
        """The reported figures under vLLM's names: throughputs per second, latencies in ms."""
        s = self.summary
        figures: dict[str, float | int | None] = {
            "completed": s.num_requests, "duration_s": s.duration,
            "total_input_tokens": self.prompt_tokens, "total_output_tokens": s.output_tokens,
            "request_throughput": s.request_throughput, "output_throughput": s.output_throughput,
            "total_token_throughput": self.total_token_throughput, "request_goodput": s.goodput,
        }
        for metric in SLO_METRICS:
            dist: Distribution = getattr(s, metric)
            for stat, field in STATS.items():
                figures[f"{stat}_{metric}_ms"] = getattr(dist, field) * 1000.0
        return figures

    def report(self) -> str:
        """The figures as vLLM's benchmark_serving prints them."""
        m = self.as_dict()
        lines = [f"{' Serving Benchmark Result ':=^50}", f"{'Workload:':<40}{self.workload!r}"]
        lines += [f"{label:<40}{_fmt(m[key])}" for label, key in REPORT_ROWS.items()
                  if key != "request_goodput" or self.slo]
        if self.slo:
            lines.append(f"{'Goodput SLO:':<40}{format_slo(self.slo)}")
        for metric, title in SECTIONS.items():
            lines.append(f"{title:-^50}")
            for stat in STATS:
                label = f"{stat.capitalize()} {metric.upper()} (ms):"
                lines.append(f"{label:<40}{_fmt(m[f'{stat}_{metric}_ms'])}")
        lines.append("=" * 50)
        return "\n".join(lines)


def _fmt(value: float | int | None) -> str:
    return str(value) if isinstance(value, int) else "-" if value is None else f"{value:.2f}"


class _Replay:
    """Feeds one workload to an idle engine on its clock and collects the finished outputs."""

    def __init__(self, llm: LLM, workload: Workload):
        self.engine, self.workload = llm.engine, workload
        vocab = llm.model.config.vocab_size
        self.prompts = [spec.token_ids(vocab) for spec in workload]
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
    return ServingResult(workload, outputs, llm.engine.trace[first_step:], replay.start,
                         summarize([o.metrics for o in outputs], slo), slo)
