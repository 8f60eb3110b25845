"""Request metrics and their summary: the formulas the chapters quote."""

import math

import numpy as np
import pytest

from minillm.metrics import RequestMetrics, percentile, summarize


def make(arrival, tokens, scheduled=None):
    m = RequestMetrics(arrival_time=arrival, first_scheduled_time=scheduled or arrival)
    m.token_times = list(tokens)
    m.first_token_time = tokens[0]
    m.finished_time = tokens[-1]
    return m


def test_ttft_tpot_itl_e2e():
    m = make(1.0, [1.5, 1.6, 1.8, 1.9], scheduled=1.2)
    assert m.ttft == pytest.approx(0.5)
    assert m.e2e == pytest.approx(0.9)
    assert m.queue_time == pytest.approx(0.2)
    assert m.itl == pytest.approx([0.1, 0.2, 0.1])
    # TPOT = (E2E - TTFT) / (n - 1), so E2E = TTFT + (n - 1) * TPOT.
    assert m.tpot == pytest.approx((m.e2e - m.ttft) / 3)
    assert m.e2e == pytest.approx(m.ttft + 3 * m.tpot)


def test_single_token_has_no_tpot():
    assert make(0.0, [0.3]).tpot is None and make(0.0, [0.3]).itl == []


@pytest.mark.parametrize("q", [0, 10, 50, 90, 95, 99, 100])
def test_percentile_matches_numpy(q):
    xs = [3.0, 1.0, 7.0, 2.0, 9.0, 4.0]
    assert percentile(xs, q) == pytest.approx(np.percentile(xs, q))


def test_summary_and_goodput():
    ms = [make(0.0, [0.1, 0.2, 0.3]), make(0.0, [0.9, 1.0]), make(0.5, [0.6, 2.0])]
    s = summarize(ms, slo={"ttft": 0.5})
    assert s.num_requests == 3 and s.output_tokens == 7
    assert s.duration == pytest.approx(2.0)
    assert s.ttft.p50 == pytest.approx(0.1)
    assert s.ttft.mean == pytest.approx((0.1 + 0.9 + 0.1) / 3)
    assert s.goodput == pytest.approx(2 / 2.0)  # the second request misses the TTFT bound
    assert s.output_throughput == pytest.approx(3.5)
    assert summarize(ms).goodput is None
    with pytest.raises(ValueError, match="ttfx"):
        summarize(ms, slo={"ttfx": 1.0})


def test_chunks_are_not_tokens():
    """Over HTTP a chunk may hold several tokens: TPOT divides by the usage count, ITL is per
    chunk, and the summary counts tokens."""
    m = make(0.0, [0.2, 0.5, 0.6])
    m.num_output_tokens = 7
    assert m.output_tokens == 7 and m.itl == pytest.approx([0.3, 0.1])
    assert m.tpot == pytest.approx((0.6 - 0.2) / 6)
    s = summarize([m], slo={"e2el": 0.5}, duration=2.0)
    assert s.output_tokens == 7 and s.duration == 2.0 and s.goodput == 0.0
    assert summarize([m], slo={"e2e": 0.6}).goodput == pytest.approx(1 / 0.6)


def test_summary_needs_finished_requests():
    with pytest.raises(ValueError):
        summarize([RequestMetrics(arrival_time=0.0)])
    assert math.isnan(percentile([], 50))


# ---- how many samples a percentile needs ------------------------------------------------------

def test_percentile_interval_covers_the_true_percentile_as_promised():
    """Distribution-free: draw n samples of a skewed distribution many times and count how
    often x[lo] <= true p99 <= x[hi]; the interval must hold at least 95% of the time, and the
    ranks must not be wasteful (a looser interval would cover ~100%)."""
    from minillm.metrics import percentile_interval

    rng = np.random.default_rng(0)
    n, q = 1000, 99
    lo, hi = percentile_interval(n, q)
    true_p99 = float(np.exp(2.326347874))  # lognormal(0, 1): exp(z_0.99)
    xs = np.sort(rng.lognormal(0.0, 1.0, size=(4000, n)), axis=1)
    covered = np.mean((xs[:, lo - 1] <= true_p99) & (true_p99 <= xs[:, hi - 1]))
    assert 0.95 <= covered < 0.985
    assert lo < 0.99 * n < hi


def test_too_few_samples_cannot_bound_a_p99_from_above():
    from minillm.metrics import percentile_interval, samples_for_percentile

    need = samples_for_percentile(99)
    assert need == 368
    assert percentile_interval(need - 1, 99)[1] is None
    assert percentile_interval(need, 99)[1] == need  # only the largest sample bounds it
    assert percentile_interval(40, 99) == (38, None)
    assert samples_for_percentile(50) < samples_for_percentile(90) < need
    with pytest.raises(ValueError, match="q=100"):
        percentile_interval(100, 100)


# ---- the steady-state window ------------------------------------------------------------------

def _served(arrival: float, seconds: float, tokens: int = 10) -> RequestMetrics:
    times = [arrival + seconds * (i + 1) / tokens for i in range(tokens)]
    return RequestMetrics(arrival, arrival, times[0], times[-1], times)


def test_steady_state_drops_the_drain_that_summarize_counts():
    """One request a second for 20 s, each done in 1 s, but the last runs 100 s: summarize
    divides by 120 s; the steady state serves one a second, all of the window's on time."""
    from minillm.metrics import steady_state

    runs = [_served(float(t), 1.0) for t in range(20)] + [_served(20.0, 100.0)]
    assert summarize(runs, {"e2e": 2.0}).goodput == pytest.approx(20 / 120)
    window = steady_state(runs, {"e2e": 2.0})
    assert (window.start, window.end) == (4.0, 16.0)
    assert window.requests == 13 and window.attainment == 1.0
    assert window.goodput == pytest.approx(1.0)
    assert window.output_throughput == pytest.approx(10.0)


def test_steady_state_judges_the_slo_without_the_flattered_ends():
    """The first and last arrivals met the SLO, the middle ones did not: the window says so."""
    from minillm.metrics import steady_state

    runs = [_served(float(t), 1.0 if t in (0, 1, 19, 20) else 5.0) for t in range(21)]
    assert summarize(runs, {"e2e": 2.0}).goodput > 0
    assert steady_state(runs, {"e2e": 2.0}).goodput == 0.0


def test_steady_state_counts_a_long_answer_at_its_share_of_the_tokens():
    """An answer still running long after the window closed counts its tokens in full: the
    sustained rate is what the arrivals ask for, not what finished in time."""
    from minillm.metrics import steady_state

    runs = [_served(float(t), 1.0) for t in range(21)]
    runs[10] = _served(10.0, 50.0, tokens=500)
    window = steady_state(runs, {"ttft": 10.0})
    assert window.requests == 13
    assert window.output_throughput == pytest.approx((20 * 10 + 500) / 21)


def test_a_server_that_falls_behind_is_credited_with_what_it_served():
    """One arrival a second, but the server starts one request every 1.5 s: its queue grows
    through the window, so a TPOT-only SLO that every request meets cannot credit it with the
    arrival rate; it gets what it served, first arrival to last finish."""
    from minillm.metrics import steady_state

    runs = []
    for t in range(40):
        start = 1.5 * t  # the server falls 0.5 s further behind with every request
        times = [start + 0.1 * (i + 1) for i in range(10)]
        runs.append(RequestMetrics(float(t), start, times[0], times[-1], times))
    window = steady_state(runs, {"tpot": 1.0})
    assert window.attainment == 1.0 and not window.keeps_up
    assert window.queue_growth > 5.0
    served = 40 / (runs[-1].finished_time - 0.0)
    assert window.goodput == pytest.approx(served) and window.goodput < 0.7
    assert window.output_throughput == pytest.approx(served * 10)
    kept_up = steady_state([_served(float(t), 1.0) for t in range(40)], {"tpot": 1.0})
    assert kept_up.keeps_up and kept_up.goodput == pytest.approx(1.0)


def test_steady_state_names_bad_input():
    from minillm.metrics import steady_state

    with pytest.raises(ValueError, match="trim must be in"):
        steady_state([_served(0.0, 1.0), _served(1.0, 1.0)], {}, trim=0.5)
    with pytest.raises(ValueError, match="arrived at once"):
        steady_state([_served(0.0, 1.0), _served(0.0, 2.0)], {})
