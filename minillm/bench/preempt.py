"""Preemption by recompute vs by swap on the same squeeze, measured, and the GPU crossover.

One batch of requests, prompts and outputs long enough that a victim holds real context, is
served three ways by the shipped model on this CPU: with a KV pool that holds the whole batch
(the reference: nothing is preempted), and with a pool of about a third of that under
preemption_mode="recompute" and under "swap". The squeezed engines must evict running requests
to let the others grow. Recompute throws a victim's K/V away and prefills it again when it
resumes: extra tokens computed. Swap copies them to a host pool and back: bytes moved. The
three serve the batch in interleaved, rotated rounds (minillm.bench.engine), threads settled;
the report is one table (medians over the rounds) and the swap / recompute ratios with their
spread. On a CPU the "host pool" is the same RAM, so a swap costs a memcpy, far less than a
PCIe transfer; the GPU comparison is modelled (minillm.preemption): the cost of each at a
context length, and the crossover length past which swap wins.

All three runs must produce the same tokens (greedy): the bench checks it and fails loudly.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from minillm.bench.engine import Ratio, interleaved_rounds, timed
from minillm.calc import machine, models
from minillm.calc.preemption import crossover_context_len, fits, preemption_costs
from minillm.llm import LLM, default_model_path
from minillm.metrics import percentile
from minillm.model_config import ModelConfig
from minillm.sampling import SamplingParams

RUNS = ("ample", "recompute", "swap")
TIMED = ("itl_p99", "tok_s", "tok_s_cpu")  # the figures a clock gives, medians over rounds
# Modelled pairs: GQA at 7-8B, a small model with wide K/V on PCIe 5 and on NVLink-C2C, and
# Llama-3-8B's shape with full multi-head attention (32 KV heads).
LLAMA_MHA = dataclasses.replace(models.get("llama-3-8b"), num_key_value_heads=32)
# Each pair fits one GPU (preemption.fits): Llama-3-8B's 16 GB of weights would not on a T4.
MODELLED = (("llama-3-8b", "llama-3-8b", "H100-SXM"), ("qwen3-0.6b", "qwen3-0.6b", "T4"),
            ("llama-3-8b MHA", LLAMA_MHA, "H100-SXM"), ("qwen3-0.6b", "qwen3-0.6b", "H100-SXM"),
            ("qwen3-0.6b", "qwen3-0.6b", "GH200"))

Run = dict[str, object]  # one run's figures: seconds, tokens, counters, victims' gaps


def squeeze_llm(path: Path, mode: str, num_blocks: int, max_len: int, seats: int) -> LLM:
    """The shipped engine on the CPU; "ample" is recompute mode with a pool that never runs dry."""
    preemption = "recompute" if mode == "ample" else mode
    return LLM(path, device="cpu", num_kv_blocks=num_blocks, max_model_len=max_len,
               max_num_seqs=seats, preemption_mode=preemption)


def serve_contender(llm: LLM, prompts: list[list[int]], output_len: int
                    ) -> Callable[[], Run]:
    """Serves the batch once; returns its time, tokens, counter deltas and victims."""
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)

    def serve() -> Run:
        before, first_step = llm.stats(), llm.engine.num_steps  # StepRecord.step of our first
        outs: list = []
        seconds = timed(lambda: outs.extend(llm.generate(prompts, params, use_tqdm=False)))
        after = llm.stats()
        steps = [s for s in llm.trace if s.step >= first_step]
        delta = {k: after[k] - before[k] for k in ("num_preemptions", "num_recomputed_tokens",
                                                   "swap_out_bytes", "swap_in_bytes")}
        preempted = {rid for s in steps for rid in s.preempted}
        return {**seconds, **delta, "tokens": [o.token_ids for o in outs],
                "scheduled": sum(s.num_tokens for s in steps),
                "victims": [i for i, o in enumerate(outs) if o.request_id in preempted],
                "itl": [o.metrics.itl for o in outs]}

    return serve


def victims_itl_p99(run: Run, victims: list[int]) -> float:
    """p99 of the gaps between consecutive tokens of the given requests (seconds)."""
    gaps = [g for i in victims for g in run["itl"][i]]
    return percentile(gaps, 99)


def check_identical(rounds: list[dict[str, Run]]) -> str | None:
    """None when every run of every round produced the reference's tokens, else what differs."""
    reference = rounds[0]["ample"]["tokens"]
    for r, runs in enumerate(rounds):
        for name, run in runs.items():
            for i, (got, want) in enumerate(zip(run["tokens"], reference)):
                if got != want:
                    first = next(j for j, (a, b) in enumerate(zip(got, want)) if a != b)
                    return (f"round {r}, {name}: request {i} differs from the ample pool's "
                            f"output at token {first} ({got[first]} != {want[first]})")
    return None


def report_table(rounds: list[dict[str, Run]], output_tokens: int, blocks: dict[str, int]
                 ) -> dict[str, dict[str, float]]:
    """Prints the one table (medians over rounds) and returns its figures by run."""
    victims = sorted({i for runs in rounds for name in ("recompute", "swap")
                      for i in runs[name]["victims"]})
    reference = rounds[-1]["ample"]["scheduled"]
    rows: dict[str, dict[str, float]] = {}
    for name in RUNS:
        last = rounds[-1][name]
        rows[name] = {
            "blocks": blocks[name], "preemptions": last["num_preemptions"],
            "extra_tokens": last["scheduled"] - reference,
            "recomputed": last["num_recomputed_tokens"],
            "bytes": last["swap_out_bytes"] + last["swap_in_bytes"],
            **{key: statistics.median(_run_figure(r[name], key, output_tokens, victims)
                                      for r in rounds) for key in TIMED},
        }
    print(f"\n{'run':<16}{'blocks':>7}{'preempt':>9}{'extra tok':>11}{'recomputed':>12}"
          f"{'bytes moved':>13}{'victims ITL p99 ms':>20}{'tok/s':>9}{'tok/s cpu':>11}")
    for name, row in rows.items():
        print(f"{name:<16}{row['blocks']:>7}{row['preemptions']:>9}{row['extra_tokens']:>11}"
              f"{row['recomputed']:>12}{row['bytes']:>13}{row['itl_p99'] * 1e3:>20.2f}"
              f"{row['tok_s']:>9.1f}{row['tok_s_cpu']:>11.1f}")
    rec, swap = rows["recompute"], rows["swap"]
    # Timed figures: the median of the per-round ratios (both runs of a round share the
    # machine's mood), not the ratio of two medians taken from different rounds.
    per_round = {key: tuple(_run_figure(r["swap"], key, output_tokens, victims)
                            / _run_figure(r["recompute"], key, output_tokens, victims)
                            for r in rounds) for key in TIMED}
    ratio = {"extra_tokens": _div(swap["extra_tokens"], rec["extra_tokens"]),
             "bytes": _div(swap["bytes"], rec["bytes"]),
             **{key: statistics.median(values) for key, values in per_round.items()}}
    print(f"{'swap/recompute':<16}{'':>7}{'':>9}{ratio['extra_tokens']:>11.2f}{'':>12}"
          f"{ratio['bytes']:>13.2f}{ratio['itl_p99']:>20.2f}{ratio['tok_s']:>9.2f}"
          f"{ratio['tok_s_cpu']:>11.2f}")
    print(f"victims: {len(victims)} requests preempted in a squeezed run; extra tok: tokens "
          "scheduled beyond the ample pool's run; recomputed: stats()' num_recomputed_tokens; "
          "bytes moved: swap_out_bytes + swap_in_bytes (inf: recompute moved none)")
    for key, label in (("tok_s", "throughput"), ("tok_s_cpu", "throughput on the CPU clock"),
                       ("itl_p99", "victims' ITL p99")):
        print(f"swap / recompute {label}: {str(Ratio(per_round[key])).replace('x', '', 1)}   "
              "(measured on this machine)")
    rows["swap/recompute"] = ratio
    return rows


def _div(a: float, b: float) -> float:
    return a / b if b else (float("inf") if a else float("nan"))


def _run_figure(run: Run, key: str, output_tokens: int, victims: list[int]) -> float:
    if key == "itl_p99":
        return victims_itl_p99(run, victims)
    return output_tokens / run["wall" if key == "tok_s" else "cpu"]


def modelled_crossovers(context_len: int = 4096) -> None:
    """The GPU side, modelled: each pair's cost at context_len and its crossover."""
    print(f"\nmodelled on a GPU (minillm.preemption; recompute priced in a busy step at peak "
          f"FLOP/s, swap out and back at the host link's peak), one victim of {context_len} "
          "tokens:")
    print(f"{'model':<16}{'hardware':<10}{'recompute ms':>14}{'swap ms':>10}{'cheaper':>11}"
          f"   crossover (swap wins from)")
    for label, model, hw in MODELLED:
        assert fits(model, hw, context_len), f"{label} does not fit one {hw}: nothing to preempt"
        cost = preemption_costs(model, hw, [context_len])[0]
        cross = crossover_context_len(model, hw, max_len=131072)
        where = (f"{cross} tokens" if cross is not None else
                 f"none: {preemption_costs(model, hw, [1])[0].cheaper} wins at every length")
        print(f"{label:<16}{hw:<10}{cost.recompute_s * 1e3:>14.2f}{cost.swap_s * 1e3:>10.2f}"
              f"{cost.cheaper:>11}   {where}   (modelled)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--num-requests", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=96)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--squeeze", type=float, default=1 / 3,
                        help="the squeezed pool's share of the blocks the batch needs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true",
                        help="8 requests of 64 + 32 tokens, one round: a smoke run")
    parser.add_argument("--seed", type=int, default=0)


def main(args: argparse.Namespace) -> int:
    if args.quick:
        args = argparse.Namespace(**{**vars(args), "num_requests": 8, "prompt_len": 64,
                                     "output_len": 32, "rounds": 1, "quick": False})
    vocab = ModelConfig.from_pretrained(args.model).vocab_size
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(vocab) for _ in range(args.prompt_len)]
               for _ in range(args.num_requests)]
    max_len = args.prompt_len + args.output_len
    need = args.num_requests * -(-max_len // args.block_size)  # whole batch at its longest
    tight = max(-(-max_len // args.block_size), round(need * args.squeeze))
    blocks = {"ample": need, "recompute": tight, "swap": tight}
    print(machine.describe())
    print(f"squeeze: {args.num_requests} requests of {args.prompt_len} prompt + "
          f"{args.output_len} output tokens (greedy), block size {args.block_size}: the batch "
          f"needs {need} blocks, the squeezed pools hold {tight}; {args.rounds} interleaved "
          "rounds")
    contenders = {}
    for name in RUNS:
        llm = squeeze_llm(args.model, name, blocks[name], max_len, args.num_requests)
        llm.generate(prompts[:2], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        contenders[name] = serve_contender(llm, prompts, args.output_len)
    print(f"{'round':<7}" + "".join(f"{name + ' (s)':>16}" for name in RUNS) + "   (wall clock)")
    rounds = interleaved_rounds(contenders, args.rounds, lambda r, s: print(
        f"{r:<7}" + "".join(f"{s[n]['wall']:>16.2f}" for n in RUNS), flush=True))
    problem = check_identical(rounds)
    if problem is not None:
        print(f"FAILED: recompute, swap and the ample pool must produce identical tokens; "
              f"{problem}", file=sys.stderr)
        return 1
    print("tokens identical under recompute, swap and no preemption: yes")
    report_table(rounds, args.num_requests * args.output_len, blocks)
    modelled_crossovers()
    return 0
