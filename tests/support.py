"""Helpers that more than one test file uses (a test file never imports another)."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import torch

from minillm.attention.torch_ref import TorchAttention
from minillm.batch import build_batch
from minillm.kv_cache import BlockManager, PrefixMatch
from minillm.model import LlamaForCausalLM
from minillm.prefix_cache.radix import RadixCache
from minillm.prefix_cache.radix_blocks import RadixPrefixCache
from minillm.request import Request
from minillm.sampling import SamplingParams
from minillm.scheduler import ScheduledRequest


def admit(bm: BlockManager, req: Request) -> PrefixMatch:
    """Admission as the scheduler does it: reuse the cached prefix, compute the rest."""
    match = bm.match_prefix(req.token_ids)
    assert bm.allocate(req, req.num_tokens, match)
    req.num_computed_tokens = req.num_tokens
    bm.cache_full_blocks(req)
    return match


def radix_tree(bm: BlockManager) -> RadixCache | None:
    """The block manager's radix tree, or None when its prefix cache is not a radix one."""
    cache = bm.prefix_cache
    return cache.tree if isinstance(cache, RadixPrefixCache) else None


def paged_logits(model: LlamaForCausalLM, prompts: list[list[int]], block_size: int,
                 chunk: int | None = None, seed: int = 0) -> list[torch.Tensor]:
    """minillm's logits at every prompt position, all prompts batched in each step.

    Each step runs up to `chunk` more tokens of every prompt (all of it when None) over its
    cached prefix; block tables come from a shuffled pool. Returns one (T, V) per prompt.
    """
    mc = model.config
    dtype = model.lm_head.weight.dtype
    needs = [-(-len(p) // block_size) for p in prompts]
    num_blocks = sum(needs) + 2
    pool = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
    kv_cache = torch.zeros(mc.num_hidden_layers, 2, num_blocks, block_size,
                           mc.num_key_value_heads, mc.head_dim, dtype=dtype)
    reqs = []
    for i, (prompt, n) in enumerate(zip(prompts, needs, strict=True)):
        req = Request(str(i), prompt, SamplingParams(), arrival_time=0.0)
        req.block_table, pool = pool[:n], pool[n:]
        reqs.append(req)
    done = [0] * len(prompts)
    rows: list[list[torch.Tensor]] = [[] for _ in prompts]
    while any(d < len(p) for d, p in zip(done, prompts, strict=True)):
        scheduled = []
        for req, d in zip(reqs, done, strict=True):
            n = min(req.num_tokens - d, chunk or req.num_tokens)
            if n > 0:
                scheduled.append(ScheduledRequest(req, n, d, "prefill"))
        batch = build_batch(scheduled, block_size, torch.device("cpu"))
        hidden = model(batch.input_ids, batch.positions, kv_cache, batch.attn, TorchAttention())
        logits = model.compute_logits(hidden)  # (T, V)
        for s, part in zip(scheduled, logits.split(batch.attn.query_lens), strict=True):
            i = int(s.request.request_id)
            rows[i].append(part)
            done[i] += s.num_tokens
    return [torch.cat(r) for r in rows]


def open_stream(port: int, max_tokens: int) -> socket.socket:
    """A raw streaming completion on loopback, returned once three SSE events have arrived (the
    stream is running): the caller hangs up by closing it."""
    sock = socket.create_connection(("127.0.0.1", port))
    body = json.dumps({"prompt": "ROMEO.\n", "max_tokens": max_tokens, "ignore_eos": True,
                       "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(body), body))
    received = b""
    while received.count(b"data: ") < 3:
        received += sock.recv(65536)
    return sock


# ---- faults to plant in an engine, in this process or in an engine core's own ----------------
# Each takes the LLM once it is built: EngineCoreClient(hook="support:NAME") calls it inside the
# core process (its sys.path is the test process's, so this module imports there too).

POISONED_SEED = 4242  # sampling a batch with a request of this seed raises


def poison_sampler(llm: Any) -> None:
    """Sampling fails for any batch holding a request seeded POISONED_SEED (as a bad top-k
    index would), and only for those: the engine retries each request alone."""
    engine = llm.engine
    sampler = engine.sampler

    def fragile(logits, params, generators):
        if any(p.seed == POISONED_SEED for p in params):
            raise RuntimeError("selected index k out of range")
        return sampler(logits, params, generators)

    engine.sampler = fragile


def _replace_step(llm: Any, step: Any) -> None:
    llm.engine.run_step = step  # Engine.step and the engine core both step through run_step


def fail_after_five_steps(llm: Any) -> None:
    """The sixth step, and every one after it, raises: a kernel that has started failing."""
    step, steps = llm.engine.run_step, []

    def failing():
        steps.append(1)
        if len(steps) > 5:
            raise RuntimeError("simulated kernel failure")
        return step()

    _replace_step(llm, failing)


def fail_every_step(llm: Any) -> None:
    def broken():
        raise RuntimeError("simulated kernel failure")

    _replace_step(llm, broken)


def slow_steps(llm: Any) -> None:
    """Each step takes 20 ms longer, so no long request can finish in a short grace period."""
    step = llm.engine.run_step

    def slow():
        time.sleep(0.02)
        return step()

    _replace_step(llm, slow)
