"""The engine end to end through LLM: outputs independent of batching policy, no leaks, errors."""

import pytest

from minillm import LLM, SamplingParams, default_model_path

PROMPTS = [
    "Ham.\nTo be, or not to be, that is the question:",
    "Enter KING LEAR",
    "Rom.\n",
    "First Citizen.\nBefore we proceed any further, hear me speak. " * 6,
    "O",
]
GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.9, seed=11, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM(num_kv_blocks=256)


def generate(prompts, params, **engine_args):
    llm = LLM(**engine_args)
    outs = llm.generate(prompts, params, use_tqdm=False)
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_blocks"], "KV blocks leaked"
    return [o.token_ids for o in outs], stats


def test_shipped_model_writes_text(llm):
    out = llm.generate("Ham.\n", SamplingParams(max_tokens=30, temperature=0), use_tqdm=False)[0]
    assert len(out.token_ids) >= 1 and out.text.strip()
    assert out.finish_reason in ("length", "stop")


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("engine_args", [
    {"enable_chunked_prefill": False},
    {"max_num_batched_tokens": 16},
    {"enable_prefix_caching": True, "max_num_batched_tokens": 32},
    {"scheduling": "static", "max_num_seqs": 2},
    {"block_size": 1, "max_num_seqs": 3},
], ids=["no-chunking", "chunk-16", "prefix-cache", "static", "block-1"])
def test_outputs_do_not_depend_on_batching(params, engine_args):
    reference, _ = generate(PROMPTS, params, num_kv_blocks=256)
    tokens, _ = generate(PROMPTS, params, num_kv_blocks=256, **engine_args)
    assert tokens == reference


@pytest.mark.parametrize("chunked", [True, False])
def test_preemption_recomputes_without_changing_outputs(chunked):
    reference, _ = generate(PROMPTS, GREEDY, num_kv_blocks=256)
    # 8 blocks of 16 hold the longest request alone but not all five at once.
    tokens, stats = generate(PROMPTS, GREEDY, num_kv_blocks=8,
                             enable_chunked_prefill=chunked, max_num_batched_tokens=256)
    assert stats["num_preemptions"] > 0
    assert tokens == reference


def test_prefix_cache_hits_for_a_shared_system_prompt():
    system = "Duke.\nWhat, is Antonio here?\n\nAnt.\nReady, so please your grace.\n" * 3
    prompts = [system + q for q in ("Duke.\nGo one,", "Ant.\nI have heard", "Por.\nTarry")]
    reference, _ = generate(prompts, GREEDY, num_kv_blocks=256)
    llm = LLM(num_kv_blocks=256, enable_prefix_caching=True)
    first = [o.token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    again = [o.token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    stats = llm.stats()
    assert first == reference and again == reference
    assert stats["prefix_cache_hits"] > 0
    assert stats["prefix_cache_hits"] <= stats["prefix_cache_queries"]
    assert stats["num_free_blocks"] == stats["num_blocks"]


def test_seed_makes_sampling_reproducible_alone_or_in_a_batch(llm):
    alone = llm.generate(PROMPTS[0], SEEDED, use_tqdm=False)[0].token_ids
    batch = llm.generate(PROMPTS, SEEDED, use_tqdm=False)[0].token_ids
    assert alone == batch
    other = llm.generate(PROMPTS[0], SamplingParams(max_tokens=24, temperature=0.9, seed=12),
                         use_tqdm=False)[0].token_ids
    assert other != alone


def test_stop_string_cuts_the_text(llm):
    full = llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)[0]
    stop = full.text[8:11]
    assert stop and stop in full.text
    out = llm.generate(PROMPTS[0], SamplingParams(max_tokens=24, temperature=0, stop=[stop]),
                       use_tqdm=False)[0]
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.find(stop)]


def test_eos_stops_unless_ignored(llm):
    first = llm.generate(PROMPTS[1], GREEDY, use_tqdm=False)[0].token_ids[0]
    llm.engine.eos_token_ids.add(first)
    try:
        out = llm.generate(PROMPTS[1], SamplingParams(max_tokens=8, temperature=0),
                           use_tqdm=False)[0]
        kept = llm.generate(PROMPTS[1], SamplingParams(max_tokens=8, temperature=0,
                                                       ignore_eos=True), use_tqdm=False)[0]
    finally:
        llm.engine.eos_token_ids.discard(first)
    assert out.token_ids == [first] and out.finish_reason == "stop"
    assert len(kept.token_ids) == 8 and kept.finish_reason == "length"


@pytest.mark.parametrize("stop", [None, ["e"], ["\n\n", "th"]])
def test_stream_joins_to_generate(llm, stop):
    params = SamplingParams(max_tokens=40, temperature=0, stop=stop)
    text = llm.generate(PROMPTS[2], params, use_tqdm=False)[0].text
    pieces = list(llm.stream(PROMPTS[2], params))
    assert "".join(pieces) == text
    assert llm.stats()["num_free_blocks"] == llm.stats()["num_blocks"]


def test_metrics_and_logprobs(llm):
    params = SamplingParams(max_tokens=10, temperature=0, logprobs=3, ignore_eos=True)
    for o in llm.generate(PROMPTS, params, use_tqdm=False):
        m = o.metrics
        assert len(m.token_times) == len(o.token_ids) == 10
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
        assert m.ttft > 0 and m.e2e >= m.ttft
        assert m.tpot == pytest.approx((m.e2e - m.ttft) / 9)
        assert len(o.logprobs) == 10
        for token, lp in zip(o.token_ids, o.logprobs):
            assert token in lp and lp[token] == max(lp.values()) and len(lp) == 3


def test_trace_records_every_step():
    llm = LLM(num_kv_blocks=64, max_num_batched_tokens=32)
    llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    trace = llm.trace
    assert [r.step for r in trace] == list(range(len(trace)))
    assert any(len({e.phase for e in r.scheduled}) == 2 for r in trace), "no mixed step"
    for r in trace:
        assert 0 < r.num_tokens <= 32 and r.start <= r.end
        assert set(r.block_tables) == {e.request_id for e in r.scheduled}
        for e in r.scheduled:
            needed = -(-(e.num_computed_tokens + e.num_tokens) // 16)
            assert len(r.block_tables[e.request_id]) >= needed
            assert e.phase in ("prefill", "decode") and (e.phase == "prefill" or e.num_tokens == 1)
    assert trace[-1].num_free_blocks == 64


def test_static_batching_waits_for_the_whole_batch():
    llm = LLM(num_kv_blocks=64, scheduling="static", max_num_seqs=2)
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (2, 12, 3)]
    llm.generate(PROMPTS[:3], params, use_tqdm=False)
    steps_of = {}
    for r in llm.trace:
        for e in r.scheduled:
            steps_of.setdefault(e.request_id, []).append(r.step)
    first, second, third = (steps_of[k] for k in sorted(steps_of, key=int))
    assert min(third) > max(first + second)  # the third waits for the slowest of the batch


# ---- bad input -------------------------------------------------------------------------------

def test_prompt_longer_than_context_is_rejected_and_engine_keeps_serving():
    llm = LLM(num_kv_blocks=64, max_model_len=64)
    with pytest.raises(ValueError, match="max_model_len=64"):
        llm.generate([PROMPTS[0], "word " * 80], GREEDY, use_tqdm=False)
    assert llm.stats()["num_waiting"] == 0  # the good prompt was not queued either
    out = llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)[0]
    assert len(out.token_ids) == 24
    assert llm.stats()["num_free_blocks"] == 64


def test_pool_too_small_for_one_request():
    llm = LLM(num_kv_blocks=2)
    with pytest.raises(ValueError, match="num_kv_blocks=2"):
        llm.generate(PROMPTS[3], GREEDY, use_tqdm=False)
    assert llm.generate("O", SamplingParams(max_tokens=4), use_tqdm=False)[0].token_ids


def test_prompt_over_budget_without_chunking():
    llm = LLM(num_kv_blocks=64, enable_chunked_prefill=False, max_num_batched_tokens=16)
    with pytest.raises(ValueError, match="max_num_batched_tokens=16"):
        llm.generate(PROMPTS[3], GREEDY, use_tqdm=False)


@pytest.mark.parametrize("prompt, match", [
    ("", "empty"), ([], "non-empty"), ([1, 10**9], "1000000000"), ([[1, 2], 3.5], "prompt"),
])
def test_bad_prompts(llm, prompt, match):
    with pytest.raises(ValueError, match=match):
        llm.generate(prompt, GREEDY, use_tqdm=False)


def test_bad_engine_arguments():
    with pytest.raises(ValueError, match="block_size"):
        LLM(block_size=3)
    with pytest.raises(ValueError, match="max_num_seqs"):
        LLM(max_num_seqs=0)
    with pytest.raises(ValueError, match="dtype"):
        LLM(dtype="float8")
    with pytest.raises(OSError, match="no-such-model"):
        LLM("/tmp/no-such-model")
    with pytest.raises(ValueError, match="2 SamplingParams"):
        LLM(num_kv_blocks=8).generate(["a", "b", "c"], [GREEDY, GREEDY])


def test_default_model_is_shipped():
    path = default_model_path()
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    size = sum(f.stat().st_size for f in path.iterdir())
    assert size < 16 * 2**20


def test_random_weights_from_a_config():
    from minillm import ModelConfig

    shape = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16)
    llm = LLM(shape, num_kv_blocks=16)
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=5, ignore_eos=True),
                       use_tqdm=False)[0]
    assert len(out.token_ids) == 5 and out.text == ""
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate("hello", use_tqdm=False)


def test_trace_names_finished_requests_and_cached_blocks():
    llm = LLM(num_kv_blocks=64, enable_prefix_caching=True)
    prompt = "Duke.\nWhat, is Antonio here?\n\nAnt.\nReady, so please your grace.\n"
    llm.generate([prompt], GREEDY, use_tqdm=False)
    last = llm.trace[-1]
    assert last.finished == ["0"]
    assert last.cached_blocks and set(last.cached_blocks) <= set(last.block_tables["0"])
    assert sorted(r for step in llm.trace for r in step.finished) == ["0"]
