"""python -m minillm.bench servers: `minillm serve` with its engine core on a thread of the HTTP
server's process and in a process of its own, side by side over HTTP.

Each contender serves the same loads: an open loop of Poisson arrivals per rate (vLLM's
benchmark at 8 requests/s, 64 tokens in and out, by default), a closed loop of clients that
send their next request as each reply ends, and, asked for, an open loop whose prompts start
with one of a few shared prefixes (what prefix caching serves). Rounds alternate the order, so
a busy neighbour slows both alike. The report gives each contender's TTFT, TPOT and ITL at p50
and p99, its output throughput and its goodput (requests/s within the SLO), as the median over
the rounds with their range, and each later contender's ratio to the first, per round, as a
median with its spread.

The same runner compares minillm with other engines (bench peers): a contender is anything that
starts an OpenAI-compatible server (a ServerProcess), a client anything that measures one with
vLLM's result-JSON names. minillm's client (minillm.serve.client) runs in this process; each
server in a process of its own, and minillm's engine core in a third where it has one.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from minillm.bench.engine import Ratio
from minillm.calc import machine
from minillm.serve.server_process import ServerProcess
from minillm.serve.serving_result import parse_slo
from minillm.workloads.streams import Workload, closed_loop, poisson, shared_prefix

# (figure in the result JSON, its label)
FIGURES = [("median_ttft_ms", "TTFT p50 (ms)"), ("p99_ttft_ms", "TTFT p99 (ms)"),
           ("median_tpot_ms", "TPOT p50 (ms)"), ("p99_tpot_ms", "TPOT p99 (ms)"),
           ("median_itl_ms", "ITL p50 (ms)"), ("p99_itl_ms", "ITL p99 (ms)"),
           ("output_throughput", "output tokens/s"), ("request_goodput", "goodput (req/s)")]
Figures = dict[str, float]
DEFAULT_SLO = "ttft:500 tpot:50"  # ms, as vLLM's --goodput takes it


@dataclass(frozen=True)
class Load:
    """One load: the workload minillm's client sends, and how (vLLM's client draws its own
    prompts of the same lengths, at the same rate and concurrency). prefix_len > 0: each prompt
    is one of num_prefixes shared prefixes of prefix_len tokens, then input_len of its own.
    slo: the goodput's bounds, in ms."""

    name: str
    workload: Workload
    concurrency: int | None
    rate: float
    input_len: int
    output_len: int
    seed: int
    prefix_len: int = 0
    num_prefixes: int = 0
    slo: str = DEFAULT_SLO


Client = Callable[[str, Load], Figures]  # (server URL, load) -> vLLM's figures


@dataclass(frozen=True)
class Contender:
    name: str
    start: Callable[[], ServerProcess]  # a server on a free loopback port, ready


def minillm_client(url: str, load: Load) -> Figures:
    """minillm's benchmark client, after a warm-up of 8 requests of the load's shape."""
    from minillm.serve.client import benchmark  # aiohttp: not on every machine (the GPU run's)

    benchmark(url, load.workload[:8], max_concurrency=4, num_warmups=0)
    result = benchmark(url, load.workload, max_concurrency=load.concurrency, num_warmups=0,
                       slo=parse_slo(load.slo))
    if result.errors:
        raise RuntimeError(f"{len(result.errors)} requests failed on {url}: "
                           f"{result.errors[0]}")
    return result.as_dict(percentiles=(50, 99))


def loads(num_prompts: int, rate: float | Sequence[float], concurrency: int, input_len: int,
          output_len: int, seed: int, prefixes: tuple[int, int] | None = None,
          slo: str = DEFAULT_SLO) -> list[Load]:
    """An open loop per rate, then the closed loop; with prefixes (prefix_len, num_prefixes),
    then an open loop at the last rate whose prompts start with one of those prefixes."""
    rates = [rate] if isinstance(rate, (int, float)) else list(rate)
    found = [Load(f"open loop, {r:g} req/s", poisson(num_prompts, r, input_len, output_len,
                                                     seed=seed), None, r, input_len,
                  output_len, seed, slo=slo) for r in rates]
    found.append(Load(f"closed loop, {concurrency} in flight",
                      closed_loop(num_prompts, concurrency, input_len, output_len, seed=seed),
                      concurrency, float("inf"), input_len, output_len, seed, slo=slo))
    if prefixes is not None:
        prefix_len, num_prefixes = prefixes
        found.append(Load(
            f"shared prefixes, {rates[-1]:g} req/s: {num_prefixes} of {prefix_len} tokens",
            shared_prefix(num_prompts, rates[-1], prefix_len, num_prefixes, input_len,
                          output_len, seed=seed),
            None, rates[-1], input_len, output_len, seed, prefix_len, num_prefixes, slo))
    return found


def effective_rate(workload: Workload) -> float:
    """Requests over the span of their arrivals: what a seeded Poisson draw really offered."""
    span = workload[-1].arrival_time - workload[0].arrival_time
    return (len(workload) - 1) / span if span > 0 else float("inf")


Results = list[dict[tuple[str, str], dict[str, Figures]]]  # [round][contender, client][load]


def compare(rounds: int, runs: Sequence[Load], contenders: Sequence[Contender],
            clients: dict[str, Client], keep_up: bool = False, progress: bool = True) -> Results:
    """rounds x every contender, alternating which goes first; each client measures each load
    on each. keep_up: start each server once and keep it for every round (a server whose
    start takes minutes), else a fresh server per round."""
    results: Results = []
    with ExitStack() as servers:
        up = {c.name: servers.enter_context(c.start()) for c in contenders} if keep_up else {}
        for r in range(rounds):
            order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
            results.append({})
            for contender in order:
                if progress:
                    print(f"round {r + 1}/{rounds}: {contender.name} ...", flush=True)
                with ExitStack() as fresh:
                    server = up.get(contender.name) or fresh.enter_context(contender.start())
                    for client_name, client in clients.items():
                        results[-1][contender.name, client_name] = {
                            load.name: client(server.url, load) for load in runs}
    return results


def report(results: Results, loads_: Sequence[str]) -> str:
    """A table per load: each (contender, client) column's median and range over the rounds,
    then each later contender's ratio to the first, per client."""
    columns = list(results[0])
    first = columns[0][0]
    lines = []
    for load in loads_:
        lines.append(f"\n{load}:")
        lines.append(f"  {'':18s}" + "".join(f"{_label(c):>30s}" for c in columns))
        for key, label in FIGURES:
            cells = []
            for column in columns:
                values = [r[column][load][key] for r in results]
                cells.append(f"{statistics.median(values):.1f} ({min(values):.1f}-"
                             f"{max(values):.1f})")
            lines.append(f"  {label:18s}" + "".join(f"{cell:>30s}" for cell in cells))
        for column in columns:
            if column[0] == first:
                continue
            base = (first, column[1])
            lines.append(f"  {column[0]} / {first}" + (f" ({column[1]}'s client)"
                                                      if len({c[1] for c in columns}) > 1
                                                      else "") + ":")
            for key, label in FIGURES:
                ratio = Ratio(tuple(r[column][load][key] / r[base][load][key]
                                    for r in results))
                lines.append(f"    {label:18s}{ratio}")
    return "\n".join(lines)


def _label(column: tuple[str, str]) -> str:
    contender, client = column
    return contender if client == "minillm" else f"{contender} ({client} client)"


DESIGNS = {"thread": ["--no-engine-core-process"], "own process": ["--engine-core-process"]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--rounds", type=int, default=2, help="times each contender serves both loads, "
        "alternating which goes first")
    add("--num-prompts", type=int, default=100)
    add("--request-rate", type=float, nargs="+", default=[8.0],
        help="the open loops' rates (requests/s), one load each")
    add("--max-concurrency", type=int, default=16, help="the closed loop's clients")
    add("--input-len", type=int, default=64)
    add("--output-len", type=int, default=64)
    add("--seed", type=int, default=0)
    add("--shared-prefix", type=int, nargs=2, metavar=("PREFIX_LEN", "NUM_PREFIXES"),
        help="also an open loop at the last rate whose prompts start with one of NUM_PREFIXES "
             "prefixes of PREFIX_LEN tokens, --input-len of their own after it")
    add("--goodput", default=DEFAULT_SLO, help="the SLO goodput counts, in ms (vLLM's "
        f"--goodput form; default {DEFAULT_SLO!r})")
    add("--server-args", nargs=argparse.REMAINDER, default=[],
        help="flags for both servers, e.g. --server-args --max-num-seqs 32 (last on the line)")


def describe(args: argparse.Namespace, runs: Sequence[Load], what: str) -> None:
    print(f"{what}   ({machine.describe()})")
    print(f"{args.num_prompts} requests a load, {args.input_len} tokens in, {args.output_len} "
          f"out (ignore_eos, greedy); goodput within {args.goodput} (ms)")
    for load in runs:
        if load.concurrency is None:
            print(f"  {load.name}: minillm's client's seeded draw offers "
                  f"{effective_rate(load.workload):.2f} req/s")


def main(args: argparse.Namespace) -> dict[str, Any]:
    runs = loads(args.num_prompts, args.request_rate, args.max_concurrency, args.input_len,
                 args.output_len, args.seed, args.shared_prefix, args.goodput)
    describe(args, runs, "minillm serve, the engine core on a thread vs in its own process")
    contenders = [Contender(name, lambda flags=flags: ServerProcess(
        [*flags, "--log-level", "warning", *args.server_args])) for name, flags in DESIGNS.items()]
    results = compare(args.rounds, runs, contenders, {"minillm": minillm_client})
    print(report(results, [load.name for load in runs]))
    return {"rounds": results}
