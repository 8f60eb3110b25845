"""The decoder (minillm.model) and its config (minillm.model_config) against transformers itself.

Random checkpoints are made with transformers' own classes and save_pretrained, then loaded by
minillm from disk. Shapes: T tokens, V vocabulary.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from support import paged_logits

from minillm import LLM, ModelConfig, SamplingParams, default_model_path
from minillm.layers.weight_layout import transpose_weights
from minillm.model import LlamaForCausalLM, rope_inv_freq
from minillm.model_runner import X86
from minillm.request import RequestOutput

LOGITS_TOL = dict(atol=2e-5, rtol=1e-5)  # fp32 against fp32, same weights, different kernels
SHIPPED_LOGITS_TOL = dict(atol=1e-4, rtol=1e-5)  # 6 layers and trained (larger) logits
LOGPROB_TOL = 1e-4
NEAR_TIE = 1e-4  # a greedy pick may differ from transformers' only where its top-2 gap is below
# bf16 weights and activations against the fp32 reference, on logits of spread ~1: measured
# worst 0.11 at one position and 0.017 on average over the five checkpoints.
BF16_LOGITS_ATOL, BF16_LOGITS_MEAN_ERROR = 0.25, 0.03
MAX_TOKENS = 8
TOP_K = 5
PROMPT_LENGTHS = (1, 6, 17, 40)  # one token, under a block, around the 16-token chunk, 3 chunks


def hf_configs() -> dict[str, object]:
    """Varied small shapes, each exercising a different part of the loader and the decoder."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    common = dict(vocab_size=384, num_hidden_layers=2, max_position_embeddings=256,
                  rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    llama3_rope = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                       high_freq_factor=4.0, original_max_position_embeddings=256)
    return {
        # GQA (G=2), untied, default rope_theta.
        "llama-gqa": LlamaConfig(hidden_size=64, intermediate_size=160, num_attention_heads=4,
                                 num_key_value_heads=2, **common),
        # MHA, head_dim 24 != 64 / 4, q/k/v/o biases, tied embeddings, rope_theta 5e5.
        "llama-mha-bias-tied": LlamaConfig(hidden_size=64, intermediate_size=128,
                                           num_attention_heads=4, num_key_value_heads=4,
                                           head_dim=24, attention_bias=True,
                                           tie_word_embeddings=True, rope_theta=500000.0,
                                           **common),
        # Llama 3.1 rope scaling with short, medium and long wavelengths all present (G=4).
        "llama3-rope": LlamaConfig(hidden_size=128, intermediate_size=192, num_attention_heads=8,
                                   num_key_value_heads=2, rope_parameters=llama3_rope,
                                   **dict(common, max_position_embeddings=1024)),
        # Qwen2: q/k/v biases without an o bias, tied, G=3.
        "qwen2": Qwen2Config(hidden_size=96, intermediate_size=160, num_attention_heads=6,
                             num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6,
                             **common),
        # Mistral without a sliding window, one KV head, head_dim 32 != 64 / 4.
        "mistral": MistralConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                 num_key_value_heads=1, head_dim=32, sliding_window=None,
                                 rope_theta=1e6, **common),
    }


@dataclass
class Checkpoint:
    name: str
    path: Path
    hf: object  # the transformers model that was saved, in eval mode


def randomize(model: torch.nn.Module) -> None:
    """Weights large enough that logits spread (few near-ties) and every bias and norm matters:
    transformers initialises biases to zero and norms to one, which would hide their loading."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.1)


def save_checkpoint(config: object, folder: Path, seed: int) -> object:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model)
    model.save_pretrained(folder)
    return model.eval()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Checkpoint]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {name: Checkpoint(name, root / name, save_checkpoint(config, root / name, seed))
            for seed, (name, config) in enumerate(hf_configs().items())}


CHECKPOINT_NAMES = list(hf_configs())


def make_prompts(vocab_size: int, lengths: tuple[int, ...] = PROMPT_LENGTHS, seed: int = 0
                 ) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=gen).tolist() for n in lengths]


# ---- references ------------------------------------------------------------------------------


@torch.no_grad()
def hf_logits(hf: object, prompt: list[int]) -> torch.Tensor:
    """transformers' logits at every prompt position: (T, V) float32."""
    return hf(torch.tensor([prompt])).logits[0].float()


@torch.no_grad()
def hf_greedy(hf: object, prompt: list[int], max_tokens: int) -> tuple[list[int], torch.Tensor]:
    """transformers' own greedy generate: the new tokens and the logits each was picked from."""
    ids = torch.tensor([prompt])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                      max_new_tokens=max_tokens, return_dict_in_generate=True, output_logits=True,
                      eos_token_id=None, pad_token_id=0)  # no eos: minillm runs with ignore_eos
    tokens = out.sequences[0, len(prompt):].tolist()
    assert len(tokens) == max_tokens
    return tokens, torch.stack(out.logits)[:, 0].float()  # (max_tokens, V)


def assert_matches_greedy_reference(out: RequestOutput, ref_tokens: list[int],
                                    ref_logits: torch.Tensor, top_k: int) -> None:
    """Same greedy tokens and logprobs as transformers, up to the first near-tie."""
    assert out.finish_reason == "length" and len(out.token_ids) == len(ref_tokens)
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)
    for step, (token, ref_token, logprobs) in enumerate(zip(out.token_ids, ref_tokens,
                                                            out.logprobs, strict=True)):
        ref = ref_logits[step].log_softmax(dim=-1)  # (V,)
        assert token in logprobs and len(logprobs) in (top_k, top_k + 1)
        for t, lp in logprobs.items():
            assert abs(lp - ref[t].item()) < LOGPROB_TOL, (step, t, lp, ref[t].item())
        ours = sorted(logprobs.values(), reverse=True)[:top_k]
        torch.testing.assert_close(torch.tensor(ours), ref.topk(top_k).values,
                                   atol=LOGPROB_TOL, rtol=0)
        assert logprobs[token] == max(logprobs.values())  # greedy picks its own best
        if token != ref_token:
            top2 = ref_logits[step].topk(2).values
            gap = (top2[0] - top2[1]).item()
            assert gap < NEAR_TIE, f"step {step}: {token} != {ref_token} with a gap of {gap}"
            return  # the two continuations differ from here on


# ---- logits ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CHECKPOINT_NAMES)
def test_prompt_logits_match_transformers(checkpoints: dict[str, Checkpoint], name: str) -> None:
    ckpt = checkpoints[name]
    model = LlamaForCausalLM.from_pretrained(ckpt.path)
    prompts = make_prompts(model.config.vocab_size)
    refs = [hf_logits(ckpt.hf, p) for p in prompts]
    whole = paged_logits(model, prompts, block_size=16)
    chunked = paged_logits(model, prompts, block_size=4, chunk=5, seed=1)
    for ref, got_whole, got_chunked in zip(refs, whole, chunked, strict=True):
        torch.testing.assert_close(got_whole, ref, **LOGITS_TOL)
        torch.testing.assert_close(got_chunked, ref, **LOGITS_TOL)


@pytest.mark.parametrize("name", CHECKPOINT_NAMES)
def test_bfloat16_logits_stay_close_to_fp32(checkpoints: dict[str, Checkpoint], name: str
                                            ) -> None:
    ckpt = checkpoints[name]
    model = LlamaForCausalLM.from_pretrained(ckpt.path, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert model.model.rotary.inv_freq.dtype == torch.float32  # angles stay exact
    prompts = make_prompts(model.config.vocab_size, (3, 20))
    got_logits = paged_logits(model, prompts, block_size=4, chunk=8)
    for got, prompt in zip(got_logits, prompts, strict=True):
        assert got.dtype == torch.float32
        ref = hf_logits(ckpt.hf, prompt)
        torch.testing.assert_close(got, ref, atol=BF16_LOGITS_ATOL, rtol=0)
        assert (got - ref).abs().mean() < BF16_LOGITS_MEAN_ERROR
        assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.8


def test_random_bfloat16_model_keeps_fp32_rope_frequencies() -> None:
    config = ModelConfig.from_hf(dict(HF4_LLAMA3, vocab_size=64, hidden_size=32,
                                      intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2))
    model = LlamaForCausalLM.random(config, dtype=torch.bfloat16)
    assert model.lm_head.weight.dtype == torch.bfloat16
    inv_freq = model.model.rotary.inv_freq
    assert inv_freq.dtype == torch.float32  # bf16 frequencies rotate position 2000 by ~0.4 rad off
    assert torch.equal(inv_freq, rope_inv_freq(config))


def test_tied_embeddings_share_one_tensor(checkpoints: dict[str, Checkpoint]) -> None:
    tied = LlamaForCausalLM.from_pretrained(checkpoints["qwen2"].path)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    untied = LlamaForCausalLM.from_pretrained(checkpoints["llama-gqa"].path)
    assert not torch.equal(untied.lm_head.weight, untied.model.embed_tokens.weight)



def test_transposed_weights_compute_the_same_projections(checkpoints: dict[str, Checkpoint]
                                                         ) -> None:
    model = LlamaForCausalLM.from_pretrained(checkpoints["qwen2"].path)  # tied embeddings
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    torch.manual_seed(0)
    inputs = {n: torch.randn(5, m.in_features) for n, m in linears.items()}
    before = {n: m(inputs[n]) for n, m in linears.items()}
    embedding = model.model.embed_tokens.weight
    transpose_weights(model, tied=embedding)
    for name, module in linears.items():
        torch.testing.assert_close(module(inputs[name]), before[name], rtol=1e-5, atol=1e-6)
        if name != "lm_head":  # stored as W^T's rows: column-major, the same shape
            assert module.weight.t().is_contiguous() and not module.weight.is_contiguous()
    assert model.lm_head.weight is model.model.embed_tokens.weight is embedding  # still tied
    assert embedding.is_contiguous()  # the embedding reads it by rows


@pytest.mark.skipif(platform.machine() not in X86, reason="the layout is chosen for x86 CPUs")
def test_cpu_engine_transposes_float32_weights_only() -> None:
    fp32 = LLM(dtype="float32", num_kv_blocks=32)
    assert fp32.model.model.layers[0].mlp.down_proj.weight.t().is_contiguous()
    bf16 = LLM(dtype="bfloat16", num_kv_blocks=32)  # 4x slower transposed: left as loaded
    assert bf16.model.model.layers[0].mlp.down_proj.weight.is_contiguous()


# ---- generate ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def greedy_references(checkpoints: dict[str, Checkpoint]
                      ) -> dict[str, list[tuple[list[int], torch.Tensor]]]:
    refs = {}
    for name, ckpt in checkpoints.items():
        prompts = make_prompts(ckpt.hf.config.vocab_size)
        refs[name] = [hf_greedy(ckpt.hf, p, MAX_TOKENS) for p in prompts]
    return refs


ENGINE_SETTINGS = {
    # Prompts split into chunks of the 16-token budget, sharing steps with decodes.
    "chunked": dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=16),
    # Whole prompts in prefill steps, then decode steps.
    "whole": dict(block_size=16, num_kv_blocks=16, enable_chunked_prefill=False),
}


@pytest.mark.parametrize("settings", list(ENGINE_SETTINGS))
@pytest.mark.parametrize("name", CHECKPOINT_NAMES)
def test_greedy_generate_matches_transformers(checkpoints: dict[str, Checkpoint],
                                              greedy_references: dict, name: str,
                                              settings: str) -> None:
    llm = LLM(checkpoints[name].path, device="cpu", dtype="float32", **ENGINE_SETTINGS[settings])
    prompts = make_prompts(llm.model.config.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=TOP_K,
                            ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == prompts
    for out, (ref_tokens, ref_logits) in zip(outputs, greedy_references[name], strict=True):
        assert_matches_greedy_reference(out, ref_tokens, ref_logits, TOP_K)
    prefill_chunks = [e for r in llm.trace for e in r.scheduled if e.phase == "prefill"]
    if settings == "chunked":  # a prompt continued over its cached prefix, beside decodes
        assert any(e.num_computed_tokens > 0 for e in prefill_chunks)
        assert any({e.phase for e in r.scheduled} == {"prefill", "decode"} for r in llm.trace)
    else:
        assert all(e.num_computed_tokens == 0 for e in prefill_chunks)


def test_llm_in_bfloat16_generates_close_to_fp32(checkpoints: dict[str, Checkpoint],
                                                 greedy_references: dict) -> None:
    """The engine end to end in bf16: its first pick is (near-)best under fp32 transformers."""
    name = "llama-mha-bias-tied"
    llm = LLM(checkpoints[name].path, device="cpu", dtype="bfloat16", block_size=4,
              num_kv_blocks=64, max_num_batched_tokens=16)
    assert llm.engine.runner.kv_cache.dtype == torch.bfloat16
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=TOP_K,
                            ignore_eos=True)
    outputs = llm.generate(make_prompts(llm.model.config.vocab_size), params, use_tqdm=False)
    for out, (_, ref_logits) in zip(outputs, greedy_references[name], strict=True):
        assert len(out.token_ids) == MAX_TOKENS
        ref = ref_logits[0].log_softmax(dim=-1)  # the first step shares the prompt exactly
        for t, lp in out.logprobs[0].items():
            assert abs(lp - ref[t].item()) < BF16_LOGITS_ATOL
        assert ref.max() - ref[out.token_ids[0]] < BF16_LOGITS_ATOL


def test_greedy_generate_matches_transformers_under_preemption(
        checkpoints: dict[str, Checkpoint], greedy_references: dict) -> None:
    """A pool too small for every request at once: preempted requests are recomputed."""
    name = "llama-gqa"
    llm = LLM(checkpoints[name].path, device="cpu", dtype="float32", block_size=4,
              num_kv_blocks=14, max_num_batched_tokens=16)
    prompts = make_prompts(llm.model.config.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=TOP_K,
                            ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats()["num_preemptions"] > 0
    for out, (ref_tokens, ref_logits) in zip(outputs, greedy_references[name], strict=True):
        assert_matches_greedy_reference(out, ref_tokens, ref_logits, TOP_K)


def test_greedy_generate_matches_transformers_with_prefix_caching(
        checkpoints: dict[str, Checkpoint]) -> None:
    """Prompts sharing a 12-token prefix: later ones attend over blocks the first one wrote."""
    ckpt = checkpoints["qwen2"]
    llm = LLM(ckpt.path, device="cpu", dtype="float32", block_size=4, num_kv_blocks=64,
              enable_prefix_caching=True)
    shared, tails = make_prompts(384, (12,), seed=7)[0], make_prompts(384, (1, 3, 9), seed=8)
    params = SamplingParams(temperature=0, max_tokens=4, logprobs=TOP_K, ignore_eos=True)
    first = llm.generate([shared + tails[0]], params, use_tqdm=False)
    rest = llm.generate([shared + t for t in tails[1:]], params, use_tqdm=False)
    assert llm.stats()["prefix_cache_hits"] > 0
    for out in first + rest:
        ref_tokens, ref_logits = hf_greedy(ckpt.hf, out.prompt_token_ids, 4)
        assert_matches_greedy_reference(out, ref_tokens, ref_logits, TOP_K)


# ---- the shipped model -------------------------------------------------------------------------


def test_shipped_model_matches_transformers() -> None:
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm = LLM(path, device="cpu", dtype="float32", block_size=16, num_kv_blocks=64)
    assert llm.tokenizer is not None
    texts = ["ROMEO.\nWhat light", "FIRST CITIZEN.\nBefore we proceed any further, hear me speak."]
    prompts = [llm.tokenizer.encode(t) for t in texts]
    got_logits = paged_logits(llm.model, prompts, block_size=16, chunk=7)
    for got, prompt in zip(got_logits, prompts, strict=True):
        torch.testing.assert_close(got, hf_logits(hf, prompt), **SHIPPED_LOGITS_TOL)
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=TOP_K, ignore_eos=True)
    for out in llm.generate(texts, params, use_tqdm=False):
        ref_tokens, ref_logits = hf_greedy(hf, out.prompt_token_ids, 12)
        assert_matches_greedy_reference(out, ref_tokens, ref_logits, TOP_K)


# ---- ModelConfig -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CHECKPOINT_NAMES)
def test_config_from_hf_reads_every_shape_field(checkpoints: dict[str, Checkpoint], name: str
                                                ) -> None:
    hf = checkpoints[name].hf
    saved = json.loads((checkpoints[name].path / "config.json").read_text())
    config = ModelConfig.from_hf(saved)
    attn = hf.model.layers[0].self_attn
    assert config.model_type == hf.config.model_type
    assert config.vocab_size == hf.config.vocab_size
    assert config.hidden_size == hf.config.hidden_size
    assert config.num_hidden_layers == len(hf.model.layers)
    assert config.num_attention_heads * config.head_dim == attn.q_proj.out_features
    assert config.num_key_value_heads * config.head_dim == attn.k_proj.out_features
    assert config.head_dim == attn.head_dim
    assert config.intermediate_size == hf.model.layers[0].mlp.up_proj.out_features
    assert config.qkv_bias == (attn.q_proj.bias is not None)
    assert config.o_bias == (attn.o_proj.bias is not None)
    assert config.tie_word_embeddings == (hf.lm_head.weight is hf.model.embed_tokens.weight)
    assert config.rope_theta == hf.config.rope_parameters["rope_theta"]
    assert config.rms_norm_eps == hf.config.rms_norm_eps
    assert config.sliding_window is None


@pytest.mark.parametrize("name", CHECKPOINT_NAMES)
def test_num_params_counts_transformers_parameters(checkpoints: dict[str, Checkpoint], name: str
                                                   ) -> None:
    hf = checkpoints[name].hf
    config = ModelConfig.from_pretrained(checkpoints[name].path)
    assert config.num_params == sum(p.numel() for p in hf.parameters())  # tied counted once
    model = LlamaForCausalLM.from_pretrained(checkpoints[name].path)
    assert config.num_params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ["llama-gqa", "llama-mha-bias-tied", "llama3-rope"])
def test_rope_frequencies_match_transformers(checkpoints: dict[str, Checkpoint], name: str
                                             ) -> None:
    config = ModelConfig.from_pretrained(checkpoints[name].path)
    ref = checkpoints[name].hf.model.rotary_emb.inv_freq
    torch.testing.assert_close(rope_inv_freq(config), ref, atol=0, rtol=1e-6)
    if name == "llama3-rope":  # short wavelengths kept, long slowed 8x, the middle interpolated
        ratio = ref / (1.0 / config.rope_theta ** (torch.arange(0, config.head_dim, 2) /
                                                   config.head_dim))
        assert ratio[0] == pytest.approx(1.0) and ratio[-1] == pytest.approx(1 / 8)
        assert ((ratio < 0.99) & (ratio > 0.13)).any()


HF4_LLAMA3 = {
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": True, "hidden_act": "silu", "eos_token_id": [128001, 128008, 128009],
}


def test_config_from_hf_reads_transformers_4_rope_keys() -> None:
    config = ModelConfig.from_hf(HF4_LLAMA3)  # Llama 3.2 1B's config.json
    assert config.rope_theta == 500000.0
    assert config.rope_scaling is not None and config.rope_scaling["rope_type"] == "llama3"
    assert config.rope_scaling["factor"] == 32.0
    assert config.head_dim == 64 and config.num_key_value_heads == 8
    assert config.eos_token_id == [128001, 128008, 128009]
    assert config.num_params == 1_235_814_400  # the published size of Llama 3.2 1B
    old = dict(HF4_LLAMA3, rope_scaling={k if k != "rope_type" else "type": v
                                         for k, v in HF4_LLAMA3["rope_scaling"].items()})
    assert ModelConfig.from_hf(old).rope_scaling["type"] == "llama3"  # the oldest spelling
    torch.testing.assert_close(rope_inv_freq(ModelConfig.from_hf(old)), rope_inv_freq(config))
    plain = dict(HF4_LLAMA3, rope_theta=1e6, rope_scaling=None)
    assert ModelConfig.from_hf(plain).rope_theta == 1e6
    assert ModelConfig.from_hf(plain).rope_scaling is None


def test_config_from_hf_reads_transformers_5_rope_parameters() -> None:
    hf5 = {k: v for k, v in HF4_LLAMA3.items() if k not in ("rope_theta", "rope_scaling")}
    hf5["rope_parameters"] = dict(HF4_LLAMA3["rope_scaling"], rope_theta=500000.0)
    config = ModelConfig.from_hf(hf5)
    assert config == ModelConfig.from_hf(HF4_LLAMA3)
    assert config.rope_scaling == HF4_LLAMA3["rope_scaling"]  # rope_theta is not a scaling key
    default = dict(hf5, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    assert ModelConfig.from_hf(default).rope_theta == 1e6
    assert ModelConfig.from_hf(default).rope_scaling is None
    no_rope = {k: v for k, v in hf5.items() if k != "rope_parameters"}
    assert ModelConfig.from_hf(no_rope).rope_theta == 10000.0


def test_config_defaults_kv_heads_and_head_dim() -> None:
    hf = {k: v for k, v in HF4_LLAMA3.items() if k != "num_key_value_heads"}
    config = ModelConfig.from_hf(hf)
    assert config.num_key_value_heads == 32 and config.head_dim == 2048 // 32


def test_missing_folder_raises_oserror_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(OSError, match="no-such-model"):
        ModelConfig.from_pretrained(missing)
    with pytest.raises(OSError, match="no-such-model"):
        LlamaForCausalLM.from_pretrained(missing)
    with pytest.raises(OSError, match="no-such-model"):
        LLM(missing, device="cpu")


def test_folder_without_weights_raises_oserror(checkpoints: dict[str, Checkpoint],
                                               tmp_path: Path) -> None:
    folder = tmp_path / "config-only"
    folder.mkdir()
    (folder / "config.json").write_text((checkpoints["llama-gqa"].path / "config.json")
                                        .read_text())
    with pytest.raises(OSError, match="config-only"):
        LlamaForCausalLM.from_pretrained(folder)


@pytest.mark.parametrize("model_type", ["gpt2", "gemma", "mixtral"])
def test_unsupported_model_type_raises_valueerror(model_type: str, tmp_path: Path) -> None:
    hf = dict(HF4_LLAMA3, model_type=model_type)
    with pytest.raises(ValueError, match=model_type):
        ModelConfig.from_hf(hf)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match=model_type):
        LlamaForCausalLM.from_pretrained(tmp_path)


def test_unsupported_rope_scaling_raises_valueerror() -> None:
    config = ModelConfig.from_hf(dict(HF4_LLAMA3, rope_scaling={"type": "linear", "factor": 2.0}))
    with pytest.raises(ValueError, match="linear"):
        rope_inv_freq(config)


def test_checkpoint_of_another_shape_raises_valueerror(checkpoints: dict[str, Checkpoint],
                                                       tmp_path: Path) -> None:
    """Weights that do not fit the config are refused rather than silently half-loaded."""
    src = checkpoints["llama-mha-bias-tied"].path
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    hf = json.loads((src / "config.json").read_text())
    hf["attention_bias"] = False  # the saved biases are now unexpected
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match="does not fit"):
        LlamaForCausalLM.from_pretrained(tmp_path)
