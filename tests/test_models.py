"""Named model shapes (minillm.models): lookup, parameter counts from the shape, random weights.

Parameter counts are checked against the totals Hugging Face reports for each checkpoint
(safetensors metadata); ours are computed from the shape alone, so agreement to the parameter
says the shape was copied right.
"""

from __future__ import annotations

import pytest
import torch

from minillm.calc import models
from minillm.model import LlamaForCausalLM
from minillm.model_config import ModelConfig

pytestmark = pytest.mark.ch03  # the shapes behind weight and KV sizing

HF_PARAM_COUNTS = {
    "llama-3-8b": 8_030_261_248,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "llama-3.2-1b": 1_235_814_400,  # tied embeddings counted once
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-7b": 7_615_616_512,
    "mistral-7b": 7_248_023_552,  # v0.3
    "mistral-7b-v0.1": 7_241_732_096,
}


def test_required_names_are_known():
    for name in ("llama-3-8b", "llama-3-70b", "llama-3.2-1b", "qwen2.5-0.5b", "qwen3-0.6b",
                 "mistral-7b"):
        assert name in models.names()
        assert isinstance(models.get(name), ModelConfig)


@pytest.mark.parametrize("name,count", HF_PARAM_COUNTS.items())
def test_num_params_match_hugging_face(name, count):
    assert models.get(name).num_params == count


def test_num_params_round_figures():
    """The figures a reader knows the models by, within 1%."""
    for name, billions in [("llama-3-8b", 8.03), ("llama-3-70b", 70.6), ("llama-3.2-1b", 1.24),
                           ("qwen2.5-0.5b", 0.49), ("mistral-7b", 7.24), ("qwen3-0.6b", 0.596)]:
        assert models.get(name).num_params == pytest.approx(billions * 1e9, rel=0.01)


def test_qwen3_shape():
    """head_dim 128 although hidden / heads = 64; only the q/k norms (2 * 128 a layer) are
    missing from num_params against HF's 596,049,920."""
    c = models.get("qwen3-0.6b")
    assert (c.head_dim, c.hidden_size // c.num_attention_heads) == (128, 64)
    assert c.model_type == "qwen3" and not c.qkv_bias
    assert c.num_params + c.num_hidden_layers * 2 * c.head_dim == 596_049_920


def test_lookup_is_case_insensitive_and_accepts_repo_ids():
    assert models.get("Llama-3-8B") is models.get("llama-3-8b")
    assert models.get("Qwen/Qwen3-0.6B") is models.get("qwen3-0.6b")
    assert models.hf_repo("mistral-7b") == "mistralai/Mistral-7B-v0.3"


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="llama-5.*known:.*llama-3-8b.*qwen3-0.6b"):
        models.get("llama-5")
    with pytest.raises(ValueError, match="must be a str"):
        models.get(8)


def test_as_config_accepts_dicts_and_transformers_configs():
    from transformers import LlamaConfig

    hf = dict(models.HF_CONFIGS["llama-3-8b"])
    assert models.as_config(hf) == models.get("llama-3-8b")
    from_transformers = models.as_config(LlamaConfig(**{k: v for k, v in hf.items()
                                                        if not k.startswith("_")}))
    assert from_transformers.num_params == models.get("llama-3-8b").num_params
    with pytest.raises(ValueError, match="model must be a name"):
        models.as_config(3.5)


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "qwen3-0.6b", "llama-3.2-1b"])
def test_random_model_has_num_params(name):
    """Built on the meta device: the shapes without the memory."""
    model = LlamaForCausalLM.random(name, torch.bfloat16, "meta")
    assert sum(p.numel() for p in model.parameters()) == models.get(name).num_params
    assert model.lm_head.weight.dtype == torch.bfloat16


def test_random_model_runs_a_small_shape():
    config = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    model = LlamaForCausalLM.random(config)
    assert model.config is config
    assert all(torch.isfinite(p).all() for p in model.parameters())
