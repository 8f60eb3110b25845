"""Asynchronous scheduling gives, token for token, what the synchronous loop gives.

The asynchronous loop launches step n+1 before it reads step n's tokens, so it plans with
placeholders, finds a stop one step late and discards the token sampled after it. None of that
may show in the outputs: every request's tokens, text and finish reason must be the
synchronous engine's, whatever the arrival order, the pressure on the pool (preemption by
recompute or swap), chunked prefill, prefix caching, stops and aborts; and every KV block must
be free at the end.
"""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm import LLM
from minillm.config import EngineConfig
from minillm.sampling import SamplingParams

VOCAB = 4096
SHARED = [7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73]  # > one block
SETTINGS = {
    # Room for everyone: continuous batching with chunked prefill.
    "roomy": dict(max_num_seqs=4, max_model_len=128),
    # A pool too small for four requests at once, a budget that chunks every prompt, a cache.
    "recompute": dict(max_num_seqs=4, max_model_len=128, num_kv_blocks=9,
                      max_num_batched_tokens=24, enable_prefix_caching=True),
    "swap": dict(max_num_seqs=4, max_model_len=128, num_kv_blocks=9, max_num_batched_tokens=24,
                 preemption_mode="swap", swap_space=0.01),
    "radix": dict(max_num_seqs=3, max_model_len=128, enable_prefix_caching=True,
                  prefix_caching="radix", enable_chunked_prefill=False),
}
_llms: dict[tuple[str, bool], LLM] = {}


def llm(setting: str, async_scheduling: bool) -> LLM:
    """One engine per setting and loop, reused: outputs may not depend on what it served."""
    key = (setting, async_scheduling)
    if key not in _llms:
        _llms[key] = LLM(device="cpu", async_scheduling=async_scheduling, **SETTINGS[setting])
    return _llms[key]


def same(got: dict[int, tuple], expected: dict[int, tuple]) -> bool:
    """The same tokens, finish reasons and texts; logprobs to float rounding, since a row's
    logprobs move in the last digits with the shape of the batch it ran in (arrivals differ)."""
    if got.keys() != expected.keys():
        return False
    for i, (tokens, reason, text, logprobs) in got.items():
        if (tokens, reason, text) != expected[i][:3] or len(logprobs) != len(expected[i][3]):
            return False
        for mine, theirs in zip(logprobs, expected[i][3]):
            if mine.keys() != theirs.keys() or any(
                    abs(mine[t] - theirs[t]) > 1e-4 for t in mine):
                return False
    return True


def serve(engine_llm: LLM, prompts, params, arrivals, aborts=None) -> dict[int, tuple]:
    """Drive the engine step by step: request i joins before step arrivals[i]; aborts maps a
    request to the step before which it is aborted. Returns each request's (token ids, finish
    reason, text, logprobs) and checks that the engine ends with every block free."""
    engine, aborts = engine_llm.engine, aborts or {}
    reqs, step = {}, 0
    order = sorted(range(len(prompts)), key=lambda i: arrivals[i])
    while order or engine.has_unfinished_requests():
        while order and arrivals[order[0]] <= step:
            i = order.pop(0)
            reqs[i] = engine.make_request(prompts[i], params[i])
            engine.enqueue(reqs[i])
        for i, at in aborts.items():
            if at == step and i in reqs and not reqs[i].is_finished:
                engine.abort_request(reqs[i].request_id)
        engine.step()
        step += 1
        assert step < 2_000, "the engine made no progress"
    stats = engine_llm.stats()
    assert stats["num_free_blocks"] == stats["num_blocks"]
    assert engine.in_flight is None and not engine.requests
    return {i: (r.output_token_ids, r.finish_reason, r.text, r.output_logprobs)
            for i, r in reqs.items()}


workloads = st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.lists(st.tuples(st.booleans(), st.integers(1, 30)), min_size=n, max_size=n),
    st.lists(st.tuples(st.integers(1, 20), st.sampled_from([0.0, 0.9]), st.integers(0, 99),
                       st.sampled_from([None, 2]), st.integers(0, 3)), min_size=n, max_size=n),
    st.lists(st.integers(0, 12), min_size=n, max_size=n),
    st.integers(0, 2**16)))


def build(workload):
    prefixes, sampling, arrivals, seed = workload
    rng = random.Random(seed)
    prompts = [(SHARED if shared else []) + [rng.randrange(1, VOCAB) for _ in range(length)]
               for shared, length in prefixes]
    params = [SamplingParams(max_tokens=m, temperature=t, seed=s, logprobs=lp,
                             min_tokens=min(least, m)) for m, t, s, lp, least in sampling]
    return prompts, params, arrivals


@pytest.mark.parametrize("setting", list(SETTINGS))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads)
def test_async_outputs_are_the_sync_outputs_in_any_arrival_order(setting, workload):
    prompts, params, arrivals = build(workload)
    expected = serve(llm(setting, False), prompts, params, [0] * len(prompts))
    assert same(serve(llm(setting, True), prompts, params, arrivals), expected)


def test_the_pressure_settings_do_preempt_and_swap():
    # Otherwise the property above would not reach preemption: count it on one heavy workload.
    prompts = [[5 + i] * 20 for i in range(4)]
    params = [SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)] * 4
    for setting, key in (("recompute", "num_preemptions"), ("swap", "num_swap_outs")):
        engine_llm = llm(setting, True)
        before = engine_llm.stats()[key]
        assert same(serve(engine_llm, prompts, params, [0] * 4),
                    serve(llm(setting, False), prompts, params, [0] * 4))
        assert engine_llm.stats()[key] > before


def test_a_stop_found_one_step_late_emits_nothing_past_it():
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8], [1, 6, 1, 8, 0, 3, 3]]
    free = serve(llm("roomy", False), prompts,
                 [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)] * 3, [0] * 3)
    # A stop string from the middle of each free-running text, and stop tokens from its tokens.
    stops = [SamplingParams(max_tokens=24, temperature=0, stop=free[i][2][6:9])
             for i in range(3)]
    expected = serve(llm("roomy", False), prompts, stops, [0] * 3)
    got = serve(llm("roomy", True), prompts, stops, [0, 1, 2])
    assert same(got, expected)
    for i, (tokens, reason, text, _) in got.items():
        assert reason == "stop" and len(tokens) < 24  # it did stop, early
        assert tokens == free[i][0][:len(tokens)]  # and emitted nothing past the stop
        assert free[i][2].startswith(text) and stops[i].stop not in text


def test_aborts_free_everything_and_leave_the_others_alone():
    rng = random.Random(5)
    prompts = [[rng.randrange(1, VOCAB) for _ in range(12)] for _ in range(5)]
    params = [SamplingParams(max_tokens=16, temperature=0.9, seed=i, ignore_eos=True)
              for i in range(5)]
    expected = serve(llm("recompute", False), prompts, params, [0] * 5)
    got = serve(llm("recompute", True), prompts, params, [0, 0, 1, 2, 3], aborts={1: 3, 3: 6})
    for i in (0, 2, 4):
        assert got[i] == expected[i]
    for i in (1, 3):  # aborted mid-run: what it got is the start of what it would have got
        tokens, reason, _, _ = got[i]
        assert reason is None and tokens == expected[i][0][:len(tokens)]


def test_the_async_loop_runs_one_step_ahead():
    # A request's step-n token is read while step n+1 runs: the first step returns no tokens,
    # each later one the token of the step before, and the last reads without launching.
    engine = llm("roomy", True).engine
    req = engine.make_request([1, 2, 3], SamplingParams(max_tokens=3, temperature=0))
    engine.enqueue(req)
    assert engine.step() == [] and req.num_placeholders == 1
    assert [o.request_id for o in engine.step()] == [req.request_id]
    assert req.num_output_tokens == 1 and req.num_placeholders == 1
    engine.step()
    engine.step()  # its third token is in flight: no new step is launched, only read
    assert req.is_finished and req.num_output_tokens == 3 and engine.in_flight is None


def test_async_scheduling_refuses_speculative_decoding_and_non_bools():
    with pytest.raises(ValueError, match="speculative_config"):
        EngineConfig(async_scheduling=True,
                     speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="async_scheduling must be True or False"):
        EngineConfig(async_scheduling="yes")  # type: ignore[arg-type]


def test_served_streams_under_async_scheduling_are_the_engines_and_free_their_blocks():
    import asyncio

    import openai

    from minillm.serve import start_server

    prompts = [[1 + i, 2 + i, 3 + (i % 5)] for i in range(16)]
    lengths = [3 + i % 7 for i in range(16)]
    want = llm("roomy", False).generate(
        prompts, [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in lengths],
        use_tqdm=False)

    async def one(aclient, model, prompt, n):
        stream = await aclient.completions.create(
            model=model, prompt=prompt, max_tokens=n, temperature=0, stream=True,
            extra_body={"ignore_eos": True})
        return "".join([c.choices[0].text async for c in stream if c.choices])

    served = LLM(device="cpu", max_num_seqs=8, num_kv_blocks=48, async_scheduling=True)
    with start_server(served) as server:
        async def all_of_them():
            async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x",
                                          max_retries=0) as aclient:
                return await asyncio.gather(*(one(aclient, server.model_name, p, n)
                                              for p, n in zip(prompts, lengths)))

        assert asyncio.run(all_of_them()) == [w.text for w in want]
        stats = served.stats()
        assert stats["num_free_blocks"] == stats["num_blocks"] and stats["num_running"] == 0


def test_the_console_script_passes_async_scheduling(monkeypatch):
    from minillm.cli import main
    from minillm.serve.running import GracefulServer

    served = {}
    monkeypatch.setattr(GracefulServer, "run", lambda self: served.update(app=self.config.app))
    assert main(["serve", "--device", "cpu", "--port", "0", "--async-scheduling"]) == 0
    assert served["app"].state.server.engine.config.async_scheduling is True


@pytest.mark.parametrize("min_tokens", [0, 8])
def test_an_end_of_sequence_token_ends_a_request_one_step_late_and_nothing_follows(min_tokens):
    # The shipped model does not emit its EOS greedily: make a token it does emit the engines'
    # end of sequence (on both), so the EOS check and min_tokens' EOS mask both run.
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8]]
    free = serve(llm("roomy", False), prompts,
                 [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)] * 2, [0, 0])
    eos = free[0][0][5]
    params = [SamplingParams(max_tokens=24, temperature=0, min_tokens=min_tokens)] * 2
    got = {}
    for loop in (False, True):
        engine = llm("roomy", loop).engine
        saved, engine.eos_token_ids = engine.eos_token_ids, {eos}
        try:
            got[loop] = serve(llm("roomy", loop), prompts, params, [0, 1] if loop else [0, 0])
        finally:
            engine.eos_token_ids = saved
    assert same(got[True], got[False])
    tokens, reason, _, _ = got[True][0]
    if min_tokens == 0:  # it ends at its first EOS, which is its last token
        assert reason == "stop" and tokens == free[0][0][:6]
    else:  # EOS is masked until min_tokens, so it runs on past where it stopped
        assert eos not in tokens[:min_tokens] and len(tokens) > min_tokens
        assert reason == "length" or tokens[-1] == eos


def test_a_client_that_hangs_up_under_async_scheduling_frees_its_blocks():
    import time

    from support import open_stream

    from minillm.serve import start_server

    served = LLM(device="cpu", max_num_seqs=4, num_kv_blocks=48, async_scheduling=True)
    with start_server(served) as server:
        open_stream(server.port, max_tokens=500).close()
        deadline = time.monotonic() + 20
        while served.stats()["num_free_blocks"] != 48:
            assert time.monotonic() < deadline, "the hung-up request kept its blocks"
            time.sleep(0.02)
        assert served.stats()["num_running"] == 0
