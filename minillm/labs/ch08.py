"""Graded exercises of chapter 08 (prefix caching).

08.1 runs the reader's router inside the fleet simulator (minillm.fleet.simulate_fleet): a
callable route(spec, replicas) -> replica index, called once per arriving request with its
spec (its ids in spec.prompt_ids) and one minillm.router.ReplicaView per replica (load,
num_empty_blocks, cached_prefix_len(spec)). It is graded on fixed workloads of hot system
prompts, modelled for Llama-3-8B on H100-SXM replicas, on the fleet's prefix-cache hit rate
and on how evenly the requests spread (the two things a cache-aware router trades).
08.2 asks for the hits the engine's prefix cache counts on constructed prompts, checked
against the engine itself: the shipped tiny model serves the prompts one at a time.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from minillm.labs.exercise import Exercise, expect_callable
from minillm.workloads.prefixes import random_tokens, shared_prefix
from minillm.workloads.streams import Workload

# ---- 08.1: a cache-aware router, run in the fleet simulator ---------------------------------

MODEL, HARDWARE = "llama-3-8b", "H100-SXM"
VOCAB = 128256  # Llama-3's vocabulary: the workloads' ids must fit it


@dataclass(frozen=True)
class RoutingCase:
    """A fleet and its traffic: requests with one of num_prefixes hot system prompts (Zipf),
    a KV pool per replica too small to hold every prefix, arrivals fast enough to queue."""

    num_replicas: int
    num_requests: int
    rate: float  # requests/s, Poisson
    num_kv_blocks: int  # per replica, of 16 tokens
    seed: int

    def workload(self) -> Workload:
        return shared_prefix(self.num_requests, 16, 2048, (32, 128), (64, 256), self.rate,
                             vocab_size=VOCAB, zipf=1.0, seed=self.seed)


ROUTING_CASES = [RoutingCase(4, 400, 100.0, 1200, 0), RoutingCase(8, 400, 200.0, 1200, 1)]
# A router passes with at least this block hit rate (round robin reaches about 0.70 on these
# cases, the reference about 0.92, the ideal with every prefix cached everywhere 0.94) ...
MIN_HIT_RATE = 0.85
# ... and no replica serving more than this times the fair share (a router with no load bound
# stacks the hottest prompt on one replica: 1.5-2.1x here; the reference stays under 1.1x).
MAX_IMBALANCE = 1.3


@dataclass(frozen=True)
class RoutingScore:
    hit_rate: float
    imbalance: float  # the busiest replica's requests / the mean
    ttft_p99: float  # seconds


def run_router(route: Callable[..., Any], case: RoutingCase) -> RoutingScore:
    """Serve case's workload behind route; raises ValueError if route returns a bad index."""
    from minillm.sim.fleet import simulate_fleet  # the simulator: imported when a grader runs

    fleet = simulate_fleet(MODEL, HARDWARE, case.workload(), num_replicas=case.num_replicas,
                           routing=route, num_kv_blocks=case.num_kv_blocks)
    counts = [r.num_requests for r in fleet.replicas]
    return RoutingScore(fleet.hit_rate, max(counts) * len(counts) / sum(counts),
                        fleet.summary().ttft.p99)


def routing_hint(score: RoutingScore) -> str:
    if score.imbalance > MAX_IMBALANCE:
        return (" (the traffic piled onto few replicas: bound the load, e.g. only consider "
                "replicas whose load is within a few requests of the least loaded)")
    if score.hit_rate < 0.75:
        return (" (that is about what round robin gets: ask each replica how much of the "
                "request it holds, replicas[i].cached_prefix_len(spec), and prefer the most)")
    return (" (when no replica holds the prefix, start it where there is room: the replica "
            "with the most empty blocks, num_empty_blocks, rather than always the same one)")


def grade_router(route: Any) -> str:
    expect_callable(route, "route(spec, replicas) -> index of a replica")
    for case in ROUTING_CASES:
        try:
            score = run_router(route, case)
        except ValueError as err:
            if "the router sent request" not in str(err):
                raise
            raise AssertionError(f"{err} (return replicas[i].index or i, an int, never the "
                                 "ReplicaView itself or None)") from None
        where = (f"{case.num_replicas} replicas, {case.num_requests} requests at "
                 f"{case.rate:g}/s sharing 16 hot 2,048-token system prompts")
        assert score.hit_rate >= MIN_HIT_RATE, (
            f"{where}: your router's fleet hit rate is {score.hit_rate:.1%}, below the "
            f"{MIN_HIT_RATE:.0%} a cache-aware router reaches{routing_hint(score)}")
        assert score.imbalance <= MAX_IMBALANCE, (
            f"{where}: the busiest replica served {score.imbalance:.2f}x its fair share of "
            f"requests (at most {MAX_IMBALANCE}x passes; TTFT p99 {score.ttft_p99 * 1e3:.0f} ms)"
            f"{routing_hint(score)}")
    return ("a cache-aware router sends a request where its prefix is cached unless that replica "
            "runs ahead of the least loaded: the hits of affinity with the spread of balancing")


# ---- 08.2: hand-count the engine's hits ------------------------------------------------------

def constructed_prompts(seed: int, block_size: int) -> list[list[int]]:
    """Prompts of known overlap, in the order sent: a shared system prompt whose length is not
    a multiple of the block size, questions under it, a prompt sent twice, a prompt that shares
    only with an earlier prompt (not the one just before it), a prompt of whole blocks sent
    twice, and one that shares nothing. Ids in [1, 4096): the shipped model's vocabulary."""
    rng = random.Random(seed)
    system = random_tokens(rng, 3 * block_size + rng.randint(1, block_size - 1), 4096)
    q1, q2 = (random_tokens(rng, rng.randint(5, 2 * block_size), 4096) for _ in range(2))
    other = random_tokens(rng, 2 * block_size + rng.randint(1, block_size), 4096)
    whole = random_tokens(rng, 2 * block_size, 4096)  # whole blocks: its repeat loses one
    return [list(p) for p in (
        system + q1, system + q2, other + q1, system + q1,  # the repeat: all but its last token
        system + q1 + q2,  # extends an earlier prompt
        other + q2 + q1,  # shares only with the prompt three before it
        whole, whole, random_tokens(rng, block_size + 3, 4096))]


HIT_CASES = [(0, 16), (1, 8), (2, 32)]  # (seed, block size)


@functools.cache
def case_hits(seed: int, block_size: int) -> tuple[int, ...]:
    """engine_hits of a HIT_CASES case, measured once per session (an engine loads in seconds)."""
    return tuple(engine_hits(constructed_prompts(seed, block_size), block_size))


def engine_hits(prompts: Sequence[Sequence[int]], block_size: int) -> list[int]:
    """Prompt tokens each request reused, as the engine counts them: the shipped tiny model,
    prefix caching on (hash), an ample pool, the prompts sent one at a time, one token out."""
    from minillm import LLM, SamplingParams  # the engine: loaded when a grader runs

    llm = LLM(enable_prefix_caching=True, block_size=block_size, max_model_len=256,
              num_kv_blocks=4096 // block_size)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    hits, before = [], 0
    for prompt in prompts:
        llm.generate([list(prompt)], params, use_tqdm=False)
        total = llm.stats()["prefix_cache_hit_tokens"]
        hits.append(total - before)
        before = total
    return hits


def hits_hint(got: list, prompts: Sequence[Sequence[int]], block_size: int) -> str:
    def lcp(a: Sequence[int], b: Sequence[int]) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    def best(i: int, earlier: range) -> int:
        return max((lcp(prompts[i], prompts[j]) for j in earlier), default=0)

    n = range(len(prompts))
    tokens = [best(i, range(i)) for i in n]
    if got == tokens:
        return (" (the cache holds whole blocks only: round each shared prefix down to a "
                "multiple of the block size)")
    if got == [t // block_size * block_size for t in tokens]:
        return (" (a prompt sent again cannot reuse its last token: the step must compute it to "
                "sample the first output token, so match at most len(prompt) - 1 tokens)")
    previous = [min(best(i, range(max(0, i - 1), i)), len(prompts[i]) - 1)
                // block_size * block_size for i in n]
    if got == previous:
        return (" (the cache keeps every earlier prompt, not just the one before: match against "
                "all of them)")
    if got == [-(-min(t, len(p) - 1) // block_size) * block_size for t, p in zip(tokens, prompts)]:
        return " (a partly shared block is not reused: round down, not up)"
    return ""


def grade_hits(count: Any) -> str:
    expect_callable(count, "hit_tokens(prompts, block_size) -> tokens reused, per prompt")
    for seed, block_size in HIT_CASES:
        prompts = constructed_prompts(seed, block_size)
        got = count([list(p) for p in prompts], block_size)
        assert got is not None, "hit_tokens returned None"
        got = list(got)
        want = list(case_hits(seed, block_size))
        assert got == want, (
            f"prompts of {[len(p) for p in prompts]} tokens, block size {block_size}, sent one "
            f"at a time: the engine reused {want} tokens of them, you returned {got}"
            f"{hits_hint(got, prompts, block_size)}")
    return ("a request reuses the longest prefix it shares with anything cached, less its last "
            "token, in whole blocks: the engine's stats() agree token for token")


EXERCISES = [
    Exercise("08.1", "A cache-aware router",
             "Write route(spec, replicas) -> the index of the replica to serve the request, "
             "for the fleet simulator: keep the prefix-cache hit rate high and the load even.",
             grade_router),
    Exercise("08.2", "Hand-count the prefix cache's hits",
             "Write hit_tokens(prompts, block_size) -> for each prompt, sent one at a time, the "
             "prompt tokens whose KV the engine's prefix cache reuses.",
             grade_hits),
]
