"""Named shapes of public models, from their published Hugging Face config.json files.

The shapes feed the calculators (KV bytes, roofline, simulator) and, with random weights, the
speed and memory chapters on a GPU. No weights are downloaded: `LlamaForCausalLM.random`
(minillm.model) fills a shape with random numbers, which is all a speed or memory experiment
needs. This module imports no torch and no engine: the calculators stand on it.

    >>> from minillm import models
    >>> models.get("llama-3-8b").num_params        # computed from the shape
    8030261248
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from functools import cache
from typing import Any

from minillm.model_config import ModelConfig

# A model as the calculators take it: a name, a ModelConfig, a config.json dict, or a
# transformers PretrainedConfig (Any: transformers is not imported here).
ModelLike = str | ModelConfig | Mapping[str, Any] | Any

# The fields of each model's config.json that decide its shape, copied from the Hugging Face
# repository named in "_repo" (the base model; instruct variants share the shape).
_LLAMA3 = dict(model_type="llama", vocab_size=128256, rms_norm_eps=1e-5, rope_theta=500000.0,
               bos_token_id=128000, eos_token_id=128001)
_LLAMA31_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                     original_max_position_embeddings=8192)
_QWEN = dict(rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False)

HF_CONFIGS: dict[str, dict[str, Any]] = {
    "llama-3-8b": dict(_LLAMA3, _repo="meta-llama/Meta-Llama-3-8B", hidden_size=4096,
                       intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, max_position_embeddings=8192),
    "llama-3-70b": dict(_LLAMA3, _repo="meta-llama/Meta-Llama-3-70B", hidden_size=8192,
                        intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                        num_key_value_heads=8, max_position_embeddings=8192),
    "llama-3.1-8b": dict(_LLAMA3, _repo="meta-llama/Llama-3.1-8B", hidden_size=4096,
                         intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, max_position_embeddings=131072,
                         rope_scaling=_LLAMA31_ROPE),
    "llama-3.1-405b": dict(_LLAMA3, _repo="meta-llama/Llama-3.1-405B", hidden_size=16384,
                           intermediate_size=53248, num_hidden_layers=126,
                           num_attention_heads=128, num_key_value_heads=8,
                           max_position_embeddings=131072, rope_scaling=_LLAMA31_ROPE),
    "llama-3.2-1b": dict(_LLAMA3, _repo="meta-llama/Llama-3.2-1B", hidden_size=2048,
                         intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                         rope_scaling=dict(_LLAMA31_ROPE, factor=32.0), tie_word_embeddings=True),
    "qwen2.5-0.5b": dict(_QWEN, _repo="Qwen/Qwen2.5-0.5B", model_type="qwen2", vocab_size=151936,
                         hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2,
                         max_position_embeddings=32768, tie_word_embeddings=True,
                         eos_token_id=151643),
    "qwen2.5-7b": dict(_QWEN, _repo="Qwen/Qwen2.5-7B", model_type="qwen2", vocab_size=152064,
                       hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4,
                       max_position_embeddings=131072, eos_token_id=151643),
    # Qwen3: head_dim 128 although hidden_size / heads = 64, no qkv bias, and an RMSNorm on each
    # head's q and k (2 * 128 weights a layer) that minillm's decoder does not have.
    "qwen3-0.6b": dict(_QWEN, _repo="Qwen/Qwen3-0.6B", model_type="qwen3", vocab_size=151936,
                       hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       max_position_embeddings=40960, tie_word_embeddings=True,
                       eos_token_id=151645),
    # ~135M parameters (0.54 GB in fp32): too big for a CPU's caches, small enough to run on
    # one core, so a CPU reader can measure decode against the weight-bandwidth roof.
    "smollm2-135m": dict(_repo="HuggingFaceTB/SmolLM2-135M", model_type="llama", vocab_size=49152,
                         hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                         max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
                         tie_word_embeddings=True, bos_token_id=0, eos_token_id=0),
    # v0.3: no sliding window, so every context up to 32k runs in minillm as it does in HF.
    "mistral-7b": dict(_repo="mistralai/Mistral-7B-v0.3", model_type="mistral", vocab_size=32768,
                       hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8,
                       max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=1000000.0,
                       sliding_window=None, eos_token_id=2),
    "mistral-7b-v0.1": dict(_repo="mistralai/Mistral-7B-v0.1", model_type="mistral",
                            vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                            num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                            max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=10000.0,
                            sliding_window=4096, eos_token_id=2),
}

# Model types whose shape arithmetic matches a supported one (only the extra q/k norms differ).
_SHAPE_ALIASES = {"qwen3": "llama"}


def names() -> list[str]:
    """The known model names, e.g. "llama-3-8b", in a stable order."""
    return list(HF_CONFIGS)


def hf_repo(name: str) -> str:
    """The Hugging Face repository whose config.json the named shape was copied from."""
    return HF_CONFIGS[_canonical(name)]["_repo"]


def _canonical(name: str) -> str:
    key = name.strip().lower()
    if key in HF_CONFIGS:
        return key
    for known, hf in HF_CONFIGS.items():  # also accept the repository id, "Qwen/Qwen3-0.6B"
        if hf["_repo"].lower() == key:
            return known
    raise ValueError(f"unknown model name {name!r}; known: {', '.join(names())}")


def get(name: str) -> ModelConfig:
    """The ModelConfig of a named public model (case-insensitive; a Hugging Face repo id works
    too). Its num_params is computed from the shape. Unknown name -> ValueError listing all."""
    if not isinstance(name, str):
        raise ValueError(f"model name must be a str, got {type(name).__name__}: {name!r}")
    return _build(_canonical(name))


@cache
def _build(key: str) -> ModelConfig:
    # One object per name, so calculators caching on the config compute its constants once.
    return from_hf_dict(HF_CONFIGS[key])


def from_hf_dict(hf: Mapping[str, Any]) -> ModelConfig:
    """A ModelConfig from a config.json dict; also reads Qwen3, for shape arithmetic (its q/k
    norms, 256 weights a layer, are neither counted in num_params nor built by
    LlamaForCausalLM.random)."""
    hf = {k: v for k, v in hf.items() if not k.startswith("_")}
    model_type = hf.get("model_type", "llama")
    alias = _SHAPE_ALIASES.get(model_type)
    if alias is None:
        return ModelConfig.from_hf(hf)
    return dataclasses.replace(ModelConfig.from_hf({**hf, "model_type": alias}),
                               model_type=model_type)


def as_config(model: ModelLike) -> ModelConfig:
    """A model given as a name, a ModelConfig, a config.json dict or a transformers
    PretrainedConfig (anything with to_dict()), as a ModelConfig."""
    if isinstance(model, ModelConfig):
        return model
    if isinstance(model, str):
        return get(model)
    if isinstance(model, Mapping):
        return from_hf_dict(model)
    if callable(getattr(model, "to_dict", None)):
        return from_hf_dict(model.to_dict())
    raise ValueError(f"model must be a name ({', '.join(names())}), a ModelConfig, a config.json "
                     f"dict or a transformers config, got {type(model).__name__}: {model!r}")
