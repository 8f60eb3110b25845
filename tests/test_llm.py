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


# ---- dtype per device (issue 13, item 1) ------------------------------------------------------

@pytest.mark.parametrize("capability, want", [
    ((7, 5), "float16"),  # T4 (free Colab/Kaggle): no bfloat16 tensor cores
    ((7, 0), "float16"),  # V100
    ((8, 0), "bfloat16"),  # A100
    ((8, 9), "bfloat16"),  # L4
    ((9, 0), "bfloat16"),  # H100, H200
])
def test_default_gpu_dtype_follows_the_compute_capability(monkeypatch, capability, want):
    import torch

    from minillm.llm import resolve_dtype

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert resolve_dtype(None, torch.device("cuda")) == getattr(torch, want)
    # An explicit dtype is the reader's choice, whatever the device.
    assert resolve_dtype("bfloat16", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype(torch.float32, torch.device("cuda")) == torch.float32
    assert resolve_dtype(None, torch.device("cpu")) == torch.float32


# ---- KV pool sizing from a profiled step (issue 13, item 6) -----------------------------------

GB = 10**9


def fake_report(weights=16 * GB, step=2 * GB, others=5 * GB, context=GB // 2, total=80 * GB):
    from minillm.llm import MemoryReport

    return MemoryReport(total=total, free=total - weights - others - context,
                        allocated=weights, peak=weights + step)


def test_pool_bytes_are_this_process_share_less_its_peak_not_other_processes_memory():
    from minillm.llm import kv_pool_bytes

    # 80 GB at 0.9 is 72 GB; our weights and largest step peak at 18 GB: 54 GB, although another
    # process holds 5 GB (the old mem_get_info rule charged those to us: 72 - 21.5 - 0.5 = 50).
    assert kv_pool_bytes(fake_report(), 0.9) == 54 * GB
    # A bigger step leaves exactly that much less.
    assert kv_pool_bytes(fake_report(step=6 * GB), 0.9) == 50 * GB
    # What other processes hold is never taken: 80 - 16 - 30 - 0.5 free, less the 2 GB step.
    assert kv_pool_bytes(fake_report(others=30 * GB), 0.9) == 31.5 * GB
    assert kv_pool_bytes(fake_report(others=70 * GB), 0.9) == 0


def test_pool_blocks_from_a_faked_report_are_capped_at_full_seats():
    from minillm import EngineConfig, ModelConfig
    from minillm.kv_cache import kv_cache_block_bytes
    from minillm.llm import LlamaForCausalLM, MemoryReport, num_kv_blocks_for_memory

    shape = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16)
    net = LlamaForCausalLM.random(shape)
    block = kv_cache_block_bytes(2, 16, 2, 16, 4)  # 8 KiB in float32
    config = EngineConfig(max_num_seqs=4, gpu_memory_utilization=0.5)
    report = MemoryReport(total=2**30, free=2**29, allocated=2**20, peak=2**21)
    pool = 2**29 - 2**21  # half the card less the peak; free less the step is more
    assert num_kv_blocks_for_memory(config, net, 10**6, report) == pool // block
    assert num_kv_blocks_for_memory(config, net, 1024, report) == 4 * 1024 // 16  # seats
    full = MemoryReport(total=2**30, free=2**20, allocated=2**20, peak=2**21)
    with pytest.raises(ValueError, match="no GPU memory left for the KV cache"):
        num_kv_blocks_for_memory(config, net, 1024, full)


def test_profile_memory_empties_the_cache_then_measures_the_largest_step(monkeypatch):
    import torch

    import minillm.llm as llm_module

    calls = []
    fake = {"empty_cache": None, "reset_peak_memory_stats": None, "synchronize": None,
            "memory_allocated": 3 * GB, "max_memory_allocated": 5 * GB,
            "mem_get_info": (60 * GB, 80 * GB)}
    for name, value in fake.items():
        monkeypatch.setattr(torch.cuda, name,
                            lambda *a, name=name, value=value: calls.append(name) or value)
    monkeypatch.setattr(llm_module, "run_largest_step", lambda *a: calls.append("step"))
    net = llm_module.LlamaForCausalLM.random(llm_module.ModelConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8))
    report = llm_module.profile_memory(net, llm_module.EngineConfig(), 64)
    assert report == llm_module.MemoryReport(total=80 * GB, free=60 * GB, allocated=3 * GB,
                                             peak=5 * GB)
    # Cached blocks left by a weight cast go before anything is read; free is read last.
    assert calls.index("empty_cache") < calls.index("memory_allocated") < calls.index("step")
    assert calls.index("reset_peak_memory_stats") < calls.index("step")
    assert calls.index("step") < calls.index("max_memory_allocated") < calls.index("mem_get_info")
    assert "empty_cache" in calls[calls.index("step"):calls.index("mem_get_info")]
    line = llm_module.describe_pool(1000, 2**20, 16, report)
    assert "1,000 blocks x 16 tokens = 16,000 tokens, 0.98 GiB" in line
    assert "largest step 1.86 GiB" in line


def test_the_profiled_step_is_the_largest_a_config_allows():
    from minillm import EngineConfig, ModelConfig
    from minillm.llm import LlamaForCausalLM, run_largest_step

    net = LlamaForCausalLM.random(ModelConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16))
    record = run_largest_step(net, EngineConfig(max_num_seqs=6, max_num_batched_tokens=100), 512)
    assert record.num_tokens == 100 and len(record.scheduled) == 6  # the whole budget, every seat
    assert record.finished == [e.request_id for e in record.scheduled]  # each one sampled
    # A short max_model_len caps each prompt (one slot is left for the sampled token).
    record = run_largest_step(net, EngineConfig(max_num_seqs=6, max_num_batched_tokens=100), 9)
    assert record.num_tokens == 48


def test_on_a_gpu_llm_sizes_the_pool_from_the_profile_and_prints_it(monkeypatch, capsys):
    from types import SimpleNamespace

    import torch

    import minillm.llm as llm_module
    from minillm import EngineConfig, ModelConfig

    shape = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16)  # 4 KiB a block of 16 tokens in bfloat16
    weight = SimpleNamespace(device=torch.device("cuda"), element_size=lambda: 2)
    net = SimpleNamespace(config=shape, lm_head=SimpleNamespace(weight=weight))
    report = llm_module.MemoryReport(total=2**30, free=2**29, allocated=2**27, peak=2**28)
    monkeypatch.setattr(llm_module, "profile_memory", lambda *args: report)
    blocks = llm_module.LLM._size_pool(EngineConfig(), net, 10**6)  # type: ignore[arg-type]
    assert blocks == (2**29 - 2**27) // 4096  # free less the step: tighter than 0.9 of the card
    assert f"KV pool: {blocks:,} blocks x 16 tokens" in capsys.readouterr().out
