"""bench servers: minillm serve with its engine core on a thread and in its own process, run on
the same loads in alternating order, reported side by side with per-round ratios."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

from minillm.bench import servers
from minillm.bench.__main__ import main


def fake_round(thread_tpot, process_tpot):
    def figures(tpot):
        return {key: (tpot if "tpot" in key else 10.0) for key, _ in servers.FIGURES}
    return {("thread", "minillm"): {"open": figures(thread_tpot)},
            ("own process", "minillm"): {"open": figures(process_tpot)}}


def test_the_report_gives_medians_ranges_and_per_round_ratios():
    results = [fake_round(10.0, 8.0), fake_round(12.0, 9.0), fake_round(10.0, 9.5)]
    lines = servers.report(results, ["open"]).splitlines()
    tpot = next(line for line in lines if line.strip().startswith("TPOT p50"))
    # medians 10.0 and 9.0; the ratio per round 0.80, 0.75, 0.95: median 0.80
    assert "10.0 (10.0-12.0)" in tpot and "9.0 (8.0-9.5)" in tpot
    ratios = lines[lines.index("  own process / thread:"):]
    tpot_ratio = next(line for line in ratios if line.strip().startswith("TPOT p50"))
    assert "0.80x median of 3 rounds (range 0.75-0.95x)" in tpot_ratio


def test_the_effective_rate_is_what_the_draw_offered():
    open_loop = servers.loads(50, 8.0, 4, 16, 8, seed=0)[0].workload
    span = open_loop[-1].arrival_time - open_loop[0].arrival_time
    assert servers.effective_rate(open_loop) == 49 / span


def test_loads_are_an_open_loop_per_rate_the_closed_loop_and_shared_prefixes():
    found = servers.loads(40, [4.0, 8.0], 4, 16, 8, seed=0, prefixes=(64, 2), slo="ttft:300")
    assert [load.name for load in found] == [
        "open loop, 4 req/s", "open loop, 8 req/s", "closed loop, 4 in flight",
        "shared prefixes, 8 req/s: 2 of 64 tokens"]
    shared = found[-1]
    assert (shared.prefix_len, shared.num_prefixes, shared.rate) == (64, 2, 8.0)
    assert {spec.prompt_len for spec in shared.workload} == {64 + 16}
    assert {spec.prefix_id for spec in shared.workload} == {0, 1}
    assert all(load.slo == "ttft:300" for load in found)


def test_rounds_alternate_which_contender_serves_first():
    started = []

    def contender(name):
        def start():
            started.append(name)
            return contextlib.nullcontext(SimpleNamespace(url="http://unused"))
        return servers.Contender(name, start)

    servers.compare(3, [], [contender("a"), contender("b")], {}, progress=False)
    assert started == ["a", "b", "b", "a", "a", "b"]
    started.clear()
    servers.compare(3, [], [contender("a"), contender("b")], {}, keep_up=True, progress=False)
    assert started == ["a", "b"]  # started once each, kept for every round


def test_both_designs_serve_both_loads(capsys):
    assert main(["servers", "--rounds", "1", "--num-prompts", "10", "--input-len", "16",
                 "--output-len", "8", "--request-rate", "20", "--max-concurrency", "3",
                 "--shared-prefix", "32", "2", "--goodput", "ttft:5000",
                 "--server-args", "--max-num-seqs", "4"]) == 0
    out = capsys.readouterr().out
    for load in ("open loop, 20 req/s:", "closed loop, 3 in flight:",
                 "shared prefixes, 20 req/s: 2 of 32 tokens:"):
        assert load in out
    assert out.count("own process / thread:") == 3
    assert out.count("(one round: no spread)") == 3 * len(servers.FIGURES)
    goodput = [line for line in out.splitlines() if line.strip().startswith("goodput (req/s)")]
    assert len(goodput) == 6 and all("n/a" not in line for line in goodput)
