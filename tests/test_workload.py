"""Synthetic workloads: seeded, with the arrival process and length distributions they claim."""

import math
import random
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.workloads import streams as wl
from minillm.workloads.streams import (
    Choice,
    LogNormal,
    Mixture,
    RequestSpec,
    Uniform,
    Workload,
    closed_loop,
    poisson,
    shared_prefix,
)


def draw(dist, n=4000, seed=0):
    rng = random.Random(seed)
    return [dist.sample(rng) for _ in range(n)]


def test_same_arguments_same_workload():
    for make in (lambda s: poisson(50, 3.0, (4, 64), LogNormal(20, 0.8), seed=s),
                 lambda s: closed_loop(50, 4, 16, (1, 9), seed=s),
                 lambda s: shared_prefix(50, 2.0, 32, 3, (1, 8), 4, seed=s)):
        a, b, c = make(7), make(7), make(8)
        assert a == b and a.concurrency == b.concurrency and a.rate == b.rate
        assert a != c
        assert [s.token_ids(4096) for s in a] == [s.token_ids(4096) for s in b]


def test_poisson_inter_arrival_mean_is_one_over_rate():
    w = poisson(4000, rate=5.0, prompt_len=8, output_len=4, seed=1)
    times = [s.arrival_time for s in w]
    assert times[0] == 0.0 and times == sorted(times)
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1 / 5.0, rel=0.08)
    assert gaps.std() == pytest.approx(1 / 5.0, rel=0.1)  # exponential: std = mean
    assert w.concurrency is None and not w.is_closed_loop and w.rate == 5.0


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_burstiness_keeps_the_mean_gap_and_sets_the_spread(burstiness):
    """Gamma gaps of shape k and mean 1/rate have std (1/rate)/sqrt(k): k < 1 bursts."""
    w = poisson(4000, rate=5.0, prompt_len=8, output_len=4, seed=2, burstiness=burstiness)
    gaps = np.diff([s.arrival_time for s in w])
    assert gaps.mean() == pytest.approx(1 / 5.0, rel=0.1)
    assert gaps.std() == pytest.approx(1 / 5.0 / math.sqrt(burstiness), rel=0.12)
    assert poisson(20, 5.0, 8, 4, seed=2, burstiness=1.0) == poisson(20, 5.0, 8, 4, seed=2)


def test_infinite_rate_arrives_at_once_and_closed_loop_at_zero():
    assert all(s.arrival_time == 0.0 for s in poisson(10, math.inf, 8, 4))
    w = closed_loop(10, concurrency=3, prompt_len=8, output_len=4)
    assert w.concurrency == 3 and w.is_closed_loop
    assert all(s.arrival_time == 0.0 for s in w)
    assert "closed loop, concurrency 3" in repr(w)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), lo=st.integers(1, 50), span=st.integers(0, 50),
       median=st.floats(1, 200), sigma=st.floats(0, 3), vocab=st.integers(2, 50))
def test_lengths_stay_in_bounds_and_ids_in_vocab(seed, lo, span, median, sigma, vocab):
    w = poisson(8, 2.0, Uniform(lo, lo + span), LogNormal(median, sigma, lo, lo + span), seed)
    for spec in w:
        assert lo <= spec.prompt_len <= lo + span and lo <= spec.output_len <= lo + span
        ids = spec.token_ids(vocab)
        assert len(ids) == spec.prompt_len and all(1 <= t < vocab for t in ids)


def test_a_slice_keeps_how_the_workload_is_driven():
    w = closed_loop(6, 2, 8, 4)
    assert isinstance(w[:3], Workload) and w[:3].concurrency == 2 and len(w[:3]) == 3
    assert isinstance(w[0], RequestSpec)


def test_int_and_tuple_lengths():
    w = poisson(300, 1.0, prompt_len=(3, 9), output_len=5, seed=2)
    prompts = {s.prompt_len for s in w}
    assert prompts == set(range(3, 10))  # inclusive at both ends
    assert {s.output_len for s in w} == {5}


def test_uniform_within_bounds_and_median():
    xs = draw(Uniform(10, 30))
    assert min(xs) == 10 and max(xs) == 30
    assert statistics.median(xs) == pytest.approx(20, abs=1)


def test_lognormal_clipped_with_its_median():
    xs = draw(LogNormal(median=50, sigma=1.0, lo=5, hi=400))
    assert 5 <= min(xs) and max(xs) <= 400
    assert min(xs) == 5 and max(xs) == 400  # sigma 1 reaches both clips in 4000 draws
    assert statistics.median(xs) == pytest.approx(50, rel=0.1)
    assert all(x >= 1 for x in draw(LogNormal(2, 2.0)))  # lo defaults to 1


def test_mixture_and_choice_proportions():
    xs = draw(Mixture([(0.9, Uniform(8, 32)), (0.1, (192, 256))]))
    long = [x for x in xs if x >= 192]
    assert all(8 <= x <= 32 or 192 <= x <= 256 for x in xs)
    assert len(long) / len(xs) == pytest.approx(0.1, abs=0.02)
    assert 8 <= statistics.median(xs) <= 32
    ys = draw(Choice([16, 256], weights=[3, 1]))
    assert set(ys) == {16, 256} and ys.count(256) / len(ys) == pytest.approx(0.25, abs=0.03)
    assert set(draw(Choice([1, 2, 3]), n=200)) == {1, 2, 3}


def test_shared_prefix_token_ids_share_the_prefix():
    w = shared_prefix(40, rate=10.0, prefix_len=24, num_prefixes=3, suffix_len=(1, 10),
                      output_len=4, seed=5)
    assert {s.prefix_id for s in w} == {0, 1, 2}
    ids = [s.token_ids(4096) for s in w]
    for spec, toks in zip(w, ids):
        assert len(toks) == spec.prompt_len and 25 <= spec.prompt_len <= 34
        assert all(1 <= t < 4096 for t in toks)  # 0 is eos in the shipped model
    by_prefix: dict[int, list[list[int]]] = {}
    for spec, toks in zip(w, ids):
        by_prefix.setdefault(spec.prefix_id, []).append(toks)
    prefixes = {pid: {tuple(t[:24]) for t in group} for pid, group in by_prefix.items()}
    assert all(len(p) == 1 for p in prefixes.values())  # same prefix_id, same 24 tokens
    assert len({next(iter(p)) for p in prefixes.values()}) == 3  # different ids differ
    suffixes = [tuple(t[24:]) for t in ids]
    assert len(set(suffixes)) > 30  # suffixes come from each spec's own seed


def test_token_ids_depend_on_seed_only():
    a = RequestSpec(0.0, 12, 4, seed=1).token_ids(100)
    assert a == RequestSpec(3.0, 12, 9, seed=1).token_ids(100)
    assert a != RequestSpec(0.0, 12, 4, seed=2).token_ids(100)


@pytest.mark.parametrize("call, match", [
    (lambda: poisson(0, 1.0, 8, 4), "num_requests"),
    (lambda: poisson(5, 0.0, 8, 4), "rate"),
    (lambda: poisson(5, -2, 8, 4), "rate"),
    (lambda: poisson(5, float("nan"), 8, 4), "rate"),
    (lambda: poisson(5, 1.0, 0, 4), "prompt_len"),
    (lambda: poisson(5, 1.0, 8, (9, 3)), "output_len"),
    (lambda: poisson(5, 1.0, 8, "long"), "output_len"),
    (lambda: poisson(5, 1.0, 8.5, 4), "prompt_len"),
    (lambda: closed_loop(5, 0, 8, 4), "concurrency"),
    (lambda: shared_prefix(5, 1.0, 0, 1, 4, 4), "prefix_len"),
    (lambda: shared_prefix(5, 1.0, 8, 0, 4, 4), "num_prefixes"),
    (lambda: Uniform(0, 4), "lo"),
    (lambda: LogNormal(-1, 0.5), "median"),
    (lambda: LogNormal(10, 0.5, lo=8, hi=4), "lo <= hi"),
    (lambda: Mixture([]), "at least one"),
    (lambda: Mixture([(-1, 4)]), "weights"),
    (lambda: Choice([1, 2], weights=[1]), "weights"),
    (lambda: RequestSpec(-1.0, 8, 4), "arrival_time"),
    (lambda: RequestSpec(0.0, 8, 4, prefix_id=0, prefix_len=9), "prefix_len=9"),
    (lambda: RequestSpec(0.0, 8, 4, prefix_len=2), "prefix_id"),
    (lambda: RequestSpec(0.0, 8, 4).token_ids(1), "vocab_size"),
    (lambda: RequestSpec(0.0, 8, 4, prompt=""), "prompt"),
    (lambda: poisson(5, 1.0, 8, 4, burstiness=0), "burstiness"),
    (lambda: Workload([1, 2]), "RequestSpec"),
])
def test_bad_values_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_as_distribution_accepts_custom_objects():
    class Always7:
        def sample(self, rng: random.Random) -> int:
            return 7

    w = poisson(3, 1.0, Always7(), 2)
    assert [s.prompt_len for s in w] == [7, 7, 7]
    assert isinstance(wl.as_distribution(4, "x"), wl.Fixed)


def test_arrivals_send_an_open_loop_on_time_and_a_closed_loop_at_each_finish():
    specs = [wl.RequestSpec(t, 4, 2) for t in (0.5, 0.1, 0.1, 2.0)]
    open_loop = wl.Arrivals(specs)  # a plain list: an open loop
    assert [open_loop.pop() for _ in range(4)] == [(0.1, 1), (0.1, 2), (0.5, 0), (2.0, 3)]
    open_loop.finished(3.0)  # finishing sends nothing in an open loop
    assert not open_loop
    closed = wl.Arrivals(wl.Workload(specs, concurrency=2))
    assert [closed.pop(), closed.pop()] == [(0.0, 0), (0.0, 1)] and not closed
    closed.finished(1.5)  # one client's request is done: it sends the next at once
    assert closed.next_time() == 1.5 and closed.pop() == (1.5, 2)
    closed.finished(2.5)
    closed.finished(2.6)  # every request is out: nothing more to send
    assert closed.pop() == (2.5, 3) and not closed
