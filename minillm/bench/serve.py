"""python -m minillm.bench serve: serving runs at increasing rates, the goodput curve and its knee.

Each rate replays a workload against the real engine in real time (minillm.serving); the knee
is the offered rate past which goodput stops rising.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from minillm.llm import LLM, default_model_path
from minillm.serving import (
    TABLE_COLUMNS,
    ServingResult,
    format_slo,
    parse_slo,
    run_serving,
    warm_up,
)
from minillm.workload import Length, Workload, closed_loop, poisson, shared_prefix

if TYPE_CHECKING:
    from matplotlib.figure import Figure


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
