"""Serving benchmark: replay a workload against the real engine in real time; report like vLLM.

An open-loop workload is replayed on the wall clock: a request enters the engine once its
arrival time has passed, and its TTFT counts from that arrival time, so time spent waiting for
a busy step is queueing the client really sees. A closed loop keeps `concurrency` requests in
flight and sends the next one the moment one finishes. Outputs have exact lengths
(temperature 0, ignore_eos), and the figures are those of vLLM's serving benchmark: request and
token throughput, TTFT, TPOT, ITL and E2E percentiles, and goodput under an SLO. A rate sweep
finds the knee: the offered rate past which goodput stops rising.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from minillm.llm import LLM, default_model_path
from minillm.metrics import Distribution, Summary, summarize
from minillm.request import RequestOutput
from minillm.sampling import SamplingParams
from minillm.trace import StepRecord
from minillm.workload import Length, Workload, closed_loop, poisson, shared_prefix

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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


@dataclass(frozen=True)
class SweepResult:
    """Serving runs at increasing offered rates (requests/s), judged against one SLO."""

    rates: list[float]
    results: list[ServingResult]
    slo: dict[str, float]

    @property
    def goodput(self) -> list[float]:
        """Requests/s that met the SLO, one per rate."""
        return [r.summary.goodput or 0.0 for r in self.results]

    @property
    def knee(self) -> float:
        """The rate of maximum goodput (the lowest such rate on ties): below it goodput rises
        with load; past it queueing breaks the SLO, so goodput stays flat or falls."""
        best = max(self.goodput)
        return next(rate for rate, g in zip(self.rates, self.goodput) if g == best)

    def table(self) -> str:
        """One row per rate: throughput, latency percentiles (ms) and goodput, side by side."""
        rows = [f"{'rate':>7}{'req/s':>8}{'tok/s':>8}"
                + "".join(f"{name:>10}" for name in TABLE_COLUMNS) + f"{'goodput':>9}"]
        for rate, r in zip(self.rates, self.results):
            m = r.as_dict()
            rows.append(f"{rate:>7g}{m['request_throughput']:>8.2f}{m['output_throughput']:>8.1f}"
                        + "".join(f"{m[key]:>10.1f}" for key in TABLE_COLUMNS.values())
                        + f"{r.summary.goodput or 0.0:>9.2f}")
        rows.append(f"knee: goodput peaks at {max(self.goodput):.2f} req/s at an offered rate of "
                    f"{self.knee:g} req/s [SLO {format_slo(self.slo)}]")
        if self.knee == self.rates[-1]:
            rows.append("the highest rate tried has the most goodput: try higher ones for the knee")
        return "\n".join(rows)

    def plot(self, path: str | Path | None = None) -> Figure | None:
        """Goodput and throughput against the offered rate, knee marked; saved to path if given.

        Returns None (with a message) when matplotlib is not installed.
        """
        try:
            from matplotlib.figure import Figure
        except ImportError:
            print("matplotlib is not installed: skipping the plot (pip install matplotlib)",
                  file=sys.stderr)
            return None
        fig = Figure(figsize=(6, 4), layout="constrained")
        ax = fig.add_subplot()
        ax.plot(self.rates, [r.summary.request_throughput for r in self.results], "o-",
                label="throughput")
        ax.plot(self.rates, self.goodput, "s-", label=f"goodput ({format_slo(self.slo)})")
        ax.axvline(self.knee, color="gray", linestyle="--", label=f"knee: {self.knee:g} req/s")
        ax.set_xscale("log", base=2)  # sweeps double the rate: equal steps on the axis
        ax.set_xticks(self.rates, labels=[f"{r:g}" for r in self.rates])
        ax.set(xlabel="offered rate (requests/s)", ylabel="requests/s",
               title="Goodput vs offered load (measured on this machine)")
        ax.legend()
        if path is not None:
            fig.savefig(path)
        return fig


def sweep(llm: LLM, rates: Sequence[float], make_workload: Callable[[float], Workload],
          slo: dict[str, float], progress: bool = True) -> SweepResult:
    """Run make_workload(rate) for each rate (ascending) and collect the goodput curve."""
    if not slo:
        raise ValueError("sweep needs an SLO, e.g. parse_slo('ttft:500,tpot:50'): goodput and "
                         "its knee are defined against one")
    if not rates or not all(isinstance(r, (int, float)) and 0 < r < math.inf for r in rates):
        raise ValueError(f"rates must be finite positive requests/s, got {list(rates)!r}")
    rates = sorted(rates)
    warm_up(llm)
    results = [run_serving(llm, make_workload(rate), slo, warmup=False)
               for rate in tqdm(rates, desc="rates", unit="rate", disable=not progress)]
    return SweepResult(list(rates), results, slo)


# ---- command line -----------------------------------------------------------------------------

def _parse_length(text: str) -> Length:
    """'32' -> 32 tokens; '16:64' -> (16, 64), uniform."""
    lo, sep, hi = text.partition(":")
    try:
        return (int(lo), int(hi)) if sep else int(lo)
    except ValueError:
        raise ValueError(f"a length is N or LO:HI tokens, got {text!r}") from None


def _parse_rates(text: str) -> list[float]:
    try:
        return [float(r) for r in text.split(",")]
    except ValueError:
        raise ValueError(f"rates are requests/s like 1,2,4, got {text!r}") from None


def _arg(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """parse as an argparse type whose error message reaches the user."""
    def parse_arg(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse_arg


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--num-requests", type=int, default=40)
    parser.add_argument("--rates", type=_arg(_parse_rates), default=[4.0, 16.0, 64.0],
                        help="offered rates in requests/s, e.g. 1,2,4,8 (open loop, Poisson)")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="run a closed loop with this many requests in flight instead")
    length = _arg(_parse_length)
    parser.add_argument("--prompt-len", type=length, default=(16, 64), help="tokens: N or LO:HI")
    parser.add_argument("--output-len", type=length, default=(8, 32), help="tokens: N or LO:HI")
    parser.add_argument("--prefix-len", type=int, default=0,
                        help="share a system prompt this long (with --num-prefixes of them)")
    parser.add_argument("--num-prefixes", type=int, default=1)
    parser.add_argument("--enable-prefix-caching", action="store_true")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--slo", type=_arg(parse_slo), default=parse_slo("ttft:500,tpot:50"),
                        help="bounds in ms, e.g. ttft:500,tpot:50 (also itl, e2e)")
    parser.add_argument("--plot", type=Path, default=None, help="save the goodput curve here")
    parser.add_argument("--seed", type=int, default=0)


def main(args: argparse.Namespace) -> int:
    llm = LLM(args.model, max_num_seqs=args.max_num_seqs,
              enable_prefix_caching=args.enable_prefix_caching)
    print(f"model {args.model.name} on {llm.engine.device} ({torch.get_num_threads()} threads), "
          f"max_num_seqs {args.max_num_seqs}, "
          f"prefix caching {'on' if args.enable_prefix_caching else 'off'}")

    def make_workload(rate: float) -> Workload:
        if args.prefix_len:
            return shared_prefix(args.num_requests, rate, args.prefix_len, args.num_prefixes,
                                 args.prompt_len, args.output_len, args.seed)
        return poisson(args.num_requests, rate, args.prompt_len, args.output_len, args.seed)

    if args.concurrency is not None or len(args.rates) == 1:
        workload = make_workload(args.rates[0]) if args.concurrency is None else closed_loop(
            args.num_requests, args.concurrency, args.prompt_len, args.output_len, args.seed)
        print(run_serving(llm, workload, args.slo).report())
        if args.plot is not None:
            print("--plot draws a rate sweep: give two or more --rates", file=sys.stderr)
        return 0
    result = sweep(llm, args.rates, make_workload, args.slo)
    print(result.table())
    if args.plot is not None and result.plot(args.plot) is not None:
        print(f"goodput curve saved to {args.plot}")
    return 0
