"""Prompt sets for the serving benchmark: random token ids, Shakespeare passages, ShareGPT.

Each builder returns a minillm.workload.Workload: one RequestSpec per request with its prompt
length, its exact output length (the client sends max_tokens with ignore_eos, so the server
generates exactly that many) and its arrival time, drawn as vLLM's benchmark draws them: the
first request at 0 s, then gamma gaps of mean 1/rate (shape burstiness; 1 = Poisson; rate inf
sends everything at once).

- random: prompts of random token ids (sent as id lists, so prompt_tokens is exact), lengths
  uniform in [L(1 - r), L(1 + r)] for a length L and range ratio r.
- shakespeare: passages from the plays (minillm/assets/shakespeare_prompts.txt), sent as text.
- sharegpt: the first human turn of each ShareGPT conversation as the prompt and the length of
  the reply as the output length, filtered as vLLM filters them.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

from minillm.workloads.streams import RequestSpec, Workload, arrival_times, poisson

SHAKESPEARE_PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "shakespeare_prompts.txt"
DATASETS = ("random", "shakespeare", "sharegpt")


def length_range(length: int, range_ratio: float) -> int | tuple[int, int]:
    """A length of `length` tokens, or uniform integers in [L(1 - r), L(1 + r)] (vLLM's rule)."""
    if not (isinstance(length, int) and length >= 1):
        raise ValueError(f"a length must be an integer >= 1 token, got {length!r}")
    if not (isinstance(range_ratio, (int, float)) and 0 <= range_ratio < 1):
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio!r}")
    lo, hi = max(int(length * (1 - range_ratio)), 1), int(length * (1 + range_ratio))
    return length if lo == hi else (lo, hi)


def random_requests(num_prompts: int, input_len: int, output_len: int, range_ratio: float = 0.0,
                    rate: float = math.inf, burstiness: float = 1.0, seed: int = 0) -> Workload:
    """Prompts of random token ids: input and output lengths in tokens (see length_range)."""
    return poisson(num_prompts, rate, length_range(input_len, range_ratio),
                   length_range(output_len, range_ratio), seed, burstiness)


def shakespeare_passages(path: str | Path = SHAKESPEARE_PROMPTS) -> list[str]:
    """The passages of a prompt file: blocks separated by lines holding only '---'; '#' lines
    before the first block are comments."""
    text = Path(path).read_text(encoding="utf-8")
    blocks = [b.strip("\n") for b in text.split("\n---\n")]
    passages = [b + "\n" for b in blocks if b.strip() and not b.lstrip().startswith("#")]
    if not passages:
        raise ValueError(f"{path} holds no passages")
    return passages


def shakespeare_requests(num_prompts: int, tokenizer: Any, output_len: int,
                         range_ratio: float = 0.0, rate: float = math.inf,
                         burstiness: float = 1.0, seed: int = 0,
                         path: str | Path = SHAKESPEARE_PROMPTS) -> Workload:
    """Passages from the plays, drawn at random (with replacement) and sent as text.

    tokenizer counts each prompt's tokens (it should be the server's); output lengths as
    length_range(output_len, range_ratio).
    """
    passages = shakespeare_passages(path)
    lens = [len(tokenizer.encode(p)) for p in passages]
    rng = random.Random(seed)
    out = length_range(output_len, range_ratio)
    specs = []
    for t in arrival_times(rng, _count(num_prompts), _rate(rate), burstiness):
        i = rng.randrange(len(passages))
        n = out if isinstance(out, int) else rng.randint(*out)
        specs.append(RequestSpec(t, lens[i], n, prompt=passages[i]))
    return Workload(specs, rate=rate)


def sharegpt_requests(path: str | Path, num_prompts: int, tokenizer: Any,
                      output_len: int | None = None, rate: float = math.inf,
                      burstiness: float = 1.0, seed: int = 0, max_prompt_len: int = 1024,
                      max_total_len: int = 2048) -> Workload:
    """Conversations from a ShareGPT-format JSON file (a list of {"conversations": [{"from",
    "value"}, ...]}): the first turn is the prompt, the second's token count the output length
    unless output_len fixes it. Conversations are shuffled with seed; like vLLM, those with a
    prompt or reply under 4 tokens, a prompt over max_prompt_len or a total over
    max_total_len are skipped.
    """
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise ValueError(f"{path}: a ShareGPT file holds a JSON list of conversations")
    pairs = [(c["conversations"][0]["value"], c["conversations"][1]["value"]) for c in data
             if isinstance(c, dict) and len(c.get("conversations", [])) >= 2]
    rng = random.Random(seed)
    rng.shuffle(pairs)
    n = _count(num_prompts)
    chosen: list[tuple[str, int, int]] = []
    for prompt, reply in pairs:
        if len(chosen) == n:
            break
        prompt_len = len(tokenizer.encode(prompt))
        out_len = output_len if output_len is not None else len(tokenizer.encode(reply))
        if prompt_len < 4 or out_len < 4 or prompt_len > max_prompt_len \
                or prompt_len + out_len > max_total_len:
            continue
        chosen.append((prompt, prompt_len, out_len))
    if len(chosen) < n:
        raise ValueError(f"{path}: only {len(chosen)} usable conversations, {n} asked for")
    times = arrival_times(rng, n, _rate(rate), burstiness)
    specs = [RequestSpec(t, p_len, o_len, prompt=prompt)
             for t, (prompt, p_len, o_len) in zip(times, chosen)]
    return Workload(specs, rate=rate)


def load_dataset(name: str, num_prompts: int, *, tokenizer: Any = None,
                 dataset_path: str | Path | None = None, input_len: int = 40,
                 output_len: int = 20, range_ratio: float = 0.0, rate: float = math.inf,
                 burstiness: float = 1.0, seed: int = 0,
                 sharegpt_output_len: int | None = None) -> Workload:
    """One of DATASETS by name, with the benchmark's --dataset-* and --random-* arguments.

    input_len applies to random prompts only; output_len and range_ratio to random and
    shakespeare; a sharegpt output is as long as the recorded reply unless sharegpt_output_len.
    """
    if name == "random":
        return random_requests(num_prompts, input_len, output_len, range_ratio, rate,
                               burstiness, seed)
    if tokenizer is None:
        raise ValueError(f"the {name} data set needs a tokenizer to count prompt tokens")
    if name == "shakespeare":
        return shakespeare_requests(num_prompts, tokenizer, output_len, range_ratio, rate,
                                    burstiness, seed, dataset_path or SHAKESPEARE_PROMPTS)
    if name == "sharegpt":
        if dataset_path is None:
            raise ValueError("the sharegpt data set needs --dataset-path FILE.json")
        return sharegpt_requests(dataset_path, num_prompts, tokenizer, sharegpt_output_len,
                                 rate, burstiness, seed)
    raise ValueError(f"unknown data set {name!r}; use one of {', '.join(DATASETS)}")


def _count(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"num_prompts must be an integer >= 1, got {n!r}")
    return n


def _rate(rate: object) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise ValueError(f"rate must be a positive number of requests/s (or inf), got {rate!r}")
    return float(rate)
