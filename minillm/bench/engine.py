"""Throughput of continuous vs static batching vs transformers' generate on one workload.

The workload is heavy-tailed, as real traffic is: most requests want a short answer, a few want
a long one. Static batching (and transformers' generate, which pads a batch and runs it until
its longest member is done) keeps the seats of finished requests idle until the slowest one
finishes; continuous batching refills them every step. All three serve the same requests with
the same model, dtype and batch size; throughput counts only the tokens each request asked for.

On a shared CPU one contender can stall while another process holds its core, and a single
side-by-side run then reports whatever the stall did (0.7x one run, 33x the next). So the
threads are settled first (machine.settle_threads), each contender is built and warmed once,
and the three serve the workload in rounds, in a rotated order: each round gives one ratio per
pair, and the report is the median ratio with its spread over the rounds, so one stalled run
moves the spread, not the conclusion. Each run is timed on two clocks: the wall clock (what a
user waits) and the process's CPU clock, which with one torch thread counts the work done and
not the time other processes held the core, so its ratio holds on a machine that is busy.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from minillm.calc import machine
from minillm.llm import LLM, default_model_path
from minillm.sampling import SamplingParams


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    max_tokens: int


Clock = Literal["wall", "cpu"]
Seconds = dict[Clock, float]  # one run's time on the wall clock and on the process's CPU clock
Contender = Callable[[list[BenchRequest]], Seconds]  # serves the requests, returns its time


def timed(fn: Callable[[], object]) -> Seconds:
    """fn's wall-clock seconds, and the CPU seconds this process spent in it."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


def heavy_tailed_workload(num_requests: int, vocab_size: int, seed: int = 0,
                          long_fraction: float = 0.15) -> list[BenchRequest]:
    """Prompts of 16-64 tokens; outputs of 8-32 tokens, except long_fraction of 192-256."""
    rng = random.Random(seed)
    reqs = []
    for _ in range(num_requests):
        prompt = [rng.randrange(vocab_size) for _ in range(rng.randint(16, 64))]
        long = rng.random() < long_fraction
        reqs.append(BenchRequest(prompt, rng.randint(192, 256) if long else rng.randint(8, 32)))
    return reqs


def minillm_contender(path: Path, batch_size: int, scheduling: str,
                      warmup: list[BenchRequest], async_scheduling: bool = False) -> Contender:
    """minillm on the CPU, built and warmed up once; each call times one generate (seconds)."""
    llm = LLM(path, max_num_seqs=batch_size, scheduling=scheduling, device="cpu",
              async_scheduling=async_scheduling)

    def serve(reqs: list[BenchRequest]) -> Seconds:
        params = [SamplingParams(max_tokens=r.max_tokens, temperature=0, ignore_eos=True)
                  for r in reqs]
        outs = []
        seconds = timed(lambda: outs.extend(
            llm.generate([r.prompt_token_ids for r in reqs], params, use_tqdm=False)))
        assert all(len(o.token_ids) == r.max_tokens for o, r in zip(outs, reqs))
        assert llm.stats()["num_free_blocks"] == llm.stats()["num_blocks"]
        return seconds

    serve(warmup)
    return serve


def transformers_contender(path: Path, batch_size: int, warmup: list[BenchRequest]
                           ) -> Contender:
    """transformers' generate over padded static batches in arrival order, loaded once."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    pad = model.config.eos_token_id or 0

    def serve(reqs: list[BenchRequest]) -> Seconds:
        return timed(lambda: [generate_padded(model, reqs[i:i + batch_size], pad)
                              for i in range(0, len(reqs), batch_size)])

    serve(warmup)
    return serve


def generate_padded(model: torch.nn.Module, batch: list[BenchRequest], pad: int) -> None:
    """One transformers generate over the batch, left-padded, every request to the longest
    request's max_tokens (on the model's device)."""
    longest = max(len(r.prompt_token_ids) for r in batch)
    ids = torch.full((len(batch), longest), pad)  # left padding, as decoder-only generate needs
    mask = torch.zeros_like(ids)
    for i, r in enumerate(batch):
        ids[i, longest - len(r.prompt_token_ids):] = torch.tensor(r.prompt_token_ids)
        mask[i, longest - len(r.prompt_token_ids):] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    steps = max(r.max_tokens for r in batch)  # a batch runs until its longest request is done
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps,
                       min_new_tokens=steps, do_sample=False, pad_token_id=pad)


def interleaved_rounds(contenders: dict[str, Callable[[], Seconds]], rounds: int,
                       report: Callable[[int, dict[str, Seconds]], None] = lambda r, s: None
                       ) -> list[dict[str, Seconds]]:
    """Seconds of every contender in each round. Round r starts at contender r (mod n), so
    none always runs first or right after another: a slow spell of the machine falls on
    different contenders in different rounds instead of always on the same one."""
    names = list(contenders)
    results = []
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        seconds = {name: contenders[name]() for name in order}
        results.append({name: seconds[name] for name in names})
        report(r, results[-1])
    return results


@dataclass(frozen=True)
class Ratio:
    """A throughput ratio measured once per round: its median and its range over the rounds."""

    per_round: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.per_round)

    def __str__(self) -> str:
        if len(self.per_round) == 1:
            return f"{self.median:.2f}x (one round: no spread)"
        return (f"{self.median:.2f}x median of {len(self.per_round)} rounds "
                f"(range {min(self.per_round):.2f}-{max(self.per_round):.2f}x)")


def speedup(rounds: list[dict[str, Seconds]], faster: str, slower: str, clock: Clock = "wall"
            ) -> Ratio:
    """Throughput of `faster` over `slower` in each round: the same tokens, so seconds' ratio."""
    return Ratio(tuple(r[slower][clock] / r[faster][clock] for r in rounds))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--num-requests", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3,
                        help="times each contender serves the workload, interleaved")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: machine.settle_threads' choice, 1 on a "
                             "CPU of 2 cores or fewer)")
    parser.add_argument("--seed", type=int, default=0)


def main(args: argparse.Namespace) -> dict[str, Ratio]:
    from minillm.model_config import ModelConfig

    if getattr(args, "threads", None) is None:
        machine.settle_threads()
    else:
        torch.set_num_threads(args.threads)
    vocab = ModelConfig.from_pretrained(args.model).vocab_size
    reqs = heavy_tailed_workload(args.num_requests, vocab, args.seed)
    warmup = heavy_tailed_workload(args.batch_size, vocab, args.seed + 1, long_fraction=0.0)
    tokens = sum(r.max_tokens for r in reqs)
    print(f"workload: {len(reqs)} requests, {tokens} output tokens "
          f"({sum(r.max_tokens > 32 for r in reqs)} long), batch size {args.batch_size}, "
          f"{args.rounds} interleaved rounds, model {args.model.name}")
    print(machine.describe())
    contenders = {
        "minillm continuous": minillm_contender(args.model, args.batch_size, "continuous", warmup),
        "minillm static": minillm_contender(args.model, args.batch_size, "static", warmup),
        "transformers generate": transformers_contender(args.model, args.batch_size, warmup),
    }
    print(f"{'round':<7}" + "".join(f"{name + ' (s)':>26}" for name in contenders)
          + "   (wall clock / CPU clock)", flush=True)
    rounds = interleaved_rounds(
        {name: (lambda serve=serve: serve(reqs)) for name, serve in contenders.items()},
        args.rounds, lambda r, s: print(f"{r:<7}" + "".join(
            f"{t['wall']:>18.2f} / {t['cpu']:>5.2f}" for t in s.values()), flush=True))
    print(f"{'engine':<24}{'median s':>10}{'tokens/s':>12}   (wall clock)")
    for name in contenders:
        median = statistics.median(r[name]["wall"] for r in rounds)
        print(f"{name:<24}{median:>10.2f}{tokens / median:>12.1f}")
    pairs = {"continuous / static": ("minillm continuous", "minillm static"),
             "continuous / transformers": ("minillm continuous", "transformers generate")}
    ratios = {}
    for name, (faster, slower) in pairs.items():
        ratios[name] = speedup(rounds, faster, slower, "wall")
        on_cpu = speedup(rounds, faster, slower, "cpu")
        print(f"{name}: {ratios[name]} on the wall clock; {on_cpu} on the CPU clock")
    return ratios
