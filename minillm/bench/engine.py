"""Throughput of continuous vs static batching vs transformers' generate on one workload.

The workload is heavy-tailed, as real traffic is: most requests want a short answer, a few want
a long one. Static batching (and transformers' generate, which pads a batch and runs it until
its longest member is done) keeps the seats of finished requests idle until the slowest one
finishes; continuous batching refills them every step. All three serve the same requests with
the same model, dtype and batch size; throughput counts only the tokens each request asked for.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from minillm.llm import LLM, default_model_path
from minillm.sampling import SamplingParams


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    max_tokens: int


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


def run_minillm(path: Path, reqs: list[BenchRequest], batch_size: int, scheduling: str) -> float:
    """Seconds for minillm to serve every request."""
    llm = LLM(path, max_num_seqs=batch_size, scheduling=scheduling, device="cpu")
    params = [SamplingParams(max_tokens=r.max_tokens, temperature=0, ignore_eos=True)
              for r in reqs]
    prompts = [r.prompt_token_ids for r in reqs]
    llm.generate(prompts[:batch_size], params[:batch_size], use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert all(len(o.token_ids) == r.max_tokens for o, r in zip(outs, reqs))
    assert llm.stats()["num_free_blocks"] == llm.stats()["num_blocks"]
    return elapsed


def run_transformers(path: Path, reqs: list[BenchRequest], batch_size: int) -> float:
    """Seconds for transformers' generate over padded static batches in arrival order."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    pad = model.config.eos_token_id or 0
    batches = [reqs[i:i + batch_size] for i in range(0, len(reqs), batch_size)]
    _generate_padded(model, batches[0][:2], pad)  # warm-up
    start = time.perf_counter()
    for batch in batches:
        _generate_padded(model, batch, pad)
    return time.perf_counter() - start


def _generate_padded(model: torch.nn.Module, batch: list[BenchRequest], pad: int) -> None:
    longest = max(len(r.prompt_token_ids) for r in batch)
    ids = torch.full((len(batch), longest), pad)  # left padding, as decoder-only generate needs
    mask = torch.zeros_like(ids)
    for i, r in enumerate(batch):
        ids[i, longest - len(r.prompt_token_ids):] = torch.tensor(r.prompt_token_ids)
        mask[i, longest - len(r.prompt_token_ids):] = 1
    steps = max(r.max_tokens for r in batch)  # a batch runs until its longest request is done
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps,
                       min_new_tokens=steps, do_sample=False, pad_token_id=pad)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--num-requests", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)


def main(args: argparse.Namespace) -> dict[str, float]:
    from minillm.model_config import ModelConfig

    vocab = ModelConfig.from_pretrained(args.model).vocab_size
    reqs = heavy_tailed_workload(args.num_requests, vocab, args.seed)
    tokens = sum(r.max_tokens for r in reqs)
    print(f"workload: {len(reqs)} requests, {tokens} output tokens "
          f"({sum(r.max_tokens > 32 for r in reqs)} long), batch size {args.batch_size}, "
          f"{torch.get_num_threads()} threads, model {args.model.name}")
    seconds = {
        "minillm continuous": run_minillm(args.model, reqs, args.batch_size, "continuous"),
        "minillm static": run_minillm(args.model, reqs, args.batch_size, "static"),
        "transformers generate": run_transformers(args.model, reqs, args.batch_size),
    }
    rates = {name: tokens / s for name, s in seconds.items()}
    print(f"{'engine':<24}{'seconds':>10}{'tokens/s':>12}")
    for name, s in seconds.items():
        print(f"{name:<24}{s:>10.2f}{rates[name]:>12.1f}")
    cont = rates["minillm continuous"]
    ratios = {"continuous / static": cont / rates["minillm static"],
              "continuous / transformers": cont / rates["transformers generate"]}
    for name, r in ratios.items():
        print(f"{name}: {r:.2f}x")
    return ratios
