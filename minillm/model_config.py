"""The shape of a Llama-family model, read from a Hugging Face config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class ModelConfig:
    """Decoder shape and numerics. Field names are Hugging Face's, so configs map one to one."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 always; Llama when attention_bias
    o_bias: bool = False  # Llama when attention_bias
    hidden_act: str = "silu"
    model_type: str = "llama"
    sliding_window: int | None = None
    eos_token_id: int | list[int] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported; only 'silu' is")

    @property
    def num_params(self) -> int:
        """Parameters computed from the shape (embeddings counted once when tied)."""
        E, H, K, D, F = (self.hidden_size, self.num_attention_heads, self.num_key_value_heads,
                         self.head_dim, self.intermediate_size)
        attn = E * H * D * 2 + E * K * D * 2 + (H + 2 * K) * D * self.qkv_bias + E * self.o_bias
        layer = attn + 3 * E * F + 2 * E
        embed = self.vocab_size * E * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + embed + E

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        """From a config.json dict (transformers 4.x and 5.x spellings)."""
        model_type = hf.get("model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {model_type!r} is not supported; minillm loads {SUPPORTED_MODEL_TYPES}"
            )
        heads = hf["num_attention_heads"]
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        rope_theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        bias = bool(hf.get("attention_bias", False))
        use_window = hf.get("use_sliding_window", model_type == "mistral")
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=None if rope_type == "default" else rope,
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            qkv_bias=model_type == "qwen2" or bias,
            o_bias=model_type != "qwen2" and bias,
            hidden_act=hf.get("hidden_act", "silu"),
            model_type=model_type,
            sliding_window=hf.get("sliding_window") if use_window else None,
            eos_token_id=hf.get("eos_token_id"),
        )

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        config_file = Path(path) / "config.json"
        if not config_file.is_file():
            raise OSError(
                f"no model at {str(path)!r}: expected a Hugging Face checkpoint folder with "
                "config.json and *.safetensors (minillm never downloads weights)"
            )
        return cls.from_hf(json.loads(config_file.read_text()))
