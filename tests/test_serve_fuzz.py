"""Hypothesis against minillm serve and SamplingParams: any JSON body, any argument values.

Whatever a body holds, the answer is a 200 or a 4xx in OpenAI's error shape, never a 500; the
engine stays alive and no KV block leaks. Whatever SamplingParams is given, it is refused with
a ValueError or generate runs it. Bodies keep max_tokens small when it is valid, so each
example costs a few decode steps.
"""

import http.client
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm import LLM, SamplingParams
from minillm.serve import start_server

NUM_BLOCKS = 48
FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
          "top_p", "top_k", "stop", "seed", "logprobs", "top_logprobs", "stream",
          "stream_options", "ignore_eos", "min_tokens", "n", "best_of", "echo", "priority",
          "logit_bias", "presence_penalty", "tools", "tool_choice", "suffix", "user"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 40), st.integers(), st.integers(2**63, 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["\ud800", "", "tiny-shakespeare", "ROMEO.\n", "\x00", "auto", "none"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "x"]),
                                           "content": st.one_of(st.text(max_size=20), values)}),
                    max_size=3)
prompts = st.one_of(st.text(max_size=30), st.lists(st.integers(-5, 5000), max_size=8), values)


def bodies(chat: bool):
    base = {"messages": messages} if chat else {"prompt": prompts}
    other = st.dictionaries(st.sampled_from(FIELDS), values, max_size=6)
    return st.tuples(st.fixed_dictionaries(base), other,
                     st.integers(1, 6)).map(lambda t: {"max_tokens": t[2], **t[0], **t[1]})


def encodable(body) -> bytes:
    """JSON bytes, with lone surrogates escaped as a client would send them."""
    return json.dumps(body, allow_nan=True).encode()


@pytest.fixture(scope="module")
def server():
    llm = LLM(device="cpu", max_num_seqs=8, num_kv_blocks=NUM_BLOCKS)
    with start_server(llm) as running:
        yield running


def send(server, path, body):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", path, encodable(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    return resp.status, payload


def check(server, status, payload):
    assert status == 200 or 400 <= status < 500, (status, payload[:300])
    if status != 200:
        error = json.loads(payload)["error"]
        assert error["code"] == status and error["message"]
    elif payload.startswith(b"data:"):
        events = [e for e in payload.decode().split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        assert all('"error"' not in e for e in events), events
    assert server.llm.engine.owner_thread is not None  # the engine thread is alive


def drained(server):
    import time
    deadline = time.monotonic() + 10
    while server.llm.stats()["num_free_blocks"] != NUM_BLOCKS:
        assert time.monotonic() < deadline, server.llm.stats()
        time.sleep(0.02)


FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@FUZZ
@given(body=bodies(chat=False))
def test_completions_bodies_never_500(server, body):
    check(server, *send(server, "/v1/completions", body))
    drained(server)


@FUZZ
@given(body=bodies(chat=True))
def test_chat_bodies_never_500(server, body):
    check(server, *send(server, "/v1/chat/completions", body))
    drained(server)


@pytest.fixture(scope="module")
def llm():
    return LLM(device="cpu", max_num_seqs=4, num_kv_blocks=32)


KWARGS = ["max_tokens", "temperature", "top_k", "top_p", "stop", "seed", "logprobs",
          "ignore_eos", "min_tokens"]


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kwargs=st.dictionaries(st.sampled_from(KWARGS), values, max_size=5),
       max_tokens=st.integers(1, 4))
def test_sampling_params_refuse_or_run(llm, kwargs, max_tokens):
    kwargs = {"max_tokens": max_tokens, **kwargs}
    try:
        params = SamplingParams(**kwargs)
    except ValueError:
        return
    assert math.isfinite(params.temperature) and params.temperature >= 0
    try:
        out = llm.generate("ROMEO.\n", params, use_tqdm=False)[0]
    except ValueError:  # refused before queueing: too long for the pool, logprobs over 20
        assert llm.stats()["num_free_blocks"] == 32
        return
    assert out.finish_reason in ("length", "stop") and len(out.token_ids) <= params.max_tokens
    assert llm.stats()["num_free_blocks"] == 32
