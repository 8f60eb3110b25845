"""minillm serve against a hostile client, on loopback: every class of bad input, a request id
shared by concurrent clients, a request that fails inside a step, a dead engine, bodies that are
too large or never arrive, a shutdown with long requests running, and the guards (key, Host,
Origin, content type). After each probe another client's stream must have completed intact and
the server must be back to no running request and no KV block in use.

The server's engine runs both ways, each test that touches the engine running on both: on a
thread of the server's process (EngineLoop) and in an engine core process of its own
(EngineCoreClient), where faults are planted through its hook (support.py's planters), and
where a core that is killed outright must end every stream with an error too.

Loops are bounded and every server stops by itself; nothing leaves 127.0.0.1.
"""

import asyncio
import contextlib
import http.client
import json
import logging
import os
import re
import signal
import socket
import threading
import time
import urllib.request

import aiohttp
import pytest
import support

from minillm import LLM, SamplingParams
from minillm.serve import start_server
from minillm.serve.config import ServerConfig
from minillm.serve.core_client import EngineCoreClient

NUM_BLOCKS = 64
BODY_LIMIT = 64 * 1024
BYSTANDER = {"prompt": "KING.\n", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
             "stream": True}


MODES = ["thread", "process"]  # the engine on a thread of the server, or in its own process


def make_engine(mode, hook=None, **kwargs):
    """An LLM (served on a thread) or an EngineCoreClient, with the fault support.HOOK planted."""
    kwargs = {"device": "cpu", **kwargs}
    if mode == "process":
        return EngineCoreClient(hook=None if hook is None else f"support:{hook}", **kwargs)
    llm = LLM(**kwargs)
    if hook is not None:
        getattr(support, hook)(llm)
    return llm


@contextlib.contextmanager
def serving(mode, hook=None, config=None, **kwargs):
    with start_server(make_engine(mode, hook, **kwargs), config=config) as running:
        yield running


@pytest.fixture(scope="module")
def llm():
    return LLM(device="cpu", max_num_seqs=8, num_kv_blocks=NUM_BLOCKS, enable_prefix_caching=True)


@pytest.fixture(scope="module", params=MODES)
def server(request):
    config = ServerConfig(max_body_bytes=BODY_LIMIT, body_timeout=1.5)
    with serving(request.param, "poison_sampler", config, max_num_seqs=8,
                 num_kv_blocks=NUM_BLOCKS, enable_prefix_caching=True) as running:
        yield running


@pytest.fixture(scope="module")
def reference():
    return LLM(device="cpu", max_num_seqs=4, num_kv_blocks=64)


def greedy_text(reference, prompt, n):
    return reference.generate(prompt, SamplingParams(max_tokens=n, temperature=0,
                                                     ignore_eos=True), use_tqdm=False)[0].text


def request(port, method, path, body=None, headers=None, raw=None, timeout=30):
    """(status, parsed JSON or None, raw bytes) of one HTTP request on a fresh connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = raw if raw is not None else None if body is None else json.dumps(body)
    conn.request(method, path, data, {"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    try:
        parsed = json.loads(payload) if payload else None
    except ValueError:
        parsed = None
    return resp.status, parsed, payload


def sse_events(payload: bytes) -> list[str]:
    return [e for e in payload.decode().split("\n\n") if e]


def stream_text(events: list[str]) -> str:
    text = ""
    for e in events:
        if e.startswith("data: {"):
            chunk = json.loads(e[6:])
            assert "error" not in chunk, chunk
            if chunk.get("choices"):
                choice = chunk["choices"][0]
                text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    return text


def wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    match = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def settled(server):
    """No request running, every KV block free, and /metrics saying so."""
    def idle():
        stats = server.stats()
        return stats["num_running"] == 0 and stats["num_waiting"] == 0 and \
            stats["num_free_blocks"] == NUM_BLOCKS
    wait_until(idle)
    wait_until(lambda: metric(server.port, "vllm:num_requests_running") == 0
               and metric(server.port, "vllm:kv_cache_usage_perc") == 0)


class Bystander:
    """Another client's stream, running while a probe is sent."""

    def __init__(self, port):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.conn.request("POST", "/v1/completions", json.dumps(BYSTANDER),
                          {"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200

    def text(self):
        events = sse_events(self.resp.read())
        self.conn.close()
        assert events[-1] == "data: [DONE]"
        return stream_text(events)


def check_error(status, reply, want_status, want_param):
    assert status == want_status, reply
    assert reply is not None and set(reply) == {"error"}, reply
    error = reply["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["code"] == want_status and error["message"], error
    assert error["param"] == want_param, error


BIG = "1" + "0" * 400  # an integer float() cannot hold
C, CHAT = "/v1/completions", "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]
PROBES = [  # (path, body as a dict or raw bytes, status, param)
    (C, b"{not json", 400, None),
    (C, b"[1, 2]", 400, None),
    (C, b"[" * 50_000, 400, None),  # nesting deeper than Python's recursion limit
    (C, b'{"prompt": "x", "max_tokens": 1' + b"0" * 5000 + b"}", 400, None),  # 5,001 digits
    (C, b'{"prompt": "\xff\xfe"}', 400, None),  # not UTF-8
    (C, b'{"prompt": "\\ud800"}', 400, "prompt"),  # a lone surrogate
    (C, {"model": "llama-9000", "prompt": "x"}, 404, "model"),
    (C, {"model": 7, "prompt": "x"}, 400, "model"),
    (C, {"prompt": "x", "max_tokens": 5000}, 400, "max_tokens"),
    (C, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    (C, {"prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
    (C, {"prompt": "x", "max_tokens": True}, 400, "max_tokens"),
    (C, {"prompt": "x", "temperature": -0.5}, 400, "temperature"),
    (C, {"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    (C, f'{{"prompt": "x", "temperature": {BIG}}}'.encode(), 400, "temperature"),
    (C, f'{{"prompt": "x", "top_k": {BIG}}}'.encode(), 400, "top_k"),
    (C, {"prompt": "x", "top_k": 1.5}, 400, "top_k"),
    (C, {"prompt": "x", "top_k": -2}, 400, "top_k"),
    (C, {"prompt": "x", "top_p": 0}, 400, "top_p"),
    (C, {"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    (C, {"prompt": "x", "n": 2}, 400, "n"),
    (C, {"prompt": "x", "best_of": 3}, 400, "best_of"),
    (C, {"prompt": "x", "echo": True}, 400, "echo"),
    (C, {"prompt": ""}, 400, "prompt"),
    (C, {"prompt": []}, 400, "prompt"),
    (C, {"prompt": ["a", "b"]}, 400, "prompt"),
    (C, {"prompt": [1, 99999]}, 400, "prompt"),
    (C, {"prompt": [1, -1]}, 400, "prompt"),
    (C, {"prompt": [True, False]}, 400, "prompt"),
    (C, {"prompt": None}, 400, "prompt"),
    (C, {"prompt": {"text": "x"}}, 400, "prompt"),
    (C, {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    (C, {"prompt": "x", "stream": "yes"}, 400, "stream"),
    (C, {"prompt": "x", "logprobs": -1}, 400, "logprobs"),
    (C, {"prompt": "x", "logprobs": 4097}, 400, "logprobs"),
    (C, {"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    (C, {"prompt": "x", "logprobs": True}, 400, "logprobs"),
    (C, {"prompt": "x", "stop": 7}, 400, "stop"),
    (C, {"prompt": "x", "stop": ""}, 400, "stop"),
    (C, {"prompt": "x", "stop": [""]}, 400, "stop"),
    (C, {"prompt": "x", "stop": [3]}, 400, "stop"),
    (C, {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    (C, {"prompt": "x", "stop": ["s"] * 5_000}, 400, "stop"),
    (C, {"prompt": "x", "seed": 2**64}, 400, "seed"),
    (C, {"prompt": "x", "seed": 1.5}, 400, "seed"),
    (C, {"prompt": "x", "ignore_eos": "no"}, 400, "ignore_eos"),
    (C, {"prompt": "x", "min_tokens": -1}, 400, "min_tokens"),
    (C, {"prompt": "x", "max_tokens": 4, "min_tokens": 5}, 400, "min_tokens"),
    (C, {"prompt": "x", "priority": "high"}, 400, "priority"),
    (C, {"prompt": "x", "logit_bias": {"5": 10}}, 400, "logit_bias"),
    (C, {"prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty"),
    (C, {"prompt": "x", "frequency_penalty": 1}, 400, "frequency_penalty"),
    (C, {"prompt": "x", "repetition_penalty": 1.2}, 400, "repetition_penalty"),
    (C, {"prompt": "x", "suffix": "end"}, 400, "suffix"),
    (C, {"prompt": "x", "response_format": {"type": "json_object"}}, 400, "response_format"),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"messages": "hello"}, 400, "messages"),
    (CHAT, {"messages": [7]}, 400, "messages[0].role"),
    (CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    (CHAT, {"messages": [{"role": "user", "content": 3}]}, 400, "messages[0].content"),
    (CHAT, b'{"messages": [{"role": "user", "content": "\\udfff"}]}', 400,
     "messages[0].content"),
    (CHAT, {"messages": HI, "max_tokens": 5000}, 400, "max_tokens"),
    (CHAT, {"messages": HI, "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    (CHAT, {"messages": HI, "top_p": -1}, 400, "top_p"),
    (CHAT, {"messages": HI, "logprobs": True, "top_logprobs": 5000}, 400, "top_logprobs"),
    (CHAT, {"messages": HI, "logprobs": True, "top_logprobs": -1}, 400, "top_logprobs"),
    (CHAT, {"messages": HI, "top_logprobs": 2}, 400, "top_logprobs"),
    (CHAT, {"messages": HI, "logprobs": 3}, 400, "logprobs"),
    (CHAT, {"messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": "required"}, 400, "tool_choice"),
    (CHAT, {"messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
     "tools"),
    (CHAT, {"messages": HI, "stop": ["1", "2", "3", "4", "5"]}, 400, "stop"),
    (CHAT, {"model": "gpt-4o", "messages": HI}, 404, "model"),
    (C, b'{"prompt": "' + b"x" * (BODY_LIMIT + 10) + b'"}', 413, None),
]


@pytest.mark.parametrize("path, body, status, param", PROBES,
                         ids=[f"{i}-{p[-1]}-{p[2]}" for i, p in enumerate(PROBES)])
def test_bad_input_is_refused_by_name_and_hurts_nobody(server, reference, path, body, status,
                                                       param):
    bystander = Bystander(server.port)
    raw = body if isinstance(body, bytes) else None
    code, reply, _ = request(server.port, "POST", path, None if raw else body, raw=raw)
    check_error(code, reply, status, param)
    if param:
        assert param.split("[")[0] in reply["error"]["message"], reply
    assert bystander.text() == greedy_text(reference, BYSTANDER["prompt"], 8)
    settled(server)


@pytest.mark.parametrize("method, path, headers, status", [
    ("GET", C, {}, 405), ("PUT", CHAT, {}, 405), ("GET", "/nope", {}, 404),
    ("POST", C, {"Content-Type": "text/plain"}, 415),  # what a web page may send cross-site
    ("POST", C, {"Content-Type": "application/x-www-form-urlencoded"}, 415),
    ("POST", C, {"Host": "attacker.example"}, 400),  # DNS rebinding
    ("POST", C, {"Origin": "http://attacker.example"}, 403),
    ("POST", C, {"X-Request-Id": "r" * 300}, 400),
])
def test_wrong_methods_paths_and_headers_get_openai_errors(server, method, path, headers,
                                                           status):
    bystander = Bystander(server.port)
    code, reply, _ = request(server.port, method, path, {"prompt": "x", "max_tokens": 2},
                             headers=headers)
    check_error(code, reply, status, "X-Request-Id" if "X-Request-Id" in headers else None)
    assert bystander.text()
    settled(server)


def test_a_content_length_larger_than_the_body_times_out_with_408(server):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                 b"application/json\r\nContent-Length: 500\r\n\r\n{\"prompt\": \"x\"")
    reply = b""
    while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        reply += chunk
    sock.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b'"RequestTimeoutError"' in reply


def test_a_chunked_body_over_the_limit_is_refused_as_it_arrives(server):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                 b"application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    piece = b"x" * 16384
    try:
        for _ in range(BODY_LIMIT // len(piece) + 2):
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
    except OSError:  # the server answered and closed: as intended
        pass
    reply = sock.recv(65536)
    sock.close()
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]


def test_headers_of_100_kb_are_refused(server):
    code, _, _ = request(server.port, "POST", C, {"prompt": "x", "max_tokens": 2},
                         headers={"X-Padding": "p" * 100_000})
    assert code == 431
    settled(server)


def test_a_repeated_request_id_never_crosses_streams(server, reference):
    prompts = {"ROMEO.\n": 12, "JULIET.\n": 12}
    want = {p: greedy_text(reference, p, n) for p, n in prompts.items()}

    async def one(session, prompt, stream):
        body = {"prompt": prompt, "max_tokens": prompts[prompt], "temperature": 0,
                "ignore_eos": True, "stream": stream}
        async with session.post(f"{server.url}{C}", json=body,
                                headers={"X-Request-Id": "same"}) as resp:
            assert resp.status == 200
            if stream:
                events = sse_events(await resp.read())
                ids = {json.loads(e[6:])["id"] for e in events if e.startswith("data: {")}
                return stream_text(events), ids
            reply = await resp.json()
            return reply["choices"][0]["text"], {reply["id"]}

    async def rounds():
        async with aiohttp.ClientSession() as session:
            for round_ in range(25):
                stream = round_ % 2 == 0
                results = await asyncio.gather(*(one(session, p, stream)
                                                 for p in list(prompts) * 2))
                for prompt, (text, ids) in zip(list(prompts) * 2, results):
                    assert text == want[prompt], (round_, prompt, text)
                    assert ids == {"cmpl-same"}  # the label is echoed

    asyncio.run(rounds())
    assert urllib.request.urlopen(server.url + "/health").status == 200
    settled(server)


def test_a_request_that_fails_inside_a_step_fails_alone(server, reference):
    # The server's engine samples through support.poison_sampler: a batch that holds a request
    # of POISONED_SEED raises, and the engine must end that request alone.
    bystander = Bystander(server.port)
    body = {"prompt": "KING.\n", "max_tokens": 6, "seed": support.POISONED_SEED,
            "temperature": 0.8}
    code, reply, _ = request(server.port, "POST", C, body)
    check_error(code, reply, 500, None)
    assert "selected index k out of range" in reply["error"]["message"]
    code, _, payload = request(server.port, "POST", C, {**body, "stream": True})
    events = sse_events(payload)
    assert code == 200 and events[-1] == "data: [DONE]"
    assert "selected index" in json.loads(events[-2][6:])["error"]["message"]
    assert bystander.text() == greedy_text(reference, BYSTANDER["prompt"], 8)
    assert urllib.request.urlopen(server.url + "/health").status == 200
    settled(server)


def test_tokenizing_runs_off_the_event_loop(server):
    engine = server.engine.processor  # the server's own checks and tokenizer, in its process
    tokenize = engine.tokenize
    release = threading.Event()

    def slow(prompt):
        if prompt == "SLOW":
            release.wait(20)
        return tokenize(prompt)

    engine.tokenize = slow
    try:
        result = {}
        slow_client = threading.Thread(target=lambda: result.update(
            reply=request(server.port, "POST", C, {"prompt": "SLOW", "max_tokens": 2})))
        slow_client.start()
        time.sleep(0.2)
        # While that prompt is still being tokenized, health and another stream answer.
        assert urllib.request.urlopen(server.url + "/health", timeout=5).status == 200
        assert Bystander(server.port).text()
        assert "reply" not in result
    finally:
        release.set()
        engine.tokenize = tokenize
    slow_client.join(30)
    assert result["reply"][0] == 200
    settled(server)


def test_clients_find_what_they_read(server):
    # vLLM's benchmark client reads models[0]["root"] when --model is not given
    models = json.loads(urllib.request.urlopen(server.url + "/v1/models").read())["data"]
    assert models[0]["root"] == server.model_name and models[0]["max_model_len"] == 2048
    # ... and POST /tokenize to align prompt lengths
    code, reply, _ = request(server.port, "POST", "/tokenize", {"prompt": "ROMEO.\nWhat?"})
    assert code == 200 and reply["tokens"] == server.engine.tokenizer.encode("ROMEO.\nWhat?")
    assert reply["count"] == len(reply["tokens"]) and reply["max_model_len"] == 2048
    code, back, _ = request(server.port, "POST", "/detokenize", {"tokens": reply["tokens"]})
    assert code == 200 and back["prompt"] == "ROMEO.\nWhat?"
    code, reply, _ = request(server.port, "POST", "/detokenize", {"tokens": [10**9]})
    check_error(code, reply, 400, "tokens")
    # Prometheus and load balancers probe with HEAD
    for path in ("/metrics", "/health"):
        head = urllib.request.Request(server.url + path, method="HEAD")
        assert urllib.request.urlopen(head).status == 200


def test_usage_reports_the_prompt_tokens_the_prefix_cache_served(server):
    prompt = list(range(100, 140))  # 40 tokens: two whole 16-token blocks to reuse
    cached = []
    for _ in range(2):
        code, reply, _ = request(server.port, "POST", C, {"prompt": prompt, "max_tokens": 2})
        assert code == 200
        cached.append(reply["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert cached == [0, 32]
    settled(server)


def test_the_chat_role_chunk_comes_with_the_first_token(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", CHAT, json.dumps({"messages": HI, "max_tokens": 4, "stream": True,
                                           "temperature": 0}),
                 {"Content-Type": "application/json", "X-Request-Id": "role-check"})
    resp = conn.getresponse()
    first = resp.readline()  # "data: {role chunk}"
    received = time.perf_counter()
    events = sse_events(first + resp.read())
    conn.close()
    role = json.loads(events[0][6:])["choices"][0]["delta"]
    assert role["role"] == "assistant"
    assert "content" in json.loads(events[1][6:])["choices"][0]["delta"]
    # Clients that time TTFT by the first chunk with choices (vLLM's does) must see a token:
    # the role chunk left the server after the engine's first token of this request.
    if server.llm is not None:  # the engine's trace is in this process
        steps = [s for s in server.llm.trace if any(e.request_id == "role-check"
                                                    for e in s.scheduled)]
        assert steps and steps[0].end <= received


def test_chat_without_max_tokens_may_fill_the_pool_not_the_context(server):
    # 64 blocks of 16 = 1,024 tokens, less than the model's 2,048: the default fits the pool.
    body = json.dumps({"messages": HI}).encode()
    app_server = server._server.config.app.state.server
    request_id = app_server.engine.reserve_id("t")
    try:
        parsed, req = app_server.prepare(body, True, request_id, 0.0)
    finally:
        app_server.engine.release_id(request_id)
    assert parsed.params.max_tokens == NUM_BLOCKS * 16 - len(req.prompt_token_ids)


def test_the_api_key_guards_every_route_but_health_and_metrics(llm):
    key = "class-of-2026"
    with start_server(llm, config=ServerConfig(api_key=key)) as keyed:
        routes = [("GET", "/v1/models", None), ("POST", C, {"prompt": "x", "max_tokens": 2}),
                  ("POST", CHAT, {"messages": HI, "max_tokens": 2}),
                  ("POST", "/tokenize", {"prompt": "x"}), ("GET", "/nope", None)]
        for method, path, body in routes:
            for headers in ({}, {"Authorization": "Bearer wrong"},
                            {"Authorization": key}, {"Authorization": f"Basic {key}"}):
                code, reply, _ = request(keyed.port, method, path, body, headers=headers)
                check_error(code, reply, 401, None)
            code, _, _ = request(keyed.port, method, path, body,
                                 headers={"Authorization": f"Bearer {key}"})
            assert code == (404 if path == "/nope" else 200), path
        for path in ("/health", "/metrics"):
            assert urllib.request.urlopen(keyed.url + path).status == 200
        import openai
        client = openai.OpenAI(base_url=keyed.url + "/v1", api_key=key, max_retries=0)
        assert client.completions.create(model=keyed.model_name, prompt="x",
                                         max_tokens=2).usage.completion_tokens == 2
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope",
                          max_retries=0).models.list()


def test_docs_are_off_by_default_and_behind_the_key_when_on(server, llm):
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert request(server.port, "GET", path)[0] == 404
    with start_server(llm, config=ServerConfig(api_key="k", enable_docs=True)) as docs:
        assert request(docs.port, "GET", "/openapi.json")[0] == 401
        assert request(docs.port, "GET", "/openapi.json",
                       headers={"Authorization": "Bearer k"})[0] == 200


def test_cors_is_off_unless_origins_are_allowed(server, llm):
    code, _, _ = request(server.port, "POST", C, {"prompt": "x", "max_tokens": 1},
                         headers={"Origin": f"http://127.0.0.1:{server.port}"})  # same origin
    assert code == 200
    allowed = "http://course.example"
    with start_server(llm, config=ServerConfig(allowed_origins=(allowed,))) as cors:
        conn = http.client.HTTPConnection("127.0.0.1", cors.port, timeout=30)
        conn.request("OPTIONS", C, headers={"Origin": allowed,
                                            "Access-Control-Request-Method": "POST"})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
        assert resp.getheader("access-control-allow-origin") == allowed
        code, _, _ = request(cors.port, "POST", C, {"prompt": "x", "max_tokens": 1},
                             headers={"Origin": "http://elsewhere.example"})
        assert code == 403


def test_allowed_hosts_widens_the_host_check(llm):
    config = ServerConfig(allowed_hosts=("minillm.lab",))
    with start_server(llm, config=config) as lab:
        body = {"prompt": "x", "max_tokens": 1}
        assert request(lab.port, "POST", C, body, headers={"Host": "minillm.lab:80"})[0] == 200
        assert request(lab.port, "POST", C, body, headers={"Host": "127.0.0.1"})[0] == 400


def check_dead(server, died, message):
    """After the engine died: every later request is a 503, /health says so, and /metrics does
    not freeze with the dead batch "running"."""
    assert died.wait(10)
    code, reply, _ = request(server.port, "POST", C, {"prompt": "x", "max_tokens": 2})
    check_error(code, reply, 503, None)
    assert request(server.port, "GET", "/health")[0] == 503
    assert metric(server.port, "vllm:num_requests_running") == 0
    assert metric(server.port, "vllm:kv_cache_usage_perc") == 0


def ends_with_error(port, body, message):
    code, _, payload = request(port, "POST", C, body)
    events = sse_events(payload)
    assert code == 200 and events[-1] == "data: [DONE]"
    error = json.loads(events[-2][6:])["error"]
    assert message in error["message"] and error["code"] == 500, error


LONG = {"prompt": "x", "max_tokens": 50, "ignore_eos": True, "stream": True}


@pytest.mark.parametrize("mode", MODES)
def test_a_dead_engine_ends_every_request_and_says_why(caplog, mode):
    died = threading.Event()
    logger = "minillm.serve." + ("engine_loop" if mode == "thread" else "core_client")
    with serving(mode, "fail_after_five_steps", max_num_seqs=4, num_kv_blocks=32) as server:
        server.engine.on_death = died.set
        with caplog.at_level(logging.ERROR, logger=logger):
            ends_with_error(server.port, LONG, "simulated kernel failure")
            check_dead(server, died, "simulated kernel failure")
        assert any("engine" in r.message and "fail" in r.message for r in caplog.records)
        if mode == "thread":
            assert server.llm.stats()["num_free_blocks"] == 32
        else:  # the core ended its requests, said why and exited with status 1
            assert server.engine._process.wait(10) == 1


def test_a_killed_engine_core_ends_every_stream_with_an_error():
    died = threading.Event()
    with serving("process", "slow_steps", max_num_seqs=4, num_kv_blocks=64) as server:
        server.engine.on_death = died.set
        results = {}
        clients = [threading.Thread(target=lambda k=k: results.update(
            {k: request(server.port, "POST", C, {**LONG, "max_tokens": 500}, timeout=60)}))
            for k in range(2)]
        for c in clients:
            c.start()
        wait_until(lambda: server.stats()["num_running"] == 2)
        os.kill(server.engine.pid, signal.SIGKILL)  # no word from the core: its pipe closes
        for c in clients:
            c.join(30)
        for code, _, payload in results.values():
            events = sse_events(payload)
            assert code == 200 and events[-1] == "data: [DONE]"
            error = json.loads(events[-2][6:])["error"]
            assert "engine core process exited (status -9)" in error["message"], error
        check_dead(server, died, "exited")


@pytest.mark.parametrize("where", ["--no-engine-core-process", "--engine-core-process"])
def test_the_console_script_exits_non_zero_when_the_engine_dies(monkeypatch, where):
    import minillm.serve.__main__ as cli

    made = {}
    real_llm, real_client = cli.LLM, cli.EngineCoreClient

    def broken_llm(*args, **kwargs):
        made["engine"] = llm = real_llm(*args, **kwargs)
        support.fail_every_step(llm)
        return llm

    def broken_client(*args, **kwargs):
        made["engine"] = real_client(*args, hook="support:fail_every_step", **kwargs)
        return made["engine"]

    monkeypatch.setattr(cli, "LLM", broken_llm)
    monkeypatch.setattr(cli, "EngineCoreClient", broken_client)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = {}
    thread = threading.Thread(target=lambda: result.update(code=cli.main([
        "--device", "cpu", "--port", str(port), "--num-gpu-blocks-override", "16",
        "--log-level", "critical", where])))
    thread.start()
    wait_until(lambda: "engine" in made, timeout=60)

    def up():
        try:
            return request(port, "GET", "/health", timeout=2)[0] == 200
        except OSError:
            return False

    wait_until(up, timeout=60)
    code, reply, _ = request(port, "POST", C, {"prompt": "x", "max_tokens": 2})
    assert code in (500, 503) and "simulated kernel failure" in reply["error"]["message"]
    thread.join(30)
    assert result["code"] == 1


def test_non_loopback_binds_need_a_key_or_an_explicit_flag():
    import argparse

    from minillm.serve.__main__ import add_arguments, server_config

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ValueError, match="--api-key"):
        server_config(parser.parse_args(["--host", "0.0.0.0"]))
    assert server_config(parser.parse_args(["--host", "0.0.0.0", "--api-key", "k"])).api_key
    assert server_config(parser.parse_args(["--host", "0.0.0.0", "--allow-unauthenticated"]))
    assert server_config(parser.parse_args(["--host", "127.0.0.5"])).api_key is None


@pytest.mark.parametrize("mode", MODES)
def test_shutdown_ends_long_requests_with_an_error_not_silence(mode):
    # Each step is 20 ms slower (support.slow_steps), so neither request can finish in the grace.
    engine = make_engine(mode, "slow_steps", max_num_seqs=4, num_kv_blocks=128)
    server = start_server(engine, config=ServerConfig(shutdown_grace=1.0))
    long = {"prompt": "ROMEO.\n", "max_tokens": 1500, "ignore_eos": True}
    results = {}
    clients = [threading.Thread(target=lambda k=k, b=b: results.update(
        {k: request(server.port, "POST", C, b, timeout=60)}))
        for k, b in (("stream", {**long, "stream": True}), ("whole", long))]
    for c in clients:
        c.start()
    wait_until(lambda: server.stats()["num_running"] == 2)
    server.close()
    for c in clients:
        c.join(30)
    code, _, payload = results["stream"]
    events = sse_events(payload)
    assert code == 200 and events[-1] == "data: [DONE]"
    assert "shutting down" in json.loads(events[-2][6:])["error"]["message"]
    code, reply, _ = results["whole"]
    check_error(code, reply, 503, None)
    assert "shutting down" in reply["error"]["message"]
    if mode == "thread":
        assert engine.stats()["num_free_blocks"] == 128
    else:  # the core aborted both and exited cleanly
        assert engine._process.wait(10) == 0


def test_the_key_can_come_from_the_environment(monkeypatch):
    import argparse

    from minillm.serve.__main__ import add_arguments, server_config

    monkeypatch.setenv("MINILLM_API_KEY", "from-env")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert server_config(parser.parse_args(["--host", "0.0.0.0"])).api_key == "from-env"
    assert server_config(parser.parse_args(["--api-key", "flag"])).api_key == "flag"
