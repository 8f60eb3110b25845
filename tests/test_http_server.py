"""minillm serve over real HTTP on loopback: the official openai client, raw HTTP and SSE,
64 concurrent streams, a client that hangs up mid-stream, bad input, and a clean shutdown."""

import asyncio
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import openai
import pytest
from support import open_stream

from minillm import LLM, SamplingParams
from minillm.serve import start_server

NUM_BLOCKS = 96


@pytest.fixture(scope="module")
def llm():
    return LLM(device="cpu", max_num_seqs=16, num_kv_blocks=NUM_BLOCKS)


@pytest.fixture(scope="module")
def server(llm):
    with start_server(llm) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def post(server, path, body, raw=None):
    """(status, parsed JSON body) of a POST; raw sends these bytes instead of JSON."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", path, raw if raw is not None else json.dumps(body),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    status, data = resp.status, resp.read()
    conn.close()
    return status, json.loads(data) if data else None


def metric(server, name):
    text = urllib.request.urlopen(server.url + "/metrics").read().decode()
    match = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def greedy(llm, prompt, n):
    """What the engine itself generates (the server must say the same)."""
    # The server owns the engine while it runs; a second LLM on the same weights answers.
    return llm.generate(prompt, SamplingParams(max_tokens=n, temperature=0), use_tqdm=False)[0]


@pytest.fixture(scope="module")
def reference():
    return LLM(device="cpu", max_num_seqs=4, num_kv_blocks=64)


def test_completion_matches_the_engine(client, server, reference):
    r = client.completions.create(model=server.model_name, prompt="ROMEO.\n", max_tokens=12,
                                  temperature=0)
    want = greedy(reference, "ROMEO.\n", 12)
    assert r.object == "text_completion" and r.model == "tiny-shakespeare"
    assert r.choices[0].text == want.text and r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
        len(want.prompt_token_ids), 12, len(want.prompt_token_ids) + 12)


def test_streamed_pieces_join_to_the_whole_and_end_with_usage(client, server, reference):
    chunks = list(client.completions.create(
        model=server.model_name, prompt=[5, 6, 7, 8], max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    *pieces, last = chunks
    assert "".join(c.choices[0].text for c in pieces) == greedy(reference, [5, 6, 7, 8], 10).text
    assert [c.choices[0].finish_reason for c in pieces][-1] == "length"
    assert last.choices == [] and last.usage.completion_tokens == 10
    assert last.usage.prompt_tokens == 4


def test_completion_logprobs(client, server):
    r = client.completions.create(model=server.model_name, prompt="KING.\n", max_tokens=6,
                                  temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text and len(lp.token_logprobs) == 6
    assert all(len(top) in (2, 3) for top in lp.top_logprobs)  # top 2, plus the chosen if not
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(6)]


def test_x_request_id_names_the_request_in_the_trace(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 3}),
                 {"Content-Type": "application/json", "X-Request-Id": "bench-7"})
    reply = json.loads(conn.getresponse().read())
    assert reply["id"] == "cmpl-bench-7"
    assert any(e.request_id == "bench-7" for step in server.llm.trace for e in step.scheduled)


def test_the_served_engine_refuses_other_drivers(server, client):
    with pytest.raises(RuntimeError, match="served over HTTP"):
        server.llm.generate("x", SamplingParams(max_tokens=2))
    r = client.completions.create(model=server.model_name, prompt="x", max_tokens=2)
    assert r.usage.completion_tokens == 2  # the server carries on


def test_raw_sse_framing(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(
        {"prompt": "KING.\n", "max_tokens": 4, "stream": True, "temperature": 0}),
        {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("content-type").startswith("text/event-stream")
    events = [e for e in resp.read().decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    payloads = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert sum(1 for p in payloads if p["choices"][0]["text"]) == 4  # a token each, here
    assert all("usage" not in p for p in payloads)  # not asked for


def test_chat_uses_the_play_template(client, server, llm):
    messages = [{"role": "system", "content": "Enter ROMEO"},
                {"role": "user", "content": "Who art thou?"}]
    r = client.chat.completions.create(model=server.model_name, messages=messages,
                                       max_tokens=8, temperature=0, logprobs=True,
                                       top_logprobs=2)
    prompt = llm.tokenizer.decode(
        server.llm.tokenizer.encode("[Enter ROMEO]\n\nUSER.\nWho art thou?\n\nASSISTANT.\n"))
    assert r.usage.prompt_tokens == len(llm.tokenizer.encode(prompt))
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens == 8
    lp = r.choices[0].logprobs.content
    assert len(lp) == 8 and all(len(e.top_logprobs) == 2 for e in lp)
    assert "".join(e.token for e in lp) == r.choices[0].message.content  # greedy: top choice
    assert all(e.logprob == max(t.logprob for t in e.top_logprobs) for e in lp)
    stream = list(client.chat.completions.create(model=server.model_name, messages=messages,
                                                 max_tokens=8, temperature=0, stream=True))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == \
        r.choices[0].message.content


def test_models_health_and_metric_names(client, server):
    assert [m.id for m in client.models.list().data] == ["tiny-shakespeare"]
    client.completions.create(model=server.model_name, prompt="ROMEO.", max_tokens=2)
    assert urllib.request.urlopen(server.url + "/health").status == 200
    text = urllib.request.urlopen(server.url + "/metrics").read().decode()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_count",
                 "vllm:e2e_request_latency_seconds_sum", "vllm:request_queue_time_seconds_count"):
        assert f"\n{name}{{" in text, name
    assert metric(server, "vllm:generation_tokens_total") > 0


def test_64_concurrent_streams_all_complete(server, reference):
    prompts = [[1 + i, 2 + i, 3 + (i % 7)] for i in range(64)]
    lengths = [4 + i % 9 for i in range(64)]
    before = metric(server, "vllm:generation_tokens_total")

    async def one(aclient, prompt, n):
        stream = await aclient.completions.create(
            model=server.model_name, prompt=prompt, max_tokens=n, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
            usage = chunk.usage or usage
        return text, usage

    async def all_of_them():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x",
                                      max_retries=0) as aclient:
            return await asyncio.gather(*(one(aclient, p, n) for p, n in zip(prompts, lengths)))

    results = asyncio.run(all_of_them())
    assert [u.completion_tokens for _, u in results] == lengths
    want = reference.generate(prompts, [SamplingParams(max_tokens=n, temperature=0,
                                                       ignore_eos=True) for n in lengths],
                              use_tqdm=False)
    assert [t for t, _ in results] == [w.text for w in want]
    assert metric(server, "vllm:generation_tokens_total") - before == sum(lengths)
    wait_until(lambda: server.llm.stats()["num_free_blocks"] == NUM_BLOCKS)


def test_a_client_that_hangs_up_mid_stream_frees_its_blocks(server):
    sock = open_stream(server.port, max_tokens=1000)
    assert metric(server, "vllm:kv_cache_usage_perc") > 0
    sock.close()
    wait_until(lambda: server.llm.stats()["num_free_blocks"] == NUM_BLOCKS)
    assert server.llm.stats()["num_running"] == 0
    assert metric(server, "vllm:kv_cache_usage_perc") == 0


def test_a_client_that_hangs_up_before_a_whole_response_frees_its_blocks(server):
    before = metric(server, "vllm:generation_tokens_total")
    sock = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps({"prompt": "ROMEO.\n", "max_tokens": 1400, "ignore_eos": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(body), body))
    wait_until(lambda: server.llm.stats()["num_running"] == 1)
    sock.close()
    wait_until(lambda: server.llm.stats()["num_free_blocks"] == NUM_BLOCKS)
    assert server.llm.stats()["num_running"] == 0
    assert metric(server, "vllm:generation_tokens_total") - before < 1400  # cut short


BAD = [  # (body or raw bytes, the param the error must name)
    (b"{not json", None),
    (b"[1, 2]", None),
    ({"prompt": "x", "max_tokens": 5000}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": "many"}, "max_tokens"),
    ({"prompt": "x", "temperature": -0.5}, "temperature"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "n": 2}, "n"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [1, 99999]}, "prompt"),
    ({"prompt": None}, "prompt"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "logprobs": -1}, "logprobs"),
    ({"prompt": "x", "stop": 7}, "stop"),
]
BAD_CHAT = [
    ({"messages": []}, "messages"),
    ({"messages": "hello"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_p": -1}, "top_p"),
]


def test_bad_input_is_a_400_naming_the_field_and_hurts_nobody(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(
        {"prompt": "KING.\n", "max_tokens": 40, "ignore_eos": True, "stream": True}),
        {"Content-Type": "application/json"})
    bystander = conn.getresponse()  # streaming while the bad requests come in
    cases = [("/v1/completions", *c) for c in BAD] + [("/v1/chat/completions", *c)
                                                      for c in BAD_CHAT]
    for path, body, param in cases:
        raw = body if isinstance(body, bytes) else None
        status, reply = post(server, path, body, raw)
        assert status == 400, (body, reply)
        error = reply["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == 400
        assert error["param"] == param, (body, error)
        if param:
            assert param.split("[")[0] in error["message"], error
    events = [e for e in bystander.read().decode().split("\n\n") if e.startswith("data: {")]
    assert sum(1 for e in events if json.loads(e[6:])["choices"][0]["text"]) == 40
    status, reply = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert status == 200 and reply["usage"]["completion_tokens"] == 2
    wait_until(lambda: server.llm.stats()["num_free_blocks"] == NUM_BLOCKS)


def test_a_failed_step_fails_its_requests_and_health():
    llm = LLM(device="cpu", max_num_seqs=4, num_kv_blocks=32)
    with start_server(llm) as server:
        def broken():
            raise RuntimeError("simulated kernel failure")
        llm.engine.step = broken
        status, reply = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 2})
        # the server's fault, so a 500 (as vLLM answers); afterwards the engine is gone: 503
        assert status == 500 and "simulated kernel failure" in reply["error"]["message"]
        with pytest.raises(urllib.error.HTTPError, match="503"):
            urllib.request.urlopen(server.url + "/health")
    assert llm.stats()["num_free_blocks"] == 32


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_console_script_serves_and_shuts_down_cleanly_on_sigterm():
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "minillm.serve", "--port", str(port),
                             "--device", "cpu", "--max-num-seqs", "8", "--log-level", "info"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def healthy():
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/health").status == 200
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                return False
        wait_until(healthy, timeout=120)
        print(f"server start-up: {time.perf_counter() - start:.2f} s")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps(
            {"prompt": "ROMEO.\n", "max_tokens": 200, "ignore_eos": True, "stream": True}),
            {"Content-Type": "application/json"})
        resp = conn.getresponse()
        first = resp.readline().decode()  # the stream has begun
        proc.send_signal(signal.SIGTERM)
        # In flight at the signal, it may finish in the grace period (5 s, ample for 200 tokens).
        events = [e for e in (first + resp.read().decode()).split("\n\n") if e]
        assert events[-1] == "data: [DONE]" and len(events) == 201
        # uvicorn re-raises the signal once it has shut down, as a process killed by it would end
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        log = proc.stdout.read()
        assert "Application shutdown complete" in log and "Traceback" not in log, log
    finally:
        proc.kill()


def test_console_script_reports_a_missing_model(tmp_path):
    from minillm.cli import main
    assert main(["serve", str(tmp_path / "nowhere")]) == 2


def test_the_shipped_chat_template_is_the_training_scripts(llm):
    from minillm.train.card import CHAT_TEMPLATE
    assert llm.tokenizer.chat_template == CHAT_TEMPLATE  # a retrained model keeps it


def test_console_script_passes_the_prefix_cache_flags_to_the_engine(monkeypatch):
    from minillm.cli import main
    from minillm.serve.running import GracefulServer
    served = {}
    monkeypatch.setattr(GracefulServer, "run", lambda self: served.update(app=self.config.app))
    assert main(["serve", "--device", "cpu", "--port", "0", "--enable-prefix-caching",
                 "--prefix-caching", "radix", "--scheduling-policy", "lpm"]) == 0
    config = served["app"].state.server.engine.config
    assert (config.enable_prefix_caching, config.prefix_caching,
            config.scheduling_policy) == (True, "radix", "lpm")


def test_prefix_cache_counters_count_tokens_as_vllm_does():
    # vLLM's prefix_cache_queries / _hits count tokens: here a 40-token prompt sent twice with
    # 16-token blocks looks up 39 tokens each time (one is always computed) and reuses 32 the
    # second time (two whole blocks).
    from minillm.serve.prometheus import ServerMetrics

    llm = LLM(device="cpu", enable_prefix_caching=True, prefix_caching="radix", block_size=16)
    metrics = ServerMetrics(llm.engine, "m")
    prompt = list(range(1, 41))
    for _ in range(2):
        llm.generate([prompt], SamplingParams(max_tokens=2, temperature=0), use_tqdm=False)
        metrics.refresh()
    text = metrics.exposition().decode()

    def value(name):
        return float(re.search(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M).group(1))

    assert value("vllm:prefix_cache_queries_total") == 78
    assert value("vllm:prefix_cache_hits_total") == 32


@pytest.mark.parametrize("where", ["--no-engine-core-process", "--engine-core-process"])
def test_console_script_settles_torch_threads_before_it_loads_the_model(monkeypatch, capsys,
                                                                        where):
    # On a 2-core CPU the engine shares its cores with the HTTP loop and the clients: a second
    # torch thread stalls its steps, so `minillm serve` takes machine.settle_threads' rule, in
    # its own process and in the engine core's.
    from minillm.calc import machine
    from minillm.cli import main
    from minillm.serve import __main__ as serve_main
    from minillm.serve.running import GracefulServer

    calls = []
    monkeypatch.setattr(machine, "settle_threads", lambda: calls.append("settle") or 1)
    real_llm = serve_main.LLM
    monkeypatch.setattr(serve_main, "LLM",
                        lambda *a, **k: calls.append("load") or real_llm(*a, **k))
    monkeypatch.setattr(GracefulServer, "run", lambda self: None)
    assert main(["serve", "--device", "cpu", "--port", "0", where]) == 0
    banner = capsys.readouterr().out
    if where == "--no-engine-core-process":
        assert calls == ["settle", "load"]
    else:  # the core process loads the model, under the same rule (run_engine_core)
        assert calls == ["settle"]
        if (os.cpu_count() or 1) <= 2:
            assert "(1 torch threads; the engine core in its own process)" in banner
    assert "torch threads;" in banner
