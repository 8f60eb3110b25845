"""python -m minillm.bench servers: `minillm serve` with its engine core on a thread of the HTTP
server's process and in a process of its own, side by side over HTTP.

Each design serves the same two loads in turn, in a fresh server: an open loop of Poisson
arrivals (vLLM's benchmark at 8 requests/s, 64 tokens in and out, by default) and a closed loop
of clients that send their next request as each reply ends. Rounds alternate the order, so a
busy neighbour slows both alike. The report gives each design's TTFT, TPOT and ITL at p50 and
p99 and its output throughput, as the median over the rounds with their range, and the own
process's ratio to the thread, per round, as a median with its spread.

The client is minillm's (minillm.serve.client, vLLM's definitions), in this process; each
server is `python -m minillm.serve` in a process of its own (ServerProcess), its engine core in
a third where it has one.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from typing import Any

from minillm.bench.engine import Ratio
from minillm.calc import machine
from minillm.serve.server_process import ServerProcess
from minillm.workloads.streams import Workload, closed_loop, poisson

DESIGNS = {"thread": ["--no-engine-core-process"], "own process": ["--engine-core-process"]}
# (figure in the result JSON, its label, whether lower is better)
FIGURES = [("median_ttft_ms", "TTFT p50 (ms)", True), ("p99_ttft_ms", "TTFT p99 (ms)", True),
           ("median_tpot_ms", "TPOT p50 (ms)", True), ("p99_tpot_ms", "TPOT p99 (ms)", True),
           ("median_itl_ms", "ITL p50 (ms)", True), ("p99_itl_ms", "ITL p99 (ms)", True),
           ("output_throughput", "output tokens/s", False)]
Figures = dict[str, float]


def loads(num_prompts: int, rate: float, concurrency: int, input_len: int, output_len: int,
          seed: int) -> dict[str, tuple[Workload, int | None]]:
    """The open and the closed loop, each with its concurrency bound."""
    return {f"open loop, {rate:g} req/s": (
                poisson(num_prompts, rate, input_len, output_len, seed=seed), None),
            f"closed loop, {concurrency} in flight": (
                closed_loop(num_prompts, concurrency, input_len, output_len, seed=seed),
                concurrency)}


def effective_rate(workload: Workload) -> float:
    """Requests over the span of their arrivals: what a seeded Poisson draw really offered."""
    span = workload[-1].arrival_time - workload[0].arrival_time
    return (len(workload) - 1) / span if span > 0 else float("inf")


def serve_once(flags: Sequence[str], runs: dict[str, tuple[Workload, int | None]],
               server_args: Sequence[str]) -> dict[str, Figures]:
    """Start a server with flags, warm it up, run each load on it; vLLM's figures per load."""
    from minillm.serve.client import benchmark  # aiohttp: not on every machine (the GPU run's)

    with ServerProcess([*flags, "--log-level", "warning", *server_args]) as server:
        warm, _ = next(iter(runs.values()))
        benchmark(server.url, warm[:8], max_concurrency=4, num_warmups=0)
        figures = {}
        for name, (workload, concurrency) in runs.items():
            result = benchmark(server.url, workload, max_concurrency=concurrency, num_warmups=0)
            if result.errors:
                raise RuntimeError(f"{len(result.errors)} requests failed on {server.url}: "
                                   f"{result.errors[0]}")
            figures[name] = result.as_dict(percentiles=(50, 99))
        return figures


def compare(rounds: int, runs: dict[str, tuple[Workload, int | None]],
            server_args: Sequence[str] = (), progress: bool = True
            ) -> list[dict[str, dict[str, Figures]]]:
    """rounds x both designs, alternating which goes first: [round][design][load] -> figures."""
    results = []
    for r in range(rounds):
        order = list(DESIGNS) if r % 2 == 0 else list(reversed(DESIGNS))
        results.append({})
        for design in order:
            if progress:
                print(f"round {r + 1}/{rounds}: the engine core's {design} ...", flush=True)
            results[-1][design] = serve_once(DESIGNS[design], runs, server_args)
    return results


def report(results: list[dict[str, dict[str, Figures]]],
           runs: dict[str, tuple[Workload, int | None]]) -> str:
    lines = []
    first, second = DESIGNS
    for load in runs:
        lines.append(f"\n{load}:")
        lines.append(f"  {'':18s}{first:>22s}{second:>22s}   {second} / {first}")
        for key, label, _ in FIGURES:
            cells = []
            for design in DESIGNS:
                values = [r[design][load][key] for r in results]
                cells.append(f"{statistics.median(values):8.1f} ({min(values):.1f}-"
                             f"{max(values):.1f})")
            ratio = Ratio(tuple(r[second][load][key] / r[first][load][key] for r in results))
            lines.append(f"  {label:18s}{cells[0]:>22s}{cells[1]:>22s}   {ratio}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--rounds", type=int, default=2, help="times each design serves both loads, alternating")
    add("--num-prompts", type=int, default=100)
    add("--request-rate", type=float, default=8.0, help="the open loop's rate (requests/s)")
    add("--max-concurrency", type=int, default=16, help="the closed loop's clients")
    add("--input-len", type=int, default=64)
    add("--output-len", type=int, default=64)
    add("--seed", type=int, default=0)
    add("--server-args", nargs=argparse.REMAINDER, default=[],
        help="flags for both servers, e.g. --server-args --max-num-seqs 32 (last on the line)")


def main(args: argparse.Namespace) -> dict[str, Any]:
    runs = loads(args.num_prompts, args.request_rate, args.max_concurrency, args.input_len,
                 args.output_len, args.seed)
    print(f"minillm serve, the engine core on a thread vs in its own process   "
          f"({machine.describe()})")
    open_name, (open_load, _) = next(iter(runs.items()))
    print(f"{open_name}: {args.num_prompts} requests of {args.input_len} tokens in, "
          f"{args.output_len} out (ignore_eos); the seeded draw's effective rate "
          f"{effective_rate(open_load):.2f} req/s")
    results = compare(args.rounds, runs, args.server_args)
    print(report(results, runs))
    return {"rounds": results}
