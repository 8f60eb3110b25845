"""Speculative decoding measured: tokens/s with and without, acceptance, mean accepted length.

The shipped model serves two kinds of text greedily on this machine, each at batch 1 and at a
larger batch, three ways: plainly, with prompt lookup ("ngram") and with the shipped draft
model. "quotes": passages of The Tempest, which the model continues in the play's own words and
names, so earlier text often predicts the next tokens; "free": a speaker's name alone, so the
text has little to look up. The runs of a row go in interleaved, rotated rounds
(minillm.bench.engine), so a slow spell of the machine does not land on one of them.

For each run: tokens/s and its ratio to the plain run (median over rounds, with the range),
target forwards (engine steps), proposals and acceptances, the acceptance rate alpha (accepted
over reached, pooled over positions), the mean tokens a verification yields and the formula's
E = (1 - alpha^(k+1)) / (1 - alpha) from that alpha. All runs of a row must emit the same
tokens (greedy, lossless): the bench checks it and fails loudly. In bf16 or fp16 (a GPU, or the
GPU-shaped run) verifying k + 1 tokens in one forward rounds differently from decoding them one
at a time, so a near-tie pick can flip; there the bench prints how many answers matched,
as vLLM's docs (v0.17.0) say of its own: lossless "up to the precision limits of hardware
numerics".
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass

import torch

from minillm.bench.engine import Ratio, interleaved_rounds, timed
from minillm.calc import machine
from minillm.llm import LLM, default_draft_path
from minillm.quality import held_out_text, same_answers
from minillm.sampling import SamplingParams
from minillm.serve.datasets import shakespeare_passages
from minillm.spec.cost import expected_tokens_per_step

METHODS = ("plain", "ngram", "draft")


def quote_prompts(n: int, chars: int = 400) -> list[str]:
    """n passages of The Tempest (held-out: the model never trained on it), cut at a line end."""
    text = held_out_text()
    start = text.index("ACT 1")
    step = (len(text) - start) // (n + 1)
    out = []
    for i in range(n):
        lo = start + (i + 1) * step
        lo = text.index("\n", lo) + 1
        hi = text.rindex("\n", lo, lo + chars) + 1
        out.append(text[lo:hi])
    return out


def free_prompts(n: int) -> list[str]:
    """n speakers' names, each alone on its line: the model writes their speech from nothing."""
    names = [p.split("\n", 1)[0] + "\n" for p in shakespeare_passages()]
    return [names[i % len(names)] for i in range(n)]


WORKLOADS = {"quotes": quote_prompts, "free": free_prompts}


@dataclass
class SpecRun:
    """One method on one workload at one batch size; seconds are medians over the rounds."""

    workload: str
    method: str
    batch: int
    seconds: float
    tokens: int
    steps: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    alpha: float = 0.0
    ratio: Ratio | None = None  # tokens/s over the plain run's, per round

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a verification yields: its accepted proposals plus the one it always adds."""
        return 1 + self.num_accepted_tokens / max(self.num_drafts, 1)


def make_llm(method: str, k: int, seats: int) -> LLM:
    spec = {"plain": None,
            "ngram": {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3},
            "draft": {"model": str(default_draft_path()), "num_speculative_tokens": k}}[method]
    return LLM(device="cpu", max_num_seqs=seats, num_kv_blocks=64 * seats,
               speculative_config=spec)


def measure(workload: str, batch: int, k: int = 4, max_tokens: int = 96, rounds: int = 3,
            methods: tuple[str, ...] = METHODS) -> list[SpecRun]:
    """The runs of one row: every method serving the same prompts, greedily, in rounds."""
    prompts = WORKLOADS[workload](batch)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    llms = {m: make_llm(m, k, batch) for m in methods}
    outputs: dict[str, list[list[int]]] = {}
    steps: dict[str, int] = {}

    def contender(method: str):
        llm = llms[method]

        def serve() -> dict[str, float]:
            first = llm.engine.num_steps
            outs: list = []
            seconds = timed(lambda: outs.extend(llm.generate(prompts, params, use_tqdm=False)))
            outputs[method] = [o.token_ids for o in outs]
            steps[method] = llm.engine.num_steps - first
            return seconds

        return serve

    for llm in llms.values():  # warm-up: first-call costs out of the timed rounds
        llm.generate(prompts[:1], SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)
    results = interleaved_rounds({m: contender(m) for m in methods}, rounds)
    dtype = llms[methods[0]].model.lm_head.weight.dtype
    shares, same = same_answers(outputs["plain"], [outputs[m] for m in methods], dtype)
    if dtype == torch.float32 and not same:
        raise AssertionError(f"{workload} at batch {batch}: speculative decoding changed the "
                             f"greedy tokens (answers as plain's: {shares}); it must be lossless")
    if min(shares) < 1:  # 16 bits: one near-tie flip changes a whole answer, even at batch 1
        print(f"{workload} at batch {batch}, {dtype}: answers as plain's for {shares} of the "
              "requests (rounding: quality.same_answers)")
    runs = []
    for m in methods:
        spec = llms[m].engine.spec
        per_round = tuple(r["plain"]["wall"] / r[m]["wall"] for r in results)
        run = SpecRun(workload, m, batch, statistics.median(r[m]["wall"] for r in results),
                      sum(len(t) for t in outputs[m]), steps[m], ratio=Ratio(per_round))
        if spec is not None:  # counters over every round: the rounds repeat the same tokens
            run.num_drafts, run.num_draft_tokens = spec.num_drafts, spec.num_draft_tokens
            run.num_accepted_tokens, run.alpha = spec.num_accepted_tokens, spec.acceptance_rate
        runs.append(run)
    return runs


def table(runs: list[SpecRun], k: int) -> str:
    head = (f"{'workload':8} {'batch':>5} {'method':6} {'tok/s':>6} {'vs plain (range)':>19} "
            f"{'steps':>5} {'proposed':>8} {'accepted':>8} {'alpha':>5} {'mean len':>8} "
            f"{'E(alpha)':>8}")
    lines = [head, "-" * len(head)]
    for r in runs:
        ratio = "1.00x"
        if r.method != "plain" and r.ratio is not None:
            per_round = r.ratio.per_round
            ratio = f"{r.ratio.median:.2f}x ({min(per_round):.2f}-{max(per_round):.2f})"
        spec = (f"{r.num_draft_tokens:>8} {r.num_accepted_tokens:>8} {r.alpha:>5.2f} "
                f"{r.mean_accepted_length:>8.2f} {expected_tokens_per_step(r.alpha, k):>8.2f}"
                if r.method != "plain" else f"{'':>8} {'':>8} {'':>5} {1.0:>8.2f} {'':>8}")
        lines.append(f"{r.workload:8} {r.batch:>5} {r.method:6} {r.tokens_per_second:>6.0f} "
                     f"{ratio:>19} {r.steps:>5} {spec}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true",
                        help="one round, batch 2, 24 tokens: a smoke run for tests")


def main(args: argparse.Namespace) -> int:
    if not default_draft_path().is_dir():
        print(f"the draft model is missing at {default_draft_path()}: reinstall minillm",
              file=sys.stderr)
        return 2
    if args.quick:
        args.batches, args.max_tokens, args.rounds = [2], 24, 1
    print(machine.describe())
    print(f"greedy, k = {args.k}, {args.max_tokens} tokens per request, median of "
          f"{args.rounds} interleaved rounds; measured on this machine\n")
    runs = [run for workload in WORKLOADS for batch in args.batches
            for run in measure(workload, batch, args.k, args.max_tokens, args.rounds)]
    print(table(runs, args.k))
    print("\nsame tokens as plain in every run: yes (checked).  mean len: tokens per "
          "verification (1 + accepted / verifications); E(alpha): the i.i.d. formula at the "
          "measured alpha, for full proposals of k tokens (prompt lookup often proposes fewer)")
    return 0
