"""Serving at GPU scale in simulation, and how well the simulator's cost model fits this CPU.

The simulator (minillm.simulator) runs the engine's own scheduler and KV block manager on a
virtual clock that the roofline cost model advances, so every figure in (a)-(c) is *modelled*:

(a) 5,000 requests of Llama-3-8B on an H100 near saturation: how long the simulation takes to
    run here, and the serving summary it models.
(b) continuous vs static batching on a heavy-tailed spread of output lengths (Orca, vLLM).
(c) goodput under an SLO against the offered rate: it rises, peaks at the knee, and collapses
    once queueing breaks the TTFT bound (DistServe).
(d) calibration, *measured on this machine*, at both levels: the real engine serves a small
    open-loop workload here; the roofline with this CPU's measured peaks and four overheads
    (per step, per new token, per request in the step, per attention pair) fitted on the
    even-numbered steps predicts each odd-numbered (held-out) step's time from that step's own
    scheduled entries; then the simulator serves the same workload with those overheads and
    its TTFT and TPOT (p50, p99) are set beside the real run's. Both on the wall clock and on
    the engine thread's CPU clock (minillm.calibration).
(e) the request-level check of (d) again at the engine's defaults (64 seats, a 2,048-token
    budget: every request of the workload runs at once), on more requests, since a p50 of
    requests whose few decodes may or may not share a step with a long prefill needs them.
"""

from __future__ import annotations

import argparse
import math

import torch

from minillm.calc import roofline
from minillm.llm import LLM
from minillm.metrics import Summary
from minillm.plan.calibration import PHASES, CalibrationReport, calibrate
from minillm.sim.simulator import goodput_curve, knee, simulate
from minillm.workloads import streams as workload

SLO = {"ttft": 0.5, "tpot": 0.05}  # seconds
PROMPT_LEN, OUTPUT_LEN = (128, 1024), (32, 512)  # tokens, uniform
HEAVY_TAILED = workload.Mixture([(0.85, (16, 128)), (0.15, (512, 1024))])  # output tokens


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--hardware", default="H100-SXM")
    parser.add_argument("--num-requests", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=50.0,
                        help="requests/s of (a); ~50 is near saturation for the defaults")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--static-requests", type=int, default=1000)
    parser.add_argument("--sweep-requests", type=int, default=800)
    parser.add_argument("--rates", default="10,20,30,40,50,60,70,85,100")
    parser.add_argument("--calibration-requests", type=int, default=40)
    parser.add_argument("--defaults-requests", type=int, default=100,
                        help="requests of (e), the calibration at the engine's defaults")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for (d); 1 keeps timings steady on a shared CPU")
    parser.add_argument("--seed", type=int, default=0)


def _engine_kwargs(args: argparse.Namespace) -> dict[str, object]:
    return dict(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                record_block_tables=False)


def _latency(s: Summary) -> str:
    return (f"TTFT p50 {s.ttft.p50 * 1e3:.0f} ms, p99 {s.ttft.p99 * 1e3:.0f} ms; "
            f"TPOT p50 {s.tpot.p50 * 1e3:.1f} ms, p99 {s.tpot.p99 * 1e3:.1f} ms")


def _label(metric: str) -> str:
    """'tpot p99' -> 'TPOT p99'."""
    name, quantile = metric.split()
    return f"{name.upper()} {quantile}"


def at_scale(args: argparse.Namespace) -> dict[str, float]:
    """(a): the big simulation, its wall time here and its modelled summary."""
    work = workload.poisson(args.num_requests, args.rate, PROMPT_LEN, OUTPUT_LEN, args.seed)
    sim = simulate(args.model, args.hardware, work, **_engine_kwargs(args))
    s = sim.summary(SLO)
    print(f"(a) {work!r}\n    {args.model} on {args.hardware}, max_num_seqs "
          f"{args.max_num_seqs}, max_num_batched_tokens {args.max_num_batched_tokens}, "
          f"{sim.stats['num_blocks']} KV blocks")
    print(f"    simulated {len(sim.trace)} steps, {s.duration:.1f} s of serving, in "
          f"{sim.wall_time:.2f} s of wall time here (measured)")
    print(f"    modelled: {s.request_throughput:.1f} req/s, {s.output_throughput:.0f} output "
          f"tok/s; {_latency(s)}; {sim.stats['num_preemptions']} preemptions")
    return {"wall_time": sim.wall_time, "output_throughput": s.output_throughput}


def static_vs_continuous(args: argparse.Namespace) -> dict[str, float]:
    """(b): the same requests, all queued at once, under both scheduling policies."""
    work = workload.poisson(args.static_requests, math.inf, (64, 512), HEAVY_TAILED, args.seed)
    print(f"\n(b) {work!r}: 85% of outputs 16-128 tokens, 15% 512-1024; modelled")
    print(f"    {'max_num_seqs':>12}{'continuous tok/s':>18}{'static tok/s':>14}{'ratio':>8}")
    ratios = {}
    for seats in sorted({64, args.max_num_seqs}):
        kwargs = dict(_engine_kwargs(args), max_num_seqs=seats)
        tput = {policy: simulate(args.model, args.hardware, work, scheduling=policy,
                                 **kwargs).summary().output_throughput
                for policy in ("continuous", "static")}
        ratios[f"continuous / static at {seats} seqs"] = ratio = (
            tput["continuous"] / tput["static"])
        print(f"    {seats:>12}{tput['continuous']:>18.0f}{tput['static']:>14.0f}"
              f"{ratio:>7.2f}x")
    return ratios


def goodput_knee(args: argparse.Namespace) -> dict[str, float]:
    """(c): goodput under SLO against the Poisson rate, and the knee."""
    rates = [float(r) for r in args.rates.split(",")]

    def make(rate: float) -> workload.Workload:
        return workload.poisson(args.sweep_requests, rate, PROMPT_LEN, OUTPUT_LEN, args.seed)

    curve = goodput_curve(args.model, args.hardware, rates, SLO, make, **_engine_kwargs(args))
    print(f"\n(c) goodput under SLO ttft <= {SLO['ttft'] * 1e3:.0f} ms, tpot <= "
          f"{SLO['tpot'] * 1e3:.0f} ms; {args.sweep_requests} requests a rate; modelled")
    print(f"    {'rate':>6}{'req/s':>8}{'goodput':>9}{'TTFT p50':>10}{'TTFT p99':>10}"
          f"{'TPOT p99':>10}")
    for rate, s in curve:
        print(f"    {rate:>6.0f}{s.request_throughput:>8.1f}{s.goodput:>9.1f}"
              f"{s.ttft.p50 * 1e3:>8.0f}ms{s.ttft.p99 * 1e3:>8.0f}ms{s.tpot.p99 * 1e3:>8.1f}ms")
    best = knee(curve)
    peak = max(s.goodput or 0.0 for _, s in curve)
    last = curve[-1][1].goodput or 0.0
    print(f"    knee at {best:.0f} req/s: goodput {peak:.1f} req/s; at {rates[-1]:.0f} req/s it "
          f"falls to {last:.1f} req/s")
    return {"knee": best, "peak_goodput": peak, "goodput_at_max_rate": last}


def calibration(args: argparse.Namespace) -> dict[str, float]:
    """(d): the cost model against the real engine on this CPU, step by step and request by
    request."""
    torch.set_num_threads(args.threads)
    llm = LLM(device="cpu", dtype="float32", max_num_seqs=8, max_num_batched_tokens=256)
    hw = roofline.measure_machine()
    # Long prompts in 256-token chunks and short answers: many prefill and mixed steps.
    work = workload.poisson(args.calibration_requests, 4.0, (64, 1024), (8, 32), args.seed)
    clocks = ("wall", "cpu") if args.threads == 1 else ("wall",)
    reports = {clock: calibrate(llm, work, hw=hw, clock=clock) for clock in clocks}
    print(f"\n(d) calibration on {hw.name}, measured: {hw.flops / 1e9:.0f} GFLOP/s, "
          f"{hw.bandwidth / 1e9:.1f} GB/s, {torch.get_num_threads()} thread(s); shipped model, "
          f"float32; {work!r}, one run per clock")
    print("    overheads fitted on the even steps: per step, per new token, per request in the "
          "step, per attention pair")
    for clock, report in reports.items():
        print(f"    {clock:<5} {report.overhead * 1e3:.2f} ms, "
              f"{report.overhead_per_token * 1e6:.1f} us, {report.overhead_per_seq * 1e3:.2f} ms, "
              f"{report.overhead_per_pair * 1e9:.0f} ns")
    print("    steps: median |error| (median signed error) on the odd (held-out) steps")
    print(f"    {'clock':<6}" + "".join(f"{phase + ' (n)':>22}" for phase in PHASES))
    results = {}
    for clock, report in reports.items():
        cells = [f"{report.median_error[p]:>9.1%} ({report.median_bias[p]:+6.1%}) "
                 f"({report.num_steps[p]:>3})" for p in PHASES]
        print(f"    {clock:<6}" + "".join(cells))
        results |= {f"{clock} {p}": report.median_error[p] for p in PHASES}
    steps_met = all(reports["wall"].median_error[p] < 0.25 for p in PHASES
                    if reports["wall"].num_steps[p])
    print(f"    target: median step error < 25% in every phase (wall clock): "
          f"{'met' if steps_met else 'not met'}")
    return results | _request_level(reports)


def _request_level(reports: dict[str, CalibrationReport]) -> dict[str, float]:
    """Print the real and simulated runs' TTFT and TPOT side by side; returns the ratios."""
    results = {}
    print("    requests: real run vs simulated run of the same workload (ms), simulated / real")
    print(f"    {'clock':<6}" + "".join(f"{_label(c.metric):>22}"
                                     for c in reports["wall"].requests))
    for clock, report in reports.items():
        print(f"    {clock:<6}" + "".join(
            f"{c.real * 1e3:>7.1f} vs {c.simulated * 1e3:>6.1f} {c.ratio:>4.2f}"
            for c in report.requests))
        results |= {f"{clock} {c.metric}": c.ratio for c in report.requests}
    requests_met = {clock: r.worst_request_error() < 0.25 for clock, r in reports.items()}
    print("    target: TTFT and TPOT p50/p99 within 25% of the real run: " + ", ".join(
        f"{clock} {'met' if met else 'not met'}" for clock, met in requests_met.items()))
    print("    (the wall clock includes other jobs on this CPU; the cpu clock runs the engine on "
          "its thread's CPU time)")
    for clock, report in reports.items():
        for name, s in (("real", report.real_summary), ("simulated", report.simulated_summary)):
            print(f"    {clock:<5}{name:>10} run: {s.duration:.2f} s, "
                  f"{s.output_throughput:.0f} tok/s; {_latency(s)}")
    return results


def at_engine_defaults(args: argparse.Namespace) -> dict[str, float]:
    """(e): (d)'s request-level check with the engine's default seats and token budget."""
    torch.set_num_threads(args.threads)
    llm = LLM(device="cpu", dtype="float32")
    hw = roofline.measure_machine()
    work = workload.poisson(args.defaults_requests, 4.0, (64, 1024), (8, 32), args.seed)
    clocks = ("wall", "cpu") if args.threads == 1 else ("wall",)
    c = llm.config
    print(f"\n(e) at the engine's defaults, measured: max_num_seqs {c.max_num_seqs}, "
          f"max_num_batched_tokens {c.max_num_batched_tokens}; {work!r}, one run per clock")
    reports = {clock: calibrate(llm, work, hw=hw, clock=clock) for clock in clocks}
    return {f"defaults {name}": ratio
            for name, ratio in _request_level(reports).items()}


def main(args: argparse.Namespace) -> dict[str, float]:
    """Run (a)-(e); returns the headline figures by name."""
    results: dict[str, float] = {}
    for part in (at_scale, static_vs_continuous, goodput_knee, calibration, at_engine_defaults):
        results |= part(args)
    return results
