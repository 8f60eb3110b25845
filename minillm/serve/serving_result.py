"""One serving run's report: per-request records and the figures vLLM's benchmark reports.

ServingResult is the one report type of both ways to measure serving: the in-process replay
(minillm.serving.run_serving) and the benchmark client over HTTP (minillm.serve.client), which
measures any OpenAI-compatible server. Both build it from RequestRecords; its as_dict and
result_json use vLLM's result-JSON names, and report() prints as vLLM's benchmark prints.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from minillm.metrics import Distribution, RequestMetrics, Summary, percentile, summarize
from minillm.request import RequestOutput
from minillm.trace import StepRecord
from minillm.workloads.streams import Workload

SLO_METRICS = ("ttft", "tpot", "itl", "e2e")
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")  # vLLM's names: e2el is E2E latency
DEFAULT_PERCENTILES = (50.0, 90.0, 95.0, 99.0)
SECTIONS = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
            "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}
REPORT_ROWS = {"Successful requests:": "completed", "Failed requests:": "failed",
               "Benchmark duration (s):": "duration",
               "Total input tokens:": "total_input_tokens",
               "Total generated tokens:": "total_output_tokens",
               "Request throughput (req/s):": "request_throughput",
               "Request goodput (req/s):": "request_goodput",
               "Output token throughput (tok/s):": "output_throughput",
               "Total Token throughput (tok/s):": "total_token_throughput"}
TABLE_COLUMNS = {"TTFT p50": "median_ttft_ms", "TTFT p99": "p99_ttft_ms",
                 "TPOT p50": "median_tpot_ms", "TPOT p99": "p99_tpot_ms",
                 "ITL p99": "p99_itl_ms", "E2E p99": "p99_e2el_ms"}


def parse_slo(text: str) -> dict[str, float]:
    """'ttft:500,tpot:50' or 'ttft:500 tpot:50' (bounds in ms) -> {'ttft': 0.5, 'tpot': 0.05}
    (seconds), as vLLM's --goodput takes them.

    Metrics: ttft, tpot, e2e (or vLLM's e2el), and itl (which bounds a request's worst gap).
    """
    slo: dict[str, float] = {}
    for item in re.split(r"[,\s]+", re.sub(r"\s*:\s*", ":", text.strip())):
        name, sep, value = item.partition(":")
        name = name.strip().lower()
        name = "e2e" if name == "e2el" else name
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"SLO item {item!r} must be METRIC:MS with METRIC one of "
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
class RequestRecord:
    """One request of a serving run, as its client saw it.

    prompt_len, output_len: tokens (over HTTP, the server's `usage` counts). metrics: seconds on
    time.perf_counter's clock; over HTTP arrival_time is when the POST was sent, token_times the
    arrivals of the chunks that carried text, and metrics.num_output_tokens the usage count.
    error: None when the request completed, else why not; a failed request is counted but left
    out of every latency and throughput figure. request_id: the engine's id for the request
    (over HTTP, the X-Request-Id the client sent), to find it in an engine trace.
    """

    prompt_len: int
    output_len: int
    metrics: RequestMetrics
    text: str = ""
    error: str | None = None
    request_id: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def of(cls, output: RequestOutput) -> RequestRecord:
        """The record of a request the engine ran in-process."""
        return cls(len(output.prompt_token_ids), len(output.token_ids), output.metrics,
                   output.text, None if output.finished else "not finished", output.request_id)

    def as_dict(self, start: float) -> dict[str, Any]:
        """Per-request figures for a result JSON: seconds, arrival counted from start."""
        m = self.metrics
        return {"request_id": self.request_id,
                "prompt_len": self.prompt_len, "output_len": self.output_len,
                "arrival_time": m.arrival_time - start, "ttft": m.ttft, "tpot": m.tpot,
                "e2el": m.e2e, "queue_time": m.queue_time, "itl": m.itl, "error": self.error}


@dataclass(frozen=True)
class ServingResult:
    """One serving run, in-process or over HTTP: per-request records and vLLM's figures.

    records: one per workload request, in workload order. start: the perf_counter time (s) the
    run began; an open-loop request i is due at start + workload[i].arrival_time. duration: the
    run's wall time (s) when the client measured it (HTTP, as vLLM does), else None: from the
    first arrival to the last finish. summary: minillm.metrics.summarize over the completed
    records; its goodput is set when slo (bounds in seconds, as parse_slo returns) is given.
    trace: the engine steps of the run (in-process, or a server in the same process); outputs:
    the engine's RequestOutputs (in-process only). source: "in-process" or the server's URL.
    """

    workload: Workload
    records: list[RequestRecord]
    start: float
    summary: Summary
    slo: dict[str, float] | None = None
    duration: float | None = None
    trace: list[StepRecord] = field(default_factory=list)
    outputs: list[RequestOutput] | None = None
    source: str = "in-process"

    @classmethod
    def build(cls, workload: Workload, records: list[RequestRecord], start: float,
              slo: dict[str, float] | None = None, duration: float | None = None,
              **extra: Any) -> ServingResult:
        """Summarize records into a result; extra sets trace, outputs, source."""
        return cls(workload, records, start, _summary(records, slo, duration), slo, duration,
                   **extra)

    @property
    def completed(self) -> list[RequestRecord]:
        return [r for r in self.records if r.ok]

    @property
    def errors(self) -> list[str]:
        return [r.error for r in self.records if r.error is not None]

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of the completed requests."""
        return sum(r.prompt_len for r in self.completed)

    @property
    def total_token_throughput(self) -> float:
        """Prompt plus output tokens per second."""
        s = self.summary
        return (self.prompt_tokens + s.output_tokens) / s.duration if s.duration > 0 else math.nan

    def values(self, metric: str) -> list[float]:
        """Seconds over the completed requests: ttft, tpot (requests of 2+ tokens), e2el, or
        itl (every gap of every request, pooled)."""
        ms = [r.metrics for r in self.completed]
        if metric == "itl":
            return [gap for m in ms for gap in m.itl]
        if metric not in ("ttft", "tpot", "e2el", "e2e"):
            raise ValueError(f"unknown metric {metric!r}; use one of {PERCENTILE_METRICS}")
        got = [m.e2e if metric in ("e2el", "e2e") else getattr(m, metric) for m in ms]
        return [x for x in got if x is not None]

    def with_slo(self, slo: dict[str, float] | None) -> ServingResult:
        """The same run judged against another SLO (seconds)."""
        return replace(self, slo=slo, summary=_summary(self.records, slo, self.duration))

    def with_trace(self, trace: list[StepRecord]) -> ServingResult:
        """The same run with the engine steps of trace that overlap it (a server in this
        process: pass llm.trace; server and client share time.perf_counter's clock)."""
        end = self.start + (self.duration if self.duration is not None else self.summary.duration)
        return replace(self, trace=[s for s in trace if s.end >= self.start and s.start <= end])

    def as_dict(self, percentiles: tuple[float, ...] = DEFAULT_PERCENTILES,
                metrics: tuple[str, ...] = PERCENTILE_METRICS) -> dict[str, Any]:
        """The figures under vLLM's result-JSON names: throughputs per second, latencies in ms
        (mean_, median_, std_ and pNN_ of each metric)."""
        s = self.summary
        figures: dict[str, Any] = {
            "completed": s.num_requests, "failed": len(self.errors), "duration": s.duration,
            "total_input_tokens": self.prompt_tokens, "total_output_tokens": s.output_tokens,
            "request_throughput": s.request_throughput, "request_goodput": s.goodput,
            "output_throughput": s.output_throughput,
            "total_token_throughput": self.total_token_throughput,
        }
        for metric in metrics:
            xs = self.values(metric)
            mean = sum(xs) / len(xs) if xs else math.nan
            std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs)) if xs else math.nan
            figures[f"mean_{metric}_ms"] = mean * 1000.0
            figures[f"median_{metric}_ms"] = percentile(xs, 50) * 1000.0
            figures[f"std_{metric}_ms"] = std * 1000.0
            for q in percentiles:
                figures[f"p{_pct(q)}_{metric}_ms"] = percentile(xs, q) * 1000.0
        return figures

    def result_json(self, percentiles: tuple[float, ...] = DEFAULT_PERCENTILES,
                    metrics: tuple[str, ...] = PERCENTILE_METRICS) -> dict[str, Any]:
        """as_dict plus vLLM's per-request lists (input_lens, output_lens, ttfts, itls,
        generated_texts, errors: seconds, "" for no error) and minillm's per-request records."""
        recs = self.records
        return {**self.as_dict(percentiles, metrics),
                "source": self.source, "workload": repr(self.workload),
                "slo_ms": {k: v * 1000.0 for k, v in (self.slo or {}).items()},
                "input_lens": [r.prompt_len for r in recs],
                "output_lens": [r.output_len if r.ok else 0 for r in recs],
                "ttfts": [r.metrics.ttft if r.ok else 0.0 for r in recs],
                "itls": [r.metrics.itl if r.ok else [] for r in recs],
                "generated_texts": [r.text for r in recs],
                "errors": [r.error or "" for r in recs],
                "records": [r.as_dict(self.start) for r in recs]}

    def save_json(self, path: str | Path, percentiles: tuple[float, ...] = DEFAULT_PERCENTILES,
                  **extra: Any) -> None:
        """Write result_json(percentiles) (plus extra keys) to path; NaN (no data) is written as
        null."""
        data = {**extra, **self.result_json(percentiles)}
        Path(path).write_text(json.dumps(json_safe(data), indent=1))

    def report(self, percentiles: tuple[float, ...] = (99.0,),
               metrics: tuple[str, ...] = PERCENTILE_METRICS) -> str:
        """The figures as vLLM's benchmark_serving prints them (Mean, Median, then P<q>)."""
        m = self.as_dict(percentiles, metrics)
        lines = [f"{' Serving Benchmark Result ':=^50}", f"{'Server:':<40}{self.source}",
                 f"{'Workload:':<40}{self.workload!r}"]
        lines += [f"{label:<40}{_fmt(m[key])}" for label, key in REPORT_ROWS.items()
                  if (key != "request_goodput" or self.slo) and (key != "failed" or m[key])]
        if self.slo:
            lines.append(f"{'Goodput SLO:':<40}{format_slo(self.slo)}")
        for metric in metrics:
            lines.append(f"{SECTIONS[metric]:-^50}")
            name = metric.upper()
            lines.append(f"{f'Mean {name} (ms):':<40}{_fmt(m[f'mean_{metric}_ms'])}")
            lines.append(f"{f'Median {name} (ms):':<40}{_fmt(m[f'median_{metric}_ms'])}")
            for q in percentiles:
                if q != 50:
                    label = f"P{_pct(q)} {name} (ms):"
                    lines.append(f"{label:<40}{_fmt(m[f'p{_pct(q)}_{metric}_ms'])}")
        if self.errors:
            lines.append(f"{'First error:':<40}{self.errors[0][:200]}")
        lines.append("=" * 50)
        return "\n".join(lines)


def _summary(records: list[RequestRecord], slo: dict[str, float] | None,
             duration: float | None) -> Summary:
    done = [r.metrics for r in records if r.ok]
    if done:
        return summarize(done, slo, duration)
    empty = Distribution.of([])  # nothing completed: every figure is nan, goodput 0
    return Summary(0, duration or 0.0, 0, empty, empty, empty, empty, 0.0 if slo else None)


def _pct(q: float) -> str:
    """99.0 -> '99', 99.9 -> '99.9': vLLM's spelling of a percentile in its keys."""
    return str(int(q)) if float(q).is_integer() else str(q)


def _fmt(value: float | int | None) -> str:
    return str(value) if isinstance(value, int) else "-" if value is None else f"{value:.2f}"


def json_safe(value: Any) -> Any:
    """value with every NaN or infinity replaced by None, so json.dumps writes strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value
