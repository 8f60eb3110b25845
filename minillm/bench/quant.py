"""Quantization side by side: bytes per decode step, KV pool size, perplexity, greedy agreement
and decode speed of the shipped model in fp32, int8 weights, int8 / fp8 KV, and both.

Each setting is one LLM on this CPU (fp32 activations, the torch attention reference):
- weight bytes per decode step: the decoder's projections as stored (int8 values plus their
  per-channel scales under quantization="int8") plus the lm_head, which every step reads whole;
- KV bytes per decode step: a batch of --batch requests at --context tokens each, all read once;
- pool tokens: the tokens a KV pool of POOL_BYTES holds at the setting's KV dtype (2 or 4 bytes
  per number -> 1 byte: 4x here, as the model is fp32);
- perplexity on the first --ppl-tokens tokens of the held-out play (minillm.quality), and its
  change from fp32 in nats;
- greedy agreement, teacher-forced: fixed prompts (Shakespeare passages, 24 tokens each) plus
  fp32's greedy continuation run through the setting once; the share of positions whose argmax
  equals fp32's (token by token, so one early difference does not count against every later);
- decode tokens/s: --batch prompts generating --decode-tokens tokens each through the engine,
  in interleaved rounds (minillm.bench.engine), the median, and its ratio to fp32's.

On a CPU the dequantize is extra work with no bandwidth to save, so tokens/s measures the cost
of the readable path, not the GPU's gain (the roofline models that: chapter 10).
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from minillm.batch import build_batch
from minillm.bench.engine import interleaved_rounds, timed
from minillm.calc import machine
from minillm.llm import LLM, default_model_path
from minillm.quality import held_out_text, perplexity, token_stream
from minillm.quant.int8 import projection_weight_bytes
from minillm.quant.kv_pool import allocate_kv_cache
from minillm.request import Request, ScheduledRequest
from minillm.sampling import SamplingParams
from minillm.serve.datasets import shakespeare_passages

POOL_BYTES = 64 * 2**20  # the same KV memory for every setting
PROMPT_TOKENS = GREEDY_TOKENS = 24


@dataclass(frozen=True)
class Setting:
    name: str
    quantization: str | None  # weights: None or "int8"
    kv_cache_dtype: str  # "auto", "int8" or "fp8"


SETTINGS = (Setting("fp32", None, "auto"), Setting("int8 W", "int8", "auto"),
            Setting("int8 KV", None, "int8"), Setting("fp8 KV", None, "fp8"),
            Setting("int8 W + int8 KV", "int8", "int8"), Setting("int8 W + fp8 KV", "int8", "fp8"))
COLUMNS = ("setting", "W MB/step", "KV MB/step", "pool tokens", "ppl", "d nats", "agree %",
           "tok/s", "x fp32")


def weight_bytes_per_step(llm: LLM) -> int:
    """The projections as stored plus the lm_head: what one decode step reads of the weights."""
    head = llm.model.lm_head.weight
    return projection_weight_bytes(llm.model) + head.numel() * head.element_size()


def kv_bytes_per_token(llm: LLM) -> int:
    """K and V of one token across all layers in the pool's dtype: 2 * L * K * D * bytes."""
    L, two, _, _, K, D = llm.engine.runner.kv_cache.shape
    return L * two * K * D * llm.engine.runner.kv_cache.element_size()


@torch.no_grad()
def teacher_forced_logits(llm: LLM, seqs: list[list[int]]) -> list[torch.Tensor]:
    """Each sequence's logits at every position (S, V), all in one prefill through llm's own
    model, attention backend, KV dtype and scales, on a pool of its own: every position
    attends through the quantized K/V, as decode would read them."""
    engine, P = llm.engine, llm.config.block_size
    mc = engine.model.config
    blocks = [-(-len(s) // P) for s in seqs]
    pool = allocate_kv_cache(mc.num_hidden_layers, sum(blocks), P, mc.num_key_value_heads,
                             mc.head_dim, engine.runner.kv_cache.dtype, engine.device)
    scheduled, first = [], 0
    for i, (seq, n) in enumerate(zip(seqs, blocks)):
        req = Request(f"agree-{i}", seq, SamplingParams(), 0.0)
        req.block_table, first = list(range(first, first + n)), first + n
        scheduled.append(ScheduledRequest(req, len(seq), 0, "prefill"))
    batch = build_batch(scheduled, P, engine.device)
    hidden = engine.model(batch.input_ids, batch.positions, pool, batch.attn, engine.runner.backend,
                          kv_scales=engine.runner.kv_scales)
    logits = engine.model.compute_logits(hidden).float()  # (T, V)
    return list(logits.split([len(s) for s in seqs]))


def teacher_forced_argmax(llm: LLM, seqs: list[list[int]]) -> list[torch.Tensor]:
    """Each sequence's greedy pick at every position (S,), from teacher_forced_logits."""
    return [logits.argmax(-1) for logits in teacher_forced_logits(llm, seqs)]


def agreement(reference: list[torch.Tensor], picks: list[torch.Tensor]) -> float:
    """The share of positions whose greedy pick equals the reference's."""
    same = sum(int((a == b).sum()) for a, b in zip(reference, picks, strict=True))
    return same / sum(len(r) for r in reference)


def ppl_text(llm: LLM, num_tokens: int) -> str:
    """The start of the held-out play, cut to about num_tokens tokens."""
    text = held_out_text()
    chars_per_token = len(text) / len(token_stream(llm, text))
    return text[:int(num_tokens * chars_per_token)]


def run(model: Path, batch: int = 8, context: int = 256, decode_tokens: int = 32,
        ppl_tokens: int = 4096, num_prompts: int = 16, rounds: int = 3,
        settings: tuple[Setting, ...] = SETTINGS) -> dict[str, dict[str, float]]:
    """Measure every setting (see the module docstring); print one table, return its rows."""
    llms = {s.name: LLM(model, device="cpu", dtype="float32", num_kv_blocks=64,
                        max_num_seqs=batch, quantization=s.quantization,
                        kv_cache_dtype=s.kv_cache_dtype) for s in settings}
    base = llms[settings[0].name]
    prompts = [base.tokenizer.encode(t)[:PROMPT_TOKENS] for t in shakespeare_passages()]
    prompts = prompts[:num_prompts]
    greedy = SamplingParams(max_tokens=GREEDY_TOKENS, temperature=0, ignore_eos=True)
    seqs = [p + o.token_ids for p, o in zip(prompts, base.generate(prompts, greedy,
                                                                   use_tqdm=False))]
    reference = teacher_forced_argmax(base, seqs)
    text = ppl_text(base, ppl_tokens)
    decode = SamplingParams(max_tokens=decode_tokens, temperature=0, ignore_eos=True)
    batch_prompts = prompts[:batch]
    for llm in llms.values():  # warm-up: first-call costs stay out of the timed rounds
        llm.generate(batch_prompts[:1], SamplingParams(max_tokens=2), use_tqdm=False)
    timings = interleaved_rounds(
        {name: (lambda llm=llm: timed(lambda: llm.generate(batch_prompts, decode,
                                                           use_tqdm=False)))
         for name, llm in llms.items()}, rounds)
    generated = len(batch_prompts) * decode_tokens
    rows: dict[str, dict[str, float]] = {}
    for name, llm in llms.items():
        ppl = perplexity(llm, text)
        rows[name] = {
            "weight_bytes": weight_bytes_per_step(llm),
            "kv_bytes": batch * context * kv_bytes_per_token(llm),
            "pool_tokens": POOL_BYTES // kv_bytes_per_token(llm),
            "perplexity": ppl.perplexity, "loss": ppl.loss, "ppl_tokens": ppl.num_tokens,
            "agreement": agreement(reference, teacher_forced_argmax(llm, seqs)),
            "tok_s": statistics.median(generated / r[name]["wall"] for r in timings),
        }
    base_row = rows[settings[0].name]
    for row in rows.values():
        row["delta_nats"] = row["loss"] - base_row["loss"]
        row["speed_ratio"] = row["tok_s"] / base_row["tok_s"]
    print_table(rows, batch, context, ppl_tokens=base_row["ppl_tokens"], rounds=rounds,
                generated=generated, num_positions=sum(len(s) for s in seqs))
    return rows


def print_table(rows: dict[str, dict[str, float]], batch: int, context: int, ppl_tokens: int,
                rounds: int, generated: int, num_positions: int) -> None:
    print(f"\nbytes per decode step at batch {batch} x context {context}; KV pool of "
          f"{POOL_BYTES // 2**20} MiB; perplexity over {ppl_tokens} held-out tokens; agreement "
          f"teacher-forced over {num_positions} positions; tok/s: {generated} tokens decoded, "
          f"median of {rounds} interleaved round(s)")
    print(f"{COLUMNS[0]:<18}" + "".join(f"{c:>12}" for c in COLUMNS[1:]))
    for name, r in rows.items():
        print(f"{name:<18}{r['weight_bytes'] / 1e6:>12.3f}{r['kv_bytes'] / 1e6:>12.3f}"
              f"{r['pool_tokens']:>12,}{r['perplexity']:>12.3f}{r['delta_nats']:>+12.4f}"
              f"{100 * r['agreement']:>12.1f}{r['tok_s']:>12.1f}{r['speed_ratio']:>12.2f}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--batch", type=int, default=8, help="requests in the decode run and "
                        "in the bytes-per-step figure")
    parser.add_argument("--context", type=int, default=256,
                        help="tokens of context per request in the bytes-per-step figure")
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--ppl-tokens", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true",
                        help="a small run for tests: 1 round, 512 perplexity tokens, "
                             "4 prompts, 8 decode tokens")


def main(args: argparse.Namespace) -> int:
    print(machine.describe())
    if args.quick:
        run(args.model, batch=4, context=args.context, decode_tokens=8, ppl_tokens=512,
            num_prompts=4, rounds=1)
    else:
        run(args.model, args.batch, args.context, args.decode_tokens, args.ppl_tokens,
            rounds=args.rounds)
    return 0
