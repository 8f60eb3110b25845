"""The engine benchmark runs end to end on a small workload and reports its ratios.

Speed itself is never asserted here: the benchmark prints ratios measured side by side. What is
asserted is how it measures: threads settled, contenders interleaved in a rotated order, and a
median over rounds that one stalled run cannot flip.
"""

import argparse
import re

import pytest

from minillm import default_model_path
from minillm.bench import __main__ as bench_cli
from minillm.bench import engine as bench_engine
from minillm.calc import machine
from minillm.model_config import ModelConfig


def test_heavy_tailed_workload_is_seeded_and_heavy_tailed():
    reqs = bench_engine.heavy_tailed_workload(200, vocab_size=100, seed=3)
    assert reqs == bench_engine.heavy_tailed_workload(200, vocab_size=100, seed=3)
    long = [r for r in reqs if r.max_tokens >= 192]
    assert 10 <= len(long) <= 50  # about 15% long
    assert all(16 <= len(r.prompt_token_ids) <= 64 for r in reqs)
    assert all(0 <= t < 100 for r in reqs for t in r.prompt_token_ids)


def test_rounds_rotate_which_contender_runs_first():
    calls = []
    contenders = {name: (lambda name=name: calls.append(name) or {"wall": 1.0, "cpu": 1.0})
                  for name in "abc"}
    rounds = bench_engine.interleaved_rounds(contenders, rounds=4)
    assert calls == list("abc" "bca" "cab" "abc")
    assert [list(r) for r in rounds] == [list("abc")] * 4  # keyed by name, whatever the order


def test_one_stalled_run_moves_the_spread_not_the_median():
    # Round 1: continuous shared its core with another process and took 12x as long on the
    # wall clock (its CPU clock did not count the time the other process held the core). A
    # single run would have reported 0.21x; the median of three still says 2.5x.
    def run(wall: float, cpu: float) -> dict[str, float]:
        return {"wall": wall, "cpu": cpu}

    rounds = [{"continuous": run(1.0, 1.0), "static": run(2.5, 2.5)},
              {"continuous": run(12.0, 1.1), "static": run(2.5, 2.5)},
              {"continuous": run(1.0, 1.0), "static": run(2.6, 2.6)}]
    ratio = bench_engine.speedup(rounds, "continuous", "static")
    assert ratio.median == pytest.approx(2.5)
    assert "2.50x median of 3 rounds (range 0.21-2.60x)" == str(ratio)
    on_cpu = bench_engine.speedup(rounds, "continuous", "static", clock="cpu")
    assert min(on_cpu.per_round) > 2.2


def test_timed_reads_the_wall_and_the_cpu_clock_around_the_call(monkeypatch):
    # Scripted clocks, no sleeping: fn runs while the wall clock advances 0.2 s (another
    # process holds the core) and this process's CPU clock 0.01 s; timed must report each
    # clock's own difference, read before and after fn and not around anything else.
    clocks = {"wall": [10.0], "cpu": [3.0]}
    fake = argparse.Namespace(perf_counter=lambda: clocks["wall"][-1],
                              process_time=lambda: clocks["cpu"][-1])
    monkeypatch.setattr(bench_engine, "time", fake)

    def work():
        clocks["wall"].append(10.2)
        clocks["cpu"].append(3.01)

    seconds = bench_engine.timed(work)
    assert seconds == {"wall": pytest.approx(0.2), "cpu": pytest.approx(0.01)}


def test_engine_benchmark_reports_median_ratios_with_spread(capsys, monkeypatch):
    settled = []
    monkeypatch.setattr(machine, "settle_threads", lambda: settled.append(True) or 1)
    args = argparse.Namespace(model=default_model_path(), num_requests=6, batch_size=3, seed=0,
                              rounds=2)
    ratios = bench_engine.main(args)
    out = capsys.readouterr().out
    assert settled, "the benchmark settles torch's threads before it times anything"
    assert set(ratios) == {"continuous / static", "continuous / transformers"}
    vocab = ModelConfig.from_pretrained(default_model_path()).vocab_size
    tokens = sum(r.max_tokens for r in bench_engine.heavy_tailed_workload(6, vocab, seed=0))
    assert f"workload: 6 requests, {tokens} output tokens" in out
    rows = [line.split() for line in out.splitlines() if re.match(r"[01] +\d", line)]
    assert [row[0] for row in rows] == ["0", "1"]  # one line a round, three contenders each
    assert all(len(row) == 1 + 3 * 3 and row[2::3] == ["/"] * 3 for row in rows)
    for name, ratio in ratios.items():  # each reported ratio is the one printed, per round
        assert len(ratio.per_round) == 2
        assert f"{name}: {ratio} on the wall clock; " in out


def test_engine_benchmark_reports_each_rounds_ratio_and_their_median(capsys, monkeypatch):
    # Contenders with scripted times: the report must pair each round's times, take static's
    # (or transformers') seconds over continuous's in that round, and report the median.
    walls = {"continuous": iter([1.0, 1.0, 2.0]), "static": iter([2.0, 3.0, 3.0]),
             "transformers": iter([4.0, 2.0, 8.0])}

    def scripted(name):
        return lambda reqs: {"wall": next(walls[name]), "cpu": 1.0}

    monkeypatch.setattr(bench_engine, "minillm_contender",
                        lambda path, batch, scheduling, warmup: scripted(scheduling))
    monkeypatch.setattr(bench_engine, "transformers_contender",
                        lambda path, batch, warmup: scripted("transformers"))
    args = argparse.Namespace(model=default_model_path(), num_requests=6, batch_size=3, seed=0,
                              rounds=3)
    ratios = bench_engine.main(args)
    out = capsys.readouterr().out
    assert ratios["continuous / static"].per_round == (2.0, 3.0, 1.5)
    assert ratios["continuous / transformers"].per_round == (4.0, 2.0, 4.0)
    assert "continuous / static: 2.00x median of 3 rounds (range 1.50-3.00x) on the wall " \
           "clock; 1.00x median of 3 rounds (range 1.00-1.00x) on the CPU clock" in out
    assert re.search(r"minillm static +3\.00 +\d+\.\d", out)  # the median seconds


def test_every_bench_command_settles_threads_first(monkeypatch):
    order = []
    monkeypatch.setattr(machine, "settle_threads", lambda: order.append("settle") or 1)
    monkeypatch.setattr(bench_engine, "main", lambda args: order.append("engine") or {})
    assert bench_cli.main(["engine"]) == 0
    assert order == ["settle", "engine"]


def test_prefix_bench_measures_ttft_and_hit_rates_side_by_side(capsys):
    # A small run of `bench prefix`: a 256-token shared prompt and four chats. What it must show
    # holds at any size: a cached prompt is not prefilled again (counted in tokens), and with
    # an ample pool both designs reach the ceiling, while a tight one evicts.
    from minillm.bench import prefix as bench_prefix

    parser = argparse.ArgumentParser()
    bench_prefix.add_arguments(parser)
    args = parser.parse_args(["--prefix-len", "256", "--questions", "3", "--rounds", "2",
                              "--chats", "4", "--turns", "3"])
    vocab = ModelConfig.from_pretrained(args.model).vocab_size
    ratios = bench_prefix.shared_prompt_ttft(args, vocab)
    out = capsys.readouterr().out
    assert set(ratios) == {"hash", "radix"} and all(len(r.per_round) == 2 for r in ratios.values())
    # Its TTFT ratios are printed as measured; what they come to is the benchmark's to report,
    # not a unit test's to assert. What cannot vary is how much each design prefilled:
    assert "prefill tokens computed per round:    816 (272 per question)" in out  # 256+16, off
    assert out.count("prefill tokens computed per round:     48 (16 per question)") == 2
    rates = bench_prefix.chat_hit_rates(args, vocab)
    out = capsys.readouterr().out
    for design in ("hash", "radix"):
        ample = rates["ample pool", design]
        assert f"ample pool (176 blocks), {design:5s}: token hit rate {ample:.3f} (ceiling " \
               f"{ample:.3f}), 0 blocks evicted" in out
        assert rates["tight pool", design] < ample
    assert re.search(r"tight pool \(\d+ blocks\), hash : .* [1-9]\d* blocks evicted", out)
