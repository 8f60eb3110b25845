"""The goodput curve: serving runs at increasing offered rates, and the knee past which goodput
stops rising (python -m minillm.bench serve --sweep-rates runs it; chapter 07 draws one).

Each rate is one ServingResult, replayed in-process on an LLM (minillm.serve.serving) or measured
over HTTP on any OpenAI-compatible server (minillm.serve.client); goodput is judged against one
SLO for all of them.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from minillm.llm import LLM
from minillm.serve.serving import TABLE_COLUMNS, ServingResult, format_slo, run_serving, warm_up
from minillm.workloads.streams import Workload

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


def sweep(target: LLM | str, rates: Sequence[float], make_workload: Callable[[float], Workload],
          slo: dict[str, float], progress: bool = True, **client_args: Any) -> SweepResult:
    """Run make_workload(rate) for each rate (ascending) and collect the goodput curve.

    target: an LLM (replayed in-process) or a server's base URL (measured over HTTP by
    minillm.serve.client.benchmark with client_args); one warm-up before the first rate.
    """
    if not slo:
        raise ValueError("sweep needs an SLO, e.g. parse_slo('ttft:500,tpot:50'): goodput and "
                         "its knee are defined against one")
    if not rates or not all(isinstance(r, (int, float)) and 0 < r < math.inf for r in rates):
        raise ValueError(f"rates must be finite positive requests/s, got {list(rates)!r}")
    rates = sorted(rates)
    if isinstance(target, LLM):
        warm_up(target)
    results = []
    for k, rate in enumerate(tqdm(rates, desc="rates", unit="rate", disable=not progress)):
        if isinstance(target, LLM):
            results.append(run_serving(target, make_workload(rate), slo, warmup=False))
        else:
            from minillm.serve.client import benchmark

            warmups = client_args.get("num_warmups", 2) if k == 0 else 0
            results.append(benchmark(target, make_workload(rate), slo=slo,
                                     **{**client_args, "num_warmups": warmups}))
    return SweepResult(list(rates), results, slo)
