"""What prefix caching buys on this machine: TTFT with a shared system prompt, and hit rates.

1. Shared system prompt: every request is one long system prompt (1,024 tokens by default) and
   a short question of its own. With caching off each request prefills all of it; with caching
   on ("hash", vLLM's chain of block hashes, or "radix", SGLang's tree) only the question is
   prefilled once the prompt is cached, so TTFT falls by about the prompt's share of the
   prefill. The three engines answer the same questions one at a time (TTFT is then the
   prefill alone, no queueing) in interleaved, rotated rounds; the report is the median
   cached/uncached TTFT ratio with its spread, and the prefill tokens each computed.
2. Multi-turn chat: each turn's prompt is the previous prompt, the model's answer and a new
   message. Both designs reuse earlier turns, answers included; the token hit rate is set
   against the ceiling an unbounded cache would reach (minillm.prefix_workload), with a pool
   large enough to keep everything and with one too small to (eviction: the designs differ in
   what they throw away).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path

from minillm.bench.engine import Ratio, interleaved_rounds
from minillm.calc import machine
from minillm.llm import LLM, default_model_path
from minillm.model_config import ModelConfig
from minillm.sampling import SamplingParams
from minillm.serve.conversations import run_conversations
from minillm.workloads.prefixes import (
    ideal_prefix_reuse,
    in_issue_order,
    multi_turn,
    shared_prefix,
)

DESIGNS = ("hash", "radix")


def caching_llm(path: Path, design: str | None, **engine: object) -> LLM:
    """The shipped engine on the CPU with prefix caching off (design None) or on."""
    if design is None:
        return LLM(path, device="cpu", enable_prefix_caching=False, **engine)
    return LLM(path, device="cpu", enable_prefix_caching=True, prefix_caching=design, **engine)


def prefill_tokens_since(llm: LLM, first_step: int) -> int:
    """Prompt tokens the engine computed in its steps from first_step on, read from the step
    trace (what each step's forward ran), not derived from the cache's own hit counter."""
    return sum(e.num_tokens for rec in llm.trace if rec.step >= first_step
               for e in rec.scheduled if e.phase == "prefill")


def ttft_contender(llm: LLM, prompts: list[list[int]], output_len: int
                   ) -> Callable[[], dict[str, float]]:
    """Serves the prompts one at a time; returns the median TTFT (s), the prefill tokens the
    steps computed (from the trace) and the prompt tokens the cache reported as hits."""
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)

    def serve() -> dict[str, float]:
        before, first_step = llm.stats(), llm.engine.num_steps
        ttfts = [llm.generate([p], params, use_tqdm=False)[0].metrics.ttft for p in prompts]
        hit = llm.stats()["prefix_cache_hit_tokens"] - before["prefix_cache_hit_tokens"]
        return {"ttft": statistics.median(ttfts), "prefill": prefill_tokens_since(llm, first_step),
                "hit": hit}

    return serve


def shared_prompt_ttft(args: argparse.Namespace, vocab: int) -> dict[str, Ratio]:
    work = shared_prefix(args.questions + 1, 1, args.prefix_len, args.question_len,
                         args.output_len, vocab_size=vocab, seed=args.seed)
    prompts = [spec.token_ids(vocab) for spec in work]
    warm, questions = prompts[0], prompts[1:]
    engine = dict(max_model_len=args.prefix_len + args.question_len + args.output_len + 16,
                  block_size=args.block_size)
    contenders = {}
    for design in (None, *DESIGNS):
        llm = caching_llm(args.model, design, **engine)
        ttft_contender(llm, [warm], args.output_len)()  # warm-up, and the cached prompt
        contenders[f"caching {design or 'off'}"] = ttft_contender(llm, questions, args.output_len)
    print(f"shared system prompt: {args.prefix_len} tokens, then {args.questions} questions of "
          f"{args.question_len} tokens, {args.output_len} tokens out, one at a time; block size "
          f"{args.block_size}; {args.rounds} interleaved rounds")
    print(f"{'round':<7}" + "".join(f"{name + ' TTFT ms':>24}" for name in contenders))
    rounds = interleaved_rounds(contenders, args.rounds, lambda r, s: print(
        f"{r:<7}" + "".join(f"{v['ttft'] * 1e3:>24.1f}" for v in s.values()), flush=True))
    for name in contenders:
        prefill = rounds[-1][name]["prefill"]
        print(f"{name:<16} prefill tokens computed per round: {prefill:6.0f} "
              f"({prefill / args.questions:.0f} per question)")
    ratios = {}
    for design in DESIGNS:
        name = f"caching {design}"
        ratios[design] = Ratio(tuple(r[name]["ttft"] / r["caching off"]["ttft"] for r in rounds))
        print(f"TTFT cached ({design}) / uncached: {str(ratios[design]).replace('x', '', 1)}"
              f"   (target <= 0.5; measured on this machine)")
    return ratios


def chat_hit_rates(args: argparse.Namespace, vocab: int) -> dict[tuple[str, str], float]:
    chats = multi_turn(args.chats, args.turns, (96, 160), (16, 48), (16, 32), vocab_size=vocab,
                       seed=args.seed)
    longest = 160 + (args.turns - 1) * (48 + 32) + 32
    # Half the chats run at once. The tight pool holds those at their longest and little else,
    # so the other half's earlier turns must be evicted while they wait; the ample pool keeps
    # every chat's history.
    seats = max(1, args.chats // 2)
    tight = seats * -(-longest // args.block_size) + 4
    ample = 2 * args.chats * -(-longest // args.block_size)
    rates = {}
    print(f"multi-turn chat: {args.chats} chats x {args.turns} turns, {seats} at a time, "
          f"answers 16-32 tokens, block size {args.block_size}")
    for pool_name, blocks in (("ample pool", ample), ("tight pool", tight)):
        for design in DESIGNS:
            llm = caching_llm(args.model, design, max_model_len=longest + 16,
                              block_size=args.block_size, num_kv_blocks=blocks,
                              max_num_seqs=seats)
            outs = run_conversations(llm, chats)
            stats = llm.stats()
            rate = stats["prefix_cache_hit_tokens"] / stats["prefix_cache_query_tokens"]
            ceiling = ideal_prefix_reuse(in_issue_order(outs), args.block_size)
            rates[pool_name, design] = rate
            print(f"{pool_name} ({blocks} blocks), {design:5s}: token hit rate {rate:.3f} "
                  f"(ceiling {ceiling.token_hit_rate:.3f}), {stats['prefix_cache_evictions']} "
                  f"blocks evicted   (measured)")
    return rates


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--prefix-len", type=int, default=1024, help="shared system prompt")
    parser.add_argument("--questions", type=int, default=12)
    parser.add_argument("--question-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chats", type=int, default=12)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)


def main(args: argparse.Namespace) -> int:
    vocab = ModelConfig.from_pretrained(args.model).vocab_size
    print(machine.describe())
    shared_prompt_ttft(args, vocab)
    chat_hit_rates(args, vocab)
    return 0
