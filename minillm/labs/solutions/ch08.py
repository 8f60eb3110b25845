"""Reference solutions of chapter 08's graded exercises."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

LOAD_BOUND = 8  # requests a replica may run ahead of the least loaded and still win on its cache


def route(spec: Any, replicas: Sequence[Any]) -> int:
    """08.1: among the replicas within LOAD_BOUND requests of the least loaded, the one whose
    cache holds the longest prefix of the request; if none holds any, the one with the most
    empty blocks (room for a new prefix without evicting), then the less loaded."""
    least = min(r.load for r in replicas)
    eligible = [r for r in replicas if r.load - least <= LOAD_BOUND]
    cached = {r.index: r.cached_prefix_len(spec) for r in eligible}
    if max(cached.values()) > 0:
        return max(eligible, key=lambda r: (cached[r.index], -r.load)).index
    return max(eligible, key=lambda r: (r.num_empty_blocks, -r.load)).index


def hit_tokens(prompts: Sequence[Sequence[int]], block_size: int) -> list[int]:
    """08.2: each prompt reuses the longest prefix it shares with any earlier prompt (all are
    cached: the pool is ample), at most all but its last token, rounded down to whole blocks."""
    hits = []
    for i, prompt in enumerate(prompts):
        shared = 0
        for earlier in prompts[:i]:
            n = 0
            while n < min(len(prompt), len(earlier)) and prompt[n] == earlier[n]:
                n += 1
            shared = max(shared, n)
        hits.append(min(shared, len(prompt) - 1) // block_size * block_size)
    return hits


SOLUTIONS = {"08.1": route, "08.2": hit_tokens}

MODEL_ANSWERS: dict[str, str] = {
    "08.3": """\
**Model answer.** The burst-before-cached case: a new system prompt's first requests arrive
together, before any replica has computed it, so cached_prefix_len is 0 everywhere and the
prefix-aware router spreads them by empty blocks over several replicas, each of which then
prefills the same prompt. A router that remembers what it sent (SGLang's router keeps an
approximate radix tree per worker of the prompts it routed, updated at send time) sees the
prefix as "sent to replica k" from the first request on and keeps the burst together. A
minimal version: a dict from the first block's worth of token ids (or a hash of the first
few blocks) to the replica that got it, consulted when no replica reports a cached prefix,
with the same load bound, and forgotten after a time or when the replica's cache could have
evicted it. On a workload of bursts of 8-16 requests per new prefix (shared_prefix with a
high rate and many prefixes), the remembered router's hit rate is several points higher than
prefix_aware's and its TTFT p50 lower, while with Poisson arrivals at moderate rates the two
agree (the first request is usually cached before the second arrives).

**Rubric (10 points).**
- 3: the burst case constructed and the prefix-aware router's miss on it measured.
- 3: a router that remembers sent prefixes, with a load bound and a way to forget.
- 2: hit rate and TTFT p50/p99 of both on the burst workload and on a Poisson one.
- 2: every figure labelled modelled, with the model and GPU.
""",
    "08.4": """\
**Model answer.** With block size 16 the chat's measured hit rate sits just under the
token-level ceiling; at 64 it loses more, because each turn's reuse ends at the last full
block of the previous turn and the partial block (up to 63 tokens) is recomputed. The loss
per request is on average half a block, so it matters in proportion to block_size / shared
length: small for a 2,000-token system prompt, large for short chat turns. Smaller blocks
cost bookkeeping (a hash chain has one node per block; the block table grows) and, on a GPU,
kernel efficiency (vLLM's default is 16). A radix tree keyed on tokens could in principle
reuse a partial block by copying it, which minillm (and vLLM) do not do: both designs give the
same hits on the same pool when nothing is evicted, and differ only in what they evict.

**Rubric (10 points).**
- 3: hit rate against block size measured for at least three sizes, with the ceiling at
  block granularity and at token granularity.
- 3: the half-a-block-per-request loss explained and checked against the numbers.
- 2: the cost of small blocks named (bookkeeping, kernel efficiency).
- 2: the hash and radix results compared on the same runs.
""",
}
