"""The serving benchmark: real-time replay on the shipped model, and a report that checks out.

Workloads are tiny (a handful of requests, a few output tokens) so the file runs in seconds;
speed itself is never asserted, only what the report must equal given the recorded timestamps.
"""

import json
import math
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from minillm import LLM, SamplingParams
from minillm.bench.__main__ import main
from minillm.bench.serve import SweepResult, sweep
from minillm.serve import serving
from minillm.serve.serving import ServingResult, parse_slo, run_serving
from minillm.workloads.streams import RequestSpec, Workload, closed_loop, poisson

VOCAB = 4096


@pytest.fixture(scope="module")
def llm():
    return LLM(device="cpu", num_kv_blocks=64, max_num_seqs=8)


def test_parse_slo():
    assert parse_slo("ttft:500,tpot:50") == {"ttft": 0.5, "tpot": 0.05}
    assert parse_slo(" TTFT : 200 , e2e:1500, itl:80") == {"ttft": 0.2, "e2e": 1.5, "itl": 0.08}
    assert parse_slo("ttft:500 tpot:50 e2el:2000") == {"ttft": 0.5, "tpot": 0.05, "e2e": 2.0}


@pytest.mark.parametrize("text, match", [
    ("", "METRIC:MS"), ("ttft", "METRIC:MS"), ("latency:5", "METRIC:MS"),
    ("ttft:fast", "not a number"), ("ttft:-1", "positive"), ("tpot:0", "positive"),
    ("e2e:inf", "positive"), ("ttft:1,ttft:2", "twice"), ("ttft:500;tpot:50", "not a number"),
])
def test_parse_slo_rejects_bad_input(text, match):
    with pytest.raises(ValueError, match=match):
        parse_slo(text)


def hand_figures(result: ServingResult, slo: dict[str, float]) -> dict[str, float]:
    """The report's figures recomputed with numpy from the outputs' raw timestamps."""
    ms = [o.metrics for o in result.outputs]
    arrival = np.array([m.arrival_time for m in ms])
    first = np.array([m.token_times[0] for m in ms])
    last = np.array([m.token_times[-1] for m in ms])
    n = np.array([len(m.token_times) for m in ms])
    duration = np.array([m.finished_time for m in ms]).max() - arrival.min()
    ttft, e2e, tpot = first - arrival, last - arrival, (last - first) / (n - 1)
    itl = np.concatenate([np.diff(m.token_times) for m in ms])
    prompt = sum(len(o.prompt_token_ids) for o in result.outputs)
    good = ((ttft <= slo["ttft"]) & (tpot <= slo["tpot"])).sum()
    figures = {"completed": len(ms), "duration": duration, "total_output_tokens": n.sum(),
               "request_throughput": len(ms) / duration, "output_throughput": n.sum() / duration,
               "total_token_throughput": (prompt + n.sum()) / duration,
               "request_goodput": good / duration}
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2e)):
        figures[f"mean_{name}_ms"] = xs.mean() * 1000
        figures[f"std_{name}_ms"] = xs.std() * 1000
        for stat, q in (("median", 50), ("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99)):
            figures[f"{stat}_{name}_ms"] = np.percentile(xs, q) * 1000
    return figures


def test_report_matches_a_hand_computation(llm):
    w = poisson(6, rate=200.0, prompt_len=(4, 12), output_len=(2, 6), seed=3)
    result = run_serving(llm, w)
    for spec, out in zip(w, result.outputs):  # exact lengths: ignore_eos, max_tokens
        assert out.prompt_token_ids == spec.token_ids(VOCAB)
        assert len(out.token_ids) == spec.output_len and out.finish_reason == "length"
    ttfts = [o.metrics.ttft for o in result.outputs]
    slo = {"ttft": float(np.median(ttfts)), "tpot": 10.0}  # about half the requests pass
    judged = result.with_slo(slo)
    hand, got = hand_figures(judged, slo), judged.as_dict()
    for key, value in hand.items():
        assert got[key] == pytest.approx(value, rel=1e-9), key
    assert 0 < got["request_goodput"] < got["request_throughput"]
    report = judged.report()
    for label, key in (("Successful requests:", "completed"),
                       ("Request throughput (req/s):", "request_throughput"),
                       ("Total Token throughput (tok/s):", "total_token_throughput"),
                       ("Request goodput (req/s):", "request_goodput"),
                       ("P99 ITL (ms):", "p99_itl_ms"), ("Median TPOT (ms):", "median_tpot_ms")):
        value = got[key]
        shown = str(value) if isinstance(value, int) else f"{value:.2f}"
        assert any(line.startswith(label) and line.endswith(shown)
                   for line in report.splitlines()), label
    assert "ttft<=" in report and result.summary.goodput is None and "goodput" not in \
        result.report()
    # The trace slice holds this run's steps only: the warm-up's requests are not in it.
    assert {e.request_id for s in result.trace for e in s.scheduled} == {str(i) for i in range(6)}
    assert llm.stats()["num_free_blocks"] == llm.stats()["num_blocks"]


def test_open_loop_never_admits_a_request_before_it_arrives(llm, monkeypatch):
    # Request 2 arrives after the first two are done, so the driver must idle until it does.
    # The engine runs on a virtual clock (1 ms per reading, sleeps advance it) so that how busy
    # this machine is cannot decide whether the first two finish before the third arrives.
    now = [0.0]

    def clock() -> float:
        now[0] += 1e-3
        return now[0]

    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(llm.engine, "clock", clock)
    monkeypatch.setattr(serving.time, "sleep", sleep)
    w = Workload([RequestSpec(t, 6, 3, seed=i) for i, t in enumerate([0.0, 0.01, 0.2, 0.21])])
    result = run_serving(llm, w, warmup=False)
    arrival = {}
    for i, (spec, out) in enumerate(zip(w, result.outputs)):
        arrival[str(i)] = out.metrics.arrival_time
        assert out.metrics.arrival_time == result.start + spec.arrival_time
        assert out.metrics.first_scheduled_time >= out.metrics.arrival_time
    for step in result.trace:
        assert step.scheduled  # the driver sleeps; it never steps an engine with nothing to do
        assert all(step.start >= arrival[e.request_id] for e in step.scheduled)
    assert result.outputs[1].metrics.finished_time < result.outputs[2].metrics.arrival_time
    assert sleeps and sum(sleeps) > 0.1  # it slept through most of the 0.19 s gap
    assert result.summary.duration >= 0.21


def test_closed_loop_keeps_at_most_concurrency_in_flight(llm):
    w = closed_loop(7, concurrency=2, prompt_len=(4, 10), output_len=(2, 5), seed=4)
    result = run_serving(llm, w, warmup=False)
    ms = [o.metrics for o in result.outputs]
    in_flight = [sum(m.arrival_time <= s.start < m.finished_time for m in ms)
                 for s in result.trace]
    assert max(in_flight) == 2 and all(len(s.scheduled) <= 2 for s in result.trace)
    finish_times = {m.finished_time for m in ms}
    assert all(m.arrival_time == result.start for m in ms[:2])
    assert all(m.arrival_time in finish_times for m in ms[2:])  # sent when another finished
    assert all(len(o.token_ids) == s.output_len for o, s in zip(result.outputs, w))


def test_run_serving_rejects_bad_workloads_and_a_busy_engine(llm):
    with pytest.raises(ValueError, match="workload request 1: .*max_model_len"):
        run_serving(llm, Workload([RequestSpec(0.0, 8, 2), RequestSpec(0.0, 2040, 64)]))
    with pytest.raises(ValueError, match="non-empty Workload"):
        run_serving(llm, Workload())
    llm.engine.add_request([5, 6, 7], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="idle engine"):
        run_serving(llm, poisson(2, 100.0, 4, 2))
    while llm.engine.has_unfinished_requests():
        llm.engine.step()


def test_records_of_an_in_process_run_and_its_result_json(llm, tmp_path):
    """The in-process run gives the same report type as the HTTP client: per-request records."""
    passages = ["ROMEO.\nBut soft, what light\n", "JULIET.\nO Romeo, Romeo\n"]
    w = Workload([RequestSpec(0.0, len(llm.tokenizer.encode(p)), 3, prompt=p) for p in passages]
                 + [RequestSpec(0.01, 6, 2, seed=1)])
    result = run_serving(llm, w, warmup=False)
    for spec, rec, out in zip(w, result.records, result.outputs):
        assert rec.ok and rec.prompt_len == spec.prompt_len == len(out.prompt_token_ids)
        assert rec.output_len == spec.output_len and rec.request_id == out.request_id
        assert rec.metrics is out.metrics and rec.text == out.text
    assert result.outputs[0].prompt == passages[0] and result.source == "in-process"
    assert result.values("itl") == [g for o in result.outputs for g in o.metrics.itl]
    result.save_json(tmp_path / "r.json", note="x")
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["note"] == "x" and saved["completed"] == 3 and saved["errors"] == ["", "", ""]
    assert saved["request_goodput"] is None and len(saved["itls"][0]) == 2
    assert saved["records"][2]["arrival_time"] == pytest.approx(0.01)


def test_knee_is_the_rate_of_maximum_goodput():
    def fake(goodput):
        return SimpleNamespace(summary=SimpleNamespace(goodput=goodput, request_throughput=1.0))

    result = SweepResult([1.0, 2.0, 4.0, 8.0], [fake(g) for g in (0.9, 1.8, 1.8, 0.4)],
                         {"ttft": 0.5})
    assert result.goodput == [0.9, 1.8, 1.8, 0.4] and result.knee == 2.0


def test_sweep_and_its_plot(llm, tmp_path, monkeypatch, capsys):
    result = sweep(llm, [400.0, 100.0], lambda r: poisson(3, r, 4, 2, seed=1),
                   parse_slo("ttft:10000,tpot:10000"), progress=False)
    assert result.rates == [100.0, 400.0] and len(result.results) == 2
    assert all(g > 0 for g in result.goodput) and result.knee in result.rates
    assert "knee: goodput peaks at" in result.table()
    with pytest.raises(ValueError, match="SLO"):
        sweep(llm, [1.0], lambda r: poisson(2, r, 4, 2), {})
    with pytest.raises(ValueError, match="rates"):
        sweep(llm, [0.0, math.inf], lambda r: poisson(2, r, 4, 2), {"ttft": 1.0})
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # as if not installed
    assert result.plot(tmp_path / "none.png") is None
    assert "matplotlib is not installed" in capsys.readouterr().err
    monkeypatch.undo()
    pytest.importorskip("matplotlib")
    result.plot(tmp_path / "goodput.png")
    assert (tmp_path / "goodput.png").stat().st_size > 0


def test_command_line(capsys, tmp_path):
    common = ["serve", "--num-requests", "3", "--prompt-len", "4:8", "--output-len", "2",
              "--max-num-seqs", "4"]
    assert main([*common, "--rates", "200", "--slo", "ttft:5000,tpot:1000"]) == 0
    out = capsys.readouterr().out
    assert "Successful requests:" in out and "Request goodput (req/s):" in out
    assert main([*common, "--concurrency", "2"]) == 0
    assert "closed loop, concurrency 2" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([*common, "--slo", "ttft=500"])
    assert "METRIC:MS" in capsys.readouterr().err
    # vLLM's spellings, a text data set, and a closed loop in-process.
    assert main(["serve", "--dataset-name", "shakespeare", "--num-prompts", "3",
                 "--random-output-len", "3", "--random-range-ratio", "0", "--max-concurrency",
                 "2", "--goodput", "ttft:5000", "tpot:1000", "--num-warmups", "0",
                 "--result-json", str(tmp_path / "r.json")]) == 0
    assert "closed loop, concurrency 2" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["output_lens"] == [3, 3, 3]
    with pytest.raises(SystemExit, match="closed loop"):
        main([*common, "--max-concurrency", "2", "--request-rate", "5"])
