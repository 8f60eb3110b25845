"""bench servers: minillm serve with its engine core on a thread and in its own process, run on
the same loads in alternating order, reported side by side with per-round ratios."""

from __future__ import annotations

from minillm.bench import servers
from minillm.bench.__main__ import main


def fake_round(thread_tpot, process_tpot):
    def figures(tpot):
        return {key: (tpot if "tpot" in key else 10.0) for key, _, _ in servers.FIGURES}
    return {"thread": {"open": figures(thread_tpot)},
            "own process": {"open": figures(process_tpot)}}


def test_the_report_gives_medians_ranges_and_per_round_ratios():
    results = [fake_round(10.0, 8.0), fake_round(12.0, 9.0), fake_round(10.0, 9.5)]
    text = servers.report(results, {"open": None})
    tpot = next(line for line in text.splitlines() if line.strip().startswith("TPOT p50"))
    # medians 10.0 and 9.0; the ratio per round 0.80, 0.75, 0.95: median 0.80
    assert "10.0 (10.0-12.0)" in tpot and "9.0 (8.0-9.5)" in tpot
    assert "0.80x median of 3 rounds (range 0.75-0.95x)" in tpot


def test_the_effective_rate_is_what_the_draw_offered():
    load = servers.loads(50, 8.0, 4, 16, 8, seed=0)
    open_loop, _ = next(iter(load.values()))
    span = open_loop[-1].arrival_time - open_loop[0].arrival_time
    assert servers.effective_rate(open_loop) == 49 / span


def test_rounds_alternate_which_design_serves_first(monkeypatch):
    started = []
    monkeypatch.setattr(servers, "serve_once",
                        lambda flags, runs, args: started.append(flags[0]) or {})
    servers.compare(3, {}, progress=False)
    thread, process = "--no-engine-core-process", "--engine-core-process"
    assert started == [thread, process, process, thread, thread, process]


def test_both_designs_serve_both_loads(capsys):
    assert main(["servers", "--rounds", "1", "--num-prompts", "6", "--input-len", "16",
                 "--output-len", "8", "--request-rate", "20", "--max-concurrency", "3",
                 "--server-args", "--max-num-seqs", "4"]) == 0
    out = capsys.readouterr().out
    for load in ("open loop, 20 req/s:", "closed loop, 3 in flight:"):
        assert load in out
    assert out.count("own process / thread") == 2
    assert out.count("(one round: no spread)") == 2 * len(servers.FIGURES)
