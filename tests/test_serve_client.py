"""The benchmark client over HTTP: a scripted fake server, the real one, and the command line.

The fake OpenAI server streams each request's chunks at scripted delays, several tokens to a
chunk, so the report can be recomputed by hand (numpy) from the recorded chunk times; chunks
are not tokens, so ITL (per chunk) and TPOT (per token, from usage) must differ as computed.
Against minillm's own server the HTTP run and the in-process replay of one workload must agree
token for token on every request's prompt and output lengths.
"""

import asyncio
import json
import math
import subprocess
import sys
import threading

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from minillm import LLM
from minillm.bench.__main__ import main
from minillm.llm import default_model_path
from minillm.serve.client import CHAT, abenchmark, benchmark
from minillm.serve.datasets import (
    length_range,
    load_dataset,
    shakespeare_passages,
    sharegpt_requests,
)
from minillm.serve.serving import ServingResult, parse_slo, run_serving
from minillm.tokenizer import load_tokenizer
from minillm.workloads.streams import RequestSpec, Workload, closed_loop, poisson

# Request i's chunks: (delay before it in s, tokens in it). usage counts the tokens.
SCRIPTS = [[(0.03, 1), (0.01, 2), (0.02, 1)],
           [(0.05, 3), (0.01, 1)],
           [(0.01, 1), (0.02, 1), (0.01, 1), (0.03, 2)],
           [(0.02, 2)]]


class FakeServer:
    """An OpenAI-style SSE server on a thread: request bench-…-i follows SCRIPTS[i].

    modes make request i (or the warm-up labelled "warmupK") fail: 'status' (HTTP 500),
    'drop' (the connection closes mid-stream), 'nodone' (no [DONE]), 'empty' (empty chunks).
    """

    def __init__(self, modes: dict[int, str] | None = None):
        self.modes = modes or {}
        self.in_flight = self.max_in_flight = 0
        self.bodies: list[dict] = []
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    async def models(self, request):
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    async def completions(self, request):
        body = await request.json()
        self.bodies.append(body)
        label = request.headers.get("X-Request-Id", "").rsplit("-", 1)[-1]
        i = int(label) if label.isdigit() else None
        mode = self.modes.get(i if i is not None else label)
        if mode == "status":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        script = SCRIPTS[i % len(SCRIPTS)] if i is not None else [(0.0, 1)]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            for k, (delay, ntok) in enumerate(script):
                await asyncio.sleep(delay)
                text = "" if mode == "empty" else "ab" * ntok
                chunk = {"id": "x", "object": "text_completion", "model": "fake-model",
                         "choices": [{"index": 0, "text": text, "finish_reason": None}]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
                if mode == "drop" and k == 0:
                    request.transport.close()
                    return resp
            n = sum(t for _, t in script)
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n,
                     "total_tokens": len(body["prompt"]) + n}
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            if mode != "nodone":
                await resp.write(b"data: [DONE]\n\n")
        finally:
            self.in_flight -= 1
        await resp.write_eof()
        return resp

    def _run(self):
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        self.ready.set()
        self.loop.run_forever()

    def __enter__(self):
        self.thread.start()
        self.ready.wait(10)
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def scripted_workload(n: int = 4, rate: float = math.inf) -> Workload:
    return Workload([RequestSpec(0.0 if rate == math.inf else i / rate, 5 + i,
                                 sum(t for _, t in SCRIPTS[i % len(SCRIPTS)]), seed=i)
                     for i in range(n)], rate=rate)


def hand_figures(result: ServingResult, slo: dict[str, float]) -> dict[str, float]:
    """vLLM's figures recomputed with numpy from the recorded chunk times and usage counts."""
    recs = [r for r in result.records if r.ok]
    t0 = np.array([r.metrics.arrival_time for r in recs])
    first = np.array([r.metrics.token_times[0] for r in recs])
    last = np.array([r.metrics.token_times[-1] for r in recs])
    n = np.array([r.output_len for r in recs])
    ttft, e2el = first - t0, last - t0
    tpot = ((e2el - ttft) / np.maximum(n - 1, 1))[n > 1]
    itl = np.concatenate([np.diff(r.metrics.token_times) for r in recs])
    duration = result.duration
    good = sum((a <= slo["ttft"]) and (n_ < 2 or (b - a) / (n_ - 1) <= slo["tpot"])
               for a, b, n_ in zip(ttft, e2el, n))
    prompt = sum(r.prompt_len for r in recs)
    figures = {"completed": len(recs), "duration": duration, "total_input_tokens": prompt,
               "total_output_tokens": n.sum(), "request_throughput": len(recs) / duration,
               "output_throughput": n.sum() / duration,
               "total_token_throughput": (prompt + n.sum()) / duration,
               "request_goodput": good / duration}
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        figures[f"mean_{name}_ms"] = xs.mean() * 1000
        figures[f"std_{name}_ms"] = xs.std() * 1000
        for stat, q in (("median", 50), ("p90", 90), ("p99", 99)):
            figures[f"{stat}_{name}_ms"] = np.percentile(xs, q) * 1000
    return figures


def test_report_matches_a_hand_computation_of_the_recorded_stream():
    w = scripted_workload(8)
    with FakeServer() as server:
        result = benchmark(server.url, w, tokenizer=default_model_path(), num_warmups=1)
    assert server.bodies[0]["stream"] and server.bodies[0]["ignore_eos"]
    assert server.bodies[0]["stream_options"] == {"include_usage": True}
    assert server.bodies[1]["model"] == "fake-model"  # asked GET /v1/models
    assert len(server.bodies) == 9  # one warm-up, left out of the figures
    for i, (spec, rec) in enumerate(zip(w, result.records)):
        script = SCRIPTS[i % len(SCRIPTS)]
        assert rec.ok and rec.output_len == spec.output_len and rec.prompt_len == spec.prompt_len
        assert len(rec.metrics.token_times) == len(script) and rec.text == "ab" * spec.output_len
        # No chunk is seen before the server sends it: the scripted delays bound the times.
        due = np.cumsum([d for d, _ in script])
        assert all(t - rec.metrics.arrival_time >= d for t, d in zip(rec.metrics.token_times, due))
    slo = {"ttft": float(np.median([r.metrics.ttft for r in result.records])), "tpot": 1.0}
    judged = result.with_slo(slo)
    got = judged.as_dict()
    for key, value in hand_figures(judged, slo).items():
        assert got[key] == pytest.approx(value, rel=1e-9), key
    assert 0 < got["request_goodput"] < got["request_throughput"]
    # Chunks carry up to 3 tokens: pooled ITL (per chunk) exceeds per-token TPOT here.
    assert got["mean_itl_ms"] > got["mean_tpot_ms"]
    assert result.duration >= max(r.metrics.e2e for r in result.records)
    assert "Request goodput (req/s):" in judged.report() and "fake" not in judged.report()


def test_failed_requests_are_counted_and_left_out(tmp_path):
    w = scripted_workload(6)
    modes = {1: "status", 2: "drop", 3: "nodone", 5: "empty"}
    with FakeServer(modes) as server:
        result = benchmark(server.url, w, model="fake-model", num_warmups=0)
    errors = {i: r.error for i, r in enumerate(result.records)}
    assert errors[0] is None and errors[4] is None
    assert "HTTP 500" in errors[1] and "boom" in errors[1]
    assert errors[2] and errors[3] and "[DONE]" in errors[3] and "TTFT" in errors[5]
    got = result.as_dict()
    assert got["completed"] == 2 and got["failed"] == 4
    assert got["total_output_tokens"] == w[0].output_len + w[4].output_len
    assert got["total_input_tokens"] == w[0].prompt_len + w[4].prompt_len
    assert len(result.values("ttft")) == 2 and "Failed requests:" in result.report()
    result.save_json(tmp_path / "r.json")
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["errors"][0] == "" and saved["errors"][1].startswith("HTTP 500")
    assert saved["output_lens"][1] == 0 and len(saved["records"]) == 6


def test_open_loop_sends_on_schedule_and_concurrency_caps_flight():
    w = scripted_workload(4, rate=20.0)  # due at 0, 50, 100, 150 ms
    with FakeServer() as server:
        result = benchmark(server.url, w, model="fake-model", num_warmups=0)
        for spec, rec in zip(w, result.records):
            assert rec.metrics.arrival_time - result.start >= spec.arrival_time
        assert result.duration >= 0.15
        closed = closed_loop(8, concurrency=2, prompt_len=4, output_len=4)
        benchmark(server.url, closed, model="fake-model", num_warmups=0)
        assert server.max_in_flight == 2
        server.max_in_flight = 0
        benchmark(server.url, scripted_workload(8), model="fake-model", num_warmups=0,
                  max_concurrency=3)
        assert server.max_in_flight == 3


def test_benchmark_runs_inside_a_running_event_loop():
    """As in Jupyter: the sync call finds a running loop and runs on a worker thread."""
    async def notebook_cell(url):
        result = benchmark(url, scripted_workload(2), model="fake-model", num_warmups=0)
        direct = await abenchmark(url, scripted_workload(2), model="fake-model", num_warmups=0)
        return result, direct

    with FakeServer() as server:
        result, direct = asyncio.run(notebook_cell(server.url))
    assert result.summary.num_requests == direct.summary.num_requests == 2


def test_a_failed_warm_up_and_bad_arguments_raise():
    with FakeServer({"warmup0": "status"}) as server:
        with pytest.raises(RuntimeError, match="warm-up .*HTTP 500"):
            benchmark(server.url, scripted_workload(2), model="fake-model", num_warmups=1)
        with pytest.raises(ValueError, match="non-empty Workload"):
            benchmark(server.url, Workload())
        with pytest.raises(ValueError, match="max_concurrency"):
            benchmark(server.url, scripted_workload(2), max_concurrency=0)
    with pytest.raises(aiohttp.ClientError):  # nothing listens there
        benchmark("http://127.0.0.1:9", scripted_workload(1))


# ---- data sets --------------------------------------------------------------------------------

def test_datasets(tmp_path):
    tok = load_tokenizer(default_model_path())
    assert length_range(40, 0.6) == (16, 64) and length_range(40, 0.0) == 40
    w = load_dataset("random", 50, input_len=40, output_len=20, range_ratio=0.5, rate=4.0,
                     burstiness=0.5, seed=1)
    assert all(20 <= s.prompt_len <= 60 and 10 <= s.output_len <= 30 for s in w)
    assert w[0].arrival_time == 0.0 and w.rate == 4.0
    passages = shakespeare_passages()
    assert len(passages) >= 20 and all(p.split("\n")[0].endswith(".") for p in passages)
    w = load_dataset("shakespeare", 6, tokenizer=tok, output_len=8, seed=2)
    assert all(s.prompt in passages and s.prompt_len == len(tok.encode(s.prompt)) for s in w)
    conversations = [{"conversations": [{"from": "human", "value": f"ROMEO.\nSpeak {i} " * 3},
                                        {"from": "gpt", "value": "JULIET.\nAy me! " * (i + 2)}]}
                     for i in range(5)] + [{"conversations": [{"from": "human", "value": "hi"}]}]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(conversations))
    w = sharegpt_requests(path, 4, tok, seed=3)
    assert len(w) == 4 and all(s.output_len >= 4 and s.prompt.startswith("ROMEO.") for s in w)
    assert load_dataset("sharegpt", 3, tokenizer=tok, dataset_path=path,
                        sharegpt_output_len=7)[0].output_len == 7
    with pytest.raises(ValueError, match="only 5 usable"):
        sharegpt_requests(path, 6, tok)
    with pytest.raises(ValueError, match="unknown data set"):
        load_dataset("sonnet", 2, tokenizer=tok)


# ---- against minillm's own server ----------------------------------------------------------------

@pytest.fixture(scope="module")
def server():
    from minillm.serve import start_server

    llm = LLM(device="cpu", max_num_seqs=8, num_kv_blocks=128)
    with start_server(llm, port=0) as running:
        yield running


def test_http_and_in_process_agree_on_token_counts(server):
    w = poisson(8, 50.0, prompt_len=(4, 24), output_len=(2, 10), seed=5)
    benchmark(server.url, w[:1], num_warmups=0)  # warm the server up, outside the trace slice
    first = len(server.llm.trace)
    http = benchmark(server.url, w, num_warmups=0)
    assert http.source == server.url and not http.errors
    # One clock: the server's engine steps for this run lie inside the client's span of it.
    steps = server.llm.trace[first:]
    assert http.with_trace(server.llm.trace).trace == steps
    assert http.start <= steps[0].start and steps[-1].end <= http.start + http.duration
    assert sum(len(s.finished) for s in steps) == len(w)
    local = LLM(device="cpu", max_num_seqs=8, num_kv_blocks=128)
    replay = run_serving(local, w)
    for spec, h, r in zip(w, http.records, replay.records):
        assert h.prompt_len == r.prompt_len == spec.prompt_len
        assert h.output_len == r.output_len == spec.output_len
        assert len(h.metrics.token_times) <= h.output_len  # a chunk holds >= 1 token
    assert http.as_dict()["total_output_tokens"] == replay.as_dict()["total_output_tokens"]


def test_chat_endpoint_with_text_prompts(server):
    tok = load_tokenizer(default_model_path())
    w = load_dataset("shakespeare", 3, tokenizer=tok, output_len=4, seed=1)
    result = benchmark(server.url, w, endpoint=CHAT, num_warmups=0)
    assert not result.errors and [r.output_len for r in result.records] == [4, 4, 4]
    # The chat template wraps the passage in speaker turns: the server counts more tokens.
    assert all(r.prompt_len > s.prompt_len for r, s in zip(result.records, w))


def test_command_line_against_the_server(server, tmp_path, capsys):
    out = tmp_path / "result.json"
    assert main(["serve", "--base-url", server.url, "--num-prompts", "4", "--random-input-len",
                 "8", "--random-output-len", "4", "--request-rate", "100", "--goodput",
                 "ttft:5000", "tpot:1000", "--metric-percentiles", "50,99.9",
                 "--percentile-metrics", "ttft,tpot,itl,e2el", "--num-warmups", "1",
                 "--result-json", str(out), "--disable-tqdm"]) == 0
    printed = capsys.readouterr().out
    assert "Successful requests:                    4" in printed and "P99.9 E2EL (ms):" in printed
    saved = json.loads(out.read_text())
    for key in ("completed", "duration", "total_input_tokens", "total_output_tokens",
                "request_throughput", "request_goodput", "output_throughput",
                "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms",
                "p99_ttft_ms", "p99.9_tpot_ms", "p99_itl_ms", "p99_e2el_ms", "input_lens",
                "output_lens", "ttfts", "itls", "generated_texts", "errors", "records"):
        assert key in saved, key
    assert saved["completed"] == 4 and saved["model_id"] is None and saved["request_rate"] == 100
    assert saved["request_goodput"] == pytest.approx(saved["request_throughput"])
    assert main(["serve", "--base-url", server.url, "--num-prompts", "3", "--sweep-rates",
                 "50,200", "--random-input-len", "8", "--random-output-len", "3",
                 "--disable-tqdm", "--num-warmups", "0", "--result-json", str(out)]) == 0
    assert "knee: goodput peaks at" in capsys.readouterr().out
    assert json.loads(out.read_text())["rates"] == [50.0, 200.0]


def test_python_dash_m_bench_serve(server, tmp_path):
    """The command as a reader types it, in a process of its own."""
    out = tmp_path / "r.json"
    done = subprocess.run([sys.executable, "-m", "minillm.bench", "serve", "--base-url",
                           server.url, "--num-prompts", "3", "--random-input-len", "8",
                           "--random-output-len", "3", "--num-warmups", "0", "--disable-tqdm",
                           "--result-json", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Serving Benchmark Result" in done.stdout
    saved = json.loads(out.read_text())
    assert saved["completed"] == 3 and saved["base_url"] == server.url


def test_parse_slo_takes_vllm_goodput_syntax():
    assert parse_slo("ttft:500 tpot:50 e2el:1500") == {"ttft": 0.5, "tpot": 0.05, "e2e": 1.5}
