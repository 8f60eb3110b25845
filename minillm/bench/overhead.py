"""Where a step's time goes: the engine's loop timed phase by phase, at several batch sizes.

A step of the shipped model on a CPU is mostly host work: the model's FLOPs at 16 sequences take
a fraction of a millisecond, the step several. This benchmark shows which part of the host's
work it is. Every phase of the loop is one method (Engine, its ModelRunner, its Scheduler), so
the benchmark wraps those methods on the instance with a timer and runs a fixed workload
(`seats` requests of 64 prompt tokens and 64 output tokens, greedy, ignore_eos) through
LLM.generate. A phase's time is exclusive: the time inside its method less the time of the
phases it calls, so the phases add up to the whole generate call, and "other step bookkeeping"
is run_step's own code (appending tokens, finishing requests). The timer costs two clock reads a
call, about 0.2 us: noise beside a phase.

Next to the phases it prints a floor for the forward: the ATen operators one forward dispatches
(counted with a TorchDispatchMode) times what one tiny operator costs to dispatch here
(measured). Below that the forward cannot go at any batch size without fewer operators (fused
kernels, or a CUDA graph on a GPU), which is why batch 1 and batch 16 steps cost nearly the same.

On a GPU the kernels run asynchronously, so the forward's phase shows only the launches: the
device's time lands in the phase that waits for it ("read back tokens"). That
wait is what asynchronous scheduling overlaps with the host's work, and the benchmark measures
the asynchronous loop beside the synchronous one, the same requests interleaved round by round:
step times, its speedup, and bench engine's continuous/static and continuous/transformers
ratios with each loop.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from minillm.bench.engine import (
    Ratio,
    heavy_tailed_workload,
    interleaved_rounds,
    minillm_contender,
    speedup,
    transformers_contender,
)
from minillm.calc import machine
from minillm.llm import LLM, default_model_path
from minillm.model_config import ModelConfig
from minillm.sampling import SamplingParams

# (phase, where its method lives on the LLM, the method): in the order a step runs them.
PHASES = [
    ("schedule", "engine.scheduler", "schedule"),
    ("move blocks", "engine", "move_blocks"),
    ("prepare batch", "engine.runner", "prepare"),
    ("forward", "engine.runner", "forward"),
    ("lm head", "engine.runner", "logits"),
    ("sample", "engine", "_sample"),
    ("read back tokens", "engine", "read"),
    ("advance", "engine", "_advance"),
    ("detokenize + stops", "engine", "stops"),
    ("trace record", "engine", "_record"),
    ("other step bookkeeping", "engine", "run_step"),
    ("request outputs", "engine", "step"),
    ("generate loop", "", "generate"),
]
# The rest is the host's bookkeeping around the model. On a GPU the model's time is mostly in
# "read back tokens" (the host waiting for the device), which is why it counts as the model's.
MODEL_PHASES = {"forward", "lm head", "read back tokens"}


class PhaseTimer:
    """Exclusive seconds and calls per phase, for methods wrapped on their instances."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()
        self._inner: list[float] = []  # per open call: the time of the phases it called

    def wrap(self, owner: object, method: str, phase: str) -> None:
        fn = getattr(owner, method)

        def timed(*args, **kwargs):
            self._inner.append(0.0)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                self.seconds[phase] += elapsed - self._inner.pop()
                self.calls[phase] += 1
                if self._inner:
                    self._inner[-1] += elapsed

        setattr(owner, method, timed)  # the instance's attribute shadows the class's method


def owner(llm: LLM, path: str) -> object:
    """The object at a dotted path under llm ("" is llm)."""
    obj: object = llm
    for name in filter(None, path.split(".")):
        obj = getattr(obj, name)
    return obj


def instrument(llm: LLM) -> PhaseTimer:
    timer = PhaseTimer()
    for phase, path, method in PHASES:
        timer.wrap(owner(llm, path), method, phase)
    return timer


def workload(seats: int, vocab_size: int, prompt_len: int, output_len: int, seed: int
             ) -> tuple[list[list[int]], SamplingParams]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, vocab_size) for _ in range(prompt_len)] for _ in range(seats)]
    return prompts, SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)


def run_once(llm: LLM, seats: int, prompt_len: int, output_len: int, seed: int
             ) -> dict[str, float]:
    """Milliseconds per step of each phase over one generate; "steps" and "tokens/s" too."""
    timer = instrument(llm)
    prompts, params = workload(seats, llm.engine.model.config.vocab_size, prompt_len,
                               output_len, seed)
    try:
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
    finally:
        for _, path, method in PHASES:  # back to the class's methods
            del owner(llm, path).__dict__[method]
    assert all(len(o.token_ids) == output_len for o in outs)
    steps = timer.calls["other step bookkeeping"]
    figures = {phase: 1e3 * timer.seconds[phase] / steps for phase, _, _ in PHASES}
    figures |= {"steps": steps, "step ms": 1e3 * wall / steps,
                "tokens/s": seats * output_len / wall}
    return figures


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def ops_per_forward(llm: LLM) -> int:
    """ATen operators one decode forward of one sequence dispatches."""
    runner, counted = llm.engine.runner, []
    forward = runner.forward

    def counting(batch):
        with CountOps() as mode:
            hidden = forward(batch)
        counted.append(mode.count)
        return hidden

    runner.forward = counting
    try:
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True),
                     use_tqdm=False)
    finally:
        del runner.__dict__["forward"]
    return counted[-1]  # the second forward is a decode


def dispatch_cost_us(device: torch.device, reps: int = 2000) -> float:
    """Microseconds to dispatch one tiny operator (a 1-element add), median of 5 timings."""
    x = torch.ones(1, device=device)
    times = []
    with torch.inference_mode():
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(reps):
                torch.add(x, x)
            times.append((time.perf_counter() - start) / reps)
    return 1e6 * statistics.median(times)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--seats", type=int, nargs="+", default=[1, 16, 64],
                        help="batch sizes: requests served together in one generate")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3,
                        help="generate calls per batch size and loop, interleaved; medians")
    parser.add_argument("--engine-requests", type=int, default=64,
                        help="requests of bench engine's heavy-tailed workload for the "
                             "continuous/static and continuous/transformers ratios (0: skip)")
    parser.add_argument("--seed", type=int, default=0)


def table(per_seats: dict[int, dict[str, float]]) -> str:
    seats = list(per_seats)
    head = f"{'phase (ms per step)':<24}" + "".join(f"{f'{s} seats':>16}" for s in seats)
    lines = [head]
    for phase, _, _ in PHASES:
        cells = []
        for s in seats:
            f = per_seats[s]
            total = sum(f[p] for p, _, _ in PHASES)
            cells.append(f"{f[phase]:>8.3f} {100 * f[phase] / total:>5.1f}%")
        lines.append(f"{phase:<24}" + "".join(f"{c:>16}" for c in cells))
    for name in ("step ms", "steps", "tokens/s"):
        lines.append(f"{name:<24}" + "".join(f"{per_seats[s][name]:>16.1f}" for s in seats))
    return "\n".join(lines)


def median_figures(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(f[k] for f in runs) for k in runs[0]}


def main(args: argparse.Namespace, report: Callable[[str], None] = print
         ) -> dict[str, dict[int, dict[str, float]]]:
    """Figures per loop ("sync", "async") and batch size; "ratios" holds bench engine's."""
    device = machine.device()
    llms = {loop: LLM(args.model, max_num_seqs=max(args.seats), device=device,
                      async_scheduling=loop == "async") for loop in ("sync", "async")}
    report(f"workload: per batch size, that many requests of {args.prompt_len} prompt and "
           f"{args.output_len} output tokens, greedy; {args.rounds} rounds, interleaved")
    report(machine.describe())
    for llm in llms.values():
        run_once(llm, min(args.seats), 8, 4, args.seed)  # warm-up
    runs: dict[str, dict[int, list[dict[str, float]]]] = {
        loop: {s: [] for s in args.seats} for loop in llms}
    for r in range(args.rounds):
        for s in args.seats:
            order = list(llms) if r % 2 == 0 else list(reversed(llms))  # neither always first
            for loop in order:
                runs[loop][s].append(run_once(llms[loop], s, args.prompt_len, args.output_len,
                                              args.seed + r))
    figures = {loop: {s: median_figures(by_seats[s]) for s in args.seats}
               for loop, by_seats in runs.items()}
    sync = figures["sync"]
    report("the synchronous loop (the reference: each step's tokens read before the next)")
    report(table(sync))
    for s, f in sync.items():
        model = sum(f[p] for p in MODEL_PHASES)
        report(f"{s} seats: the model (forward + lm head) {model:.2f} ms of a "
               f"{f['step ms']:.2f} ms step; the host's bookkeeping around it "
               f"{100 * (1 - model / f['step ms']):.0f}%")
    llm = llms["sync"]
    ops, us = ops_per_forward(llm), dispatch_cost_us(llm.engine.device)
    smallest = sync[min(args.seats)]["forward"]
    report(f"dispatch floor: one forward dispatches {ops} ATen operators; at {us:.1f} us each "
           f"(a 1-element add, measured) that is {ops * us / 1e3:.2f} ms, "
           f"{100 * ops * us / 1e3 / smallest:.0f}% of the forward at {min(args.seats)} seats")
    for s in sync:
        sync[s] |= {"ops per forward": ops, "dispatch us": us}
    report("asynchronous scheduling (step n+1 launched before step n's tokens are read):")
    for s in args.seats:
        per_round = [a["tokens/s"] / b["tokens/s"]
                     for a, b in zip(runs["async"][s], runs["sync"][s])]
        figures["async"][s]["speedup"] = statistics.median(per_round)
        report(f"{s:>4} seats: step {sync[s]['step ms']:.2f} ms sync, "
               f"{figures['async'][s]['step ms']:.2f} ms async; tokens/s async / sync "
               f"{Ratio(tuple(per_round))}")
    if args.engine_requests:
        figures["ratios"] = engine_ratios(args, report)  # type: ignore[assignment]
    return figures


def engine_ratios(args: argparse.Namespace, report: Callable[[str], None]) -> dict[str, Ratio]:
    """bench engine's ratios with the synchronous and the asynchronous loop, side by side."""
    vocab = ModelConfig.from_pretrained(args.model).vocab_size
    reqs = heavy_tailed_workload(args.engine_requests, vocab, args.seed)
    warmup = heavy_tailed_workload(16, vocab, args.seed + 1, long_fraction=0.0)
    contenders = {
        "continuous sync": minillm_contender(args.model, 16, "continuous", warmup),
        "continuous async": minillm_contender(args.model, 16, "continuous", warmup,
                                              async_scheduling=True),
        "static": minillm_contender(args.model, 16, "static", warmup),
        "transformers": transformers_contender(args.model, 16, warmup),
    }
    rounds = interleaved_rounds({name: (lambda serve=serve: serve(reqs))
                                 for name, serve in contenders.items()}, args.rounds)
    ratios = {}
    report(f"bench engine's workload ({len(reqs)} heavy-tailed requests, 16 seats), "
          "wall clock:")
    for loop in ("sync", "async"):
        for other in ("static", "transformers"):
            name = f"continuous {loop} / {other}"
            ratios[name] = speedup(rounds, f"continuous {loop}", other)
            report(f"  {name}: {ratios[name]}")
    return ratios
