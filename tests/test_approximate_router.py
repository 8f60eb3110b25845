"""The realistic cache-aware router (minillm.router.ApproximateTreeRouter, after SGLang's router):
it routes on its own bounded tree of what it sent each replica and never reads a replica's
cache; it sends a prefix back where it sent it before, even before that replica has computed
it; its tree evicts least recently used leaves at its bound; it routes by load when the loads
drift apart; and on the fleet workload it keeps most of what the oracle (PrefixAwareRouter)
gets over round robin."""

from __future__ import annotations

import dataclasses

import pytest

from minillm.calc.models import as_config
from minillm.sim.fleet import ApproximateTreeRouter, simulate_fleet
from minillm.sim.router import RoutedPrefixTree
from minillm.workloads.prefixes import TokenRequestSpec, shared_prefix
from minillm.workloads.streams import RequestSpec, Workload

MODEL, HW = "llama-3-8b", "H100-SXM"
V = as_config(MODEL).vocab_size
P = 16  # block size


@dataclasses.dataclass
class Load:
    """All a router may know of a replica without reading its cache."""

    index: int
    load: int = 0


class LoadOnly:
    """A ReplicaView that answers index and load and refuses anything about the cache."""

    def __init__(self, view) -> None:
        self._view = view

    @property
    def index(self) -> int:
        return self._view.index

    @property
    def load(self) -> int:
        return self._view.load

    def __getattr__(self, name: str):
        raise AssertionError(f"the router read {name!r} of a replica")


def prompt(system: int, question: int, length: int = 4 * P) -> TokenRequestSpec:
    """A request whose first 3 blocks are system prompt `system` and last block is its own."""
    ids = [1 + system] * (3 * P) + [100 + question] * (length - 3 * P)
    return TokenRequestSpec(0.0, len(ids), 4, prompt_ids=tuple(ids))


def blocks(spec: TokenRequestSpec) -> list[tuple[int, ...]]:
    ids = spec.prompt_ids
    return [tuple(ids[i:i + P]) for i in range(0, len(ids) // P * P, P)]


def test_it_never_reads_a_replicas_cache() -> None:
    work = shared_prefix(120, 4, 1024, (16, 64), (16, 64), rate=20.0, vocab_size=V, seed=0)
    router = ApproximateTreeRouter()
    blind = simulate_fleet(MODEL, HW, work, num_kv_blocks=160,
                           routing=lambda spec, views: router(spec, [LoadOnly(v) for v in views]))
    named = simulate_fleet(MODEL, HW, work, num_kv_blocks=160, routing="approximate_tree")
    # The same choices with the cache hidden: it decided on load and its own tree alone.
    assert blind.assignment == named.assignment
    assert len(set(named.assignment)) == 4


def test_a_repeated_prefix_goes_where_it_was_sent_and_a_new_one_to_the_smallest_tree() -> None:
    router, views = ApproximateTreeRouter(), [Load(k) for k in range(4)]
    assert router(prompt(0, 0), views) == 0  # all trees empty: the lowest index
    assert router(prompt(1, 1), views) == 1  # no match: the smallest tree (1, 2, 3 are empty)
    assert router(prompt(2, 2), views) == 2
    assert router(prompt(0, 3), views) == 0  # its 3 blocks of system prompt were sent to 0
    assert router(prompt(1, 4), views) == 1
    # A match of 3 of 4 blocks passes cache_threshold 0.3; of 3 of 20 blocks it does not.
    assert router(prompt(2, 5, length=20 * P), views) == 3
    assert [t.num_blocks for t in router.trees] == [5, 5, 4, 20]


def test_a_cold_burst_stays_together_where_the_oracle_scatters_it() -> None:
    """Six requests with one new system prompt arrive at once: no replica has computed it, so
    the oracle, which reads the caches, sees nothing cached and spreads them; the approximate
    router counts the prompt as sent from the first request on and keeps them together."""
    burst = Workload([dataclasses.replace(s, arrival_time=0.0) for s in
                      shared_prefix(6, 1, 512, 16, 16, vocab_size=V, seed=4)])
    approx = simulate_fleet(MODEL, HW, burst, routing="approximate_tree", num_kv_blocks=400)
    oracle = simulate_fleet(MODEL, HW, burst, routing="prefix_aware", num_kv_blocks=400)
    assert approx.assignment == [0] * 6
    assert len(set(oracle.assignment)) == 4
    # Kept together, the prompt's 32 blocks are computed once; scattered, once per replica.
    assert approx.stats["prefix_cache_hits"] > oracle.stats["prefix_cache_hits"]


def test_the_tree_evicts_least_recently_used_leaves_at_its_bound() -> None:
    tree = RoutedPrefixTree(max_blocks=8)
    a, b, c = blocks(prompt(0, 0)), blocks(prompt(1, 1)), blocks(prompt(2, 2))
    tree.insert(a)
    tree.insert(b)
    assert tree.num_blocks == 8 and tree.match(a) == tree.match(b) == 4
    tree.insert(a)  # a is now the most recently used
    tree.insert(a[:3] + blocks(prompt(0, 9))[3:])  # shares a's 3 system blocks: one new node
    # 9 nodes > 8: b's deepest block goes first (b is least recent; a leaf before its parent).
    assert tree.num_blocks == 8 and tree.match(b) == 3 and tree.match(a) == 4
    tree.insert(c)  # 4 new nodes, 4 to evict: b's 3 left, deepest first, then the least
    # recently used leaf after them: a's own, touched before its sibling was sent
    assert tree.num_blocks == 8
    assert (tree.match(a), tree.match(b), tree.match(c)) == (3, 0, 4)
    assert tree.match(blocks(prompt(0, 9))) == 4  # the sibling, more recent, stays whole
    assert not tree.root.get(b[0])  # no node of b is stranded below the root


def test_a_bounded_tree_forgets_a_prefix_and_routes_it_as_new() -> None:
    router, views = ApproximateTreeRouter(max_tree_tokens=8 * P), [Load(0), Load(1)]
    assert router(prompt(0, 0), views) == 0
    assert router(prompt(1, 1), views) == 1
    for question in range(2, 6):  # four more questions on prompt 1 fill replica 1's tree...
        assert router(prompt(1, question), views) == 1
    assert router.trees[1].num_blocks == 8  # ...up to its bound (3 shared + 5 private blocks)
    views = [Load(0, load=3), Load(1)]
    assert router(prompt(0, 6), views) == 0  # still remembered: load 3 is within the bound
    for question in range(7, 13):  # six more to replica 0 push prompt 0's first question out
        router(prompt(0, question), views)
    assert router.trees[0].num_blocks == 8 and router.trees[0].match(blocks(prompt(0, 0))) == 3


@pytest.mark.parametrize(("loads", "expected"), [
    ((20, 5, 6, 7), 1),    # 15 apart (> 8) and 20 > 1.5 x 5: imbalanced, the least loaded
    ((12, 5, 6, 7), 0),    # 7 apart: within the absolute threshold, the cache wins
    ((40, 30, 30, 31), 0),  # 10 apart but 40 < 1.5 x 30: within the relative one
], ids=["imbalanced", "within the absolute threshold", "within the relative threshold"])
def test_it_routes_by_load_only_when_the_loads_drift_apart(loads, expected) -> None:
    router = ApproximateTreeRouter(balance_abs_threshold=8, balance_rel_threshold=1.5)
    router(prompt(0, 0), [Load(k) for k in range(4)])  # prompt 0 now lives on replica 0
    assert router(prompt(0, 1), [Load(k, n) for k, n in enumerate(loads)]) == expected
    # Either way the prompt enters the tree of the replica that got it, as SGLang's does.
    assert router.trees[expected].match(blocks(prompt(0, 1))) == 4


def test_on_the_fleet_workload_it_keeps_most_of_the_oracles_gain() -> None:
    work = shared_prefix(120, 4, 1024, (16, 64), (16, 64), rate=20.0, vocab_size=V, seed=0)
    runs = {routing: simulate_fleet(MODEL, HW, work, num_kv_blocks=160, routing=routing)
            for routing in ("round_robin", "prefix_aware", "approximate_tree")}
    rr, oracle, approx = (runs[r].hit_rate for r in runs)
    # Each system prompt gets a replica of its own in both: 0.94 of the blocks for either.
    assert approx - rr >= 0.85 * (oracle - rr)
    again = simulate_fleet(MODEL, HW, work, num_kv_blocks=160, routing="approximate_tree")
    assert again.assignment == runs["approximate_tree"].assignment  # a fresh tree per run


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="cache_threshold"):
        ApproximateTreeRouter(cache_threshold=1.5)
    with pytest.raises(ValueError, match="balance_rel_threshold"):
        ApproximateTreeRouter(balance_rel_threshold=0.5)
    with pytest.raises(ValueError, match="max_tree_tokens"):
        ApproximateTreeRouter(max_tree_tokens=8)
    with pytest.raises(ValueError, match="max_blocks"):
        RoutedPrefixTree(0)
    with pytest.raises(ValueError, match="prompt_ids"):
        ApproximateTreeRouter()(RequestSpec(0.0, 64, 4), [Load(0)])  # no ids to read
