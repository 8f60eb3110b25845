"""A Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM, TinyLlama) over a paged KV cache.

Module and parameter names mirror Hugging Face's, so a checkpoint's state dict loads as it is.
Shapes: T tokens in the step (all requests flattened), E hidden size, H query heads, K KV heads,
D head dim, F MLP width, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from minillm.attention.torch_ref import TorchAttention
from minillm.batch import AttentionMetadata
from minillm.model_config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 and scale after casting back, as the reference implementation does.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """RoPE's per-pair frequencies (D/2,), with Llama 3's long-context rescaling when configured."""
    D = config.head_dim
    # Computed on the CPU whatever the default device: fp32, once, then moved by the caller.
    exponents = torch.arange(0, D, 2, dtype=torch.float, device="cpu") / D
    inv_freq = 1.0 / config.rope_theta ** exponents
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.get("rope_type", scaling.get("type")) != "llama3":
        raise ValueError(f"rope scaling {scaling!r} is not supported; only 'llama3' is")
    # Llama 3: long wavelengths are slowed by `factor`, short ones kept, the middle interpolated.
    factor, old_len = scaling["factor"], scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    smooth = ((old_len / wavelen - low) / (high - low)).clamp(0, 1)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


class Rotary(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of each token's rotation angles, once per step: (T, 1, D) each."""
        freqs = positions[:, None].float() * self.inv_freq[None, :]  # (T, D/2)
        angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # (T, 1, D)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (T, heads, D) pairwise, pairing dimension i with i + D/2 (Hugging Face's layout)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        E, self.H, self.K, self.D = (config.hidden_size, config.num_attention_heads,
                                     config.num_key_value_heads, config.head_dim)
        self.q_proj = nn.Linear(E, self.H * self.D, bias=config.qkv_bias)
        self.k_proj = nn.Linear(E, self.K * self.D, bias=config.qkv_bias)
        self.v_proj = nn.Linear(E, self.K * self.D, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.H * self.D, E, bias=config.o_bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: torch.Tensor, meta: AttentionMetadata, backend: TorchAttention
                ) -> torch.Tensor:
        T = x.shape[0]
        q = self.q_proj(x).view(T, self.H, self.D)  # (T, E) -> (T, H, D)
        k = self.k_proj(x).view(T, self.K, self.D)  # (T, E) -> (T, K, D)
        v = self.v_proj(x).view(T, self.K, self.D)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        out = backend.forward(q, k, v, kv_cache, meta)  # (T, H, D)
        return self.o_proj(out.reshape(T, self.H * self.D))  # (T, H*D) -> (T, E)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        E, Fw = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(E, Fw, bias=False)
        self.up_proj = nn.Linear(E, Fw, bias=False)
        self.down_proj = nn.Linear(Fw, E, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # SwiGLU


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: torch.Tensor, meta: AttentionMetadata, backend: TorchAttention
                ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, meta, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.rotary = Rotary(config)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


@contextmanager
def skip_weight_init() -> Iterator[None]:
    """Build Linear and Embedding layers without initialising them, for weights that are about
    to be replaced. (Random init on the meta device would also pull in torch's compiler stack,
    a one-off second or more, for values that are never used.)"""
    saved = nn.Linear.reset_parameters, nn.Embedding.reset_parameters
    nn.Linear.reset_parameters = nn.Embedding.reset_parameters = lambda self: None
    try:
        yield
    finally:
        nn.Linear.reset_parameters, nn.Embedding.reset_parameters = saved


class LlamaForCausalLM(nn.Module):
    """forward() runs the step's tokens through every layer, reading and writing the KV cache;
    compute_logits() projects only the rows that sample."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = Decoder(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, backend: TorchAttention) -> torch.Tensor:
        """input_ids, positions (T,); kv_cache (L, 2, N, P, K, D) -> hidden states (T, E)."""
        x = self.model.embed_tokens(input_ids)  # (T, E)
        rope = self.model.rotary(positions, x.dtype)
        for layer, layer_cache in zip(self.model.layers, kv_cache):
            x = layer(x, rope, layer_cache, meta, backend)
        return self.model.norm(x)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()  # (S, E) -> (S, V)

    @classmethod
    def random(cls, config: ModelConfig, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu", seed: int = 0) -> LlamaForCausalLM:
        """Random weights of the given shape, for speed and memory experiments."""
        torch.manual_seed(seed)
        with torch.device(device), skip_weight_init():
            model = cls(config)
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                continue
            nn.init.normal_(p, std=0.02)
        model = model.to(dtype).eval()
        # .to(dtype) also rounded the RoPE frequencies; angles must stay fp32, as on loading.
        model.model.rotary.inv_freq = rope_inv_freq(config).to(device)
        return model

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32,
                        device: torch.device | str = "cpu") -> LlamaForCausalLM:
        """Load a Hugging Face checkpoint folder (config.json + *.safetensors) from disk."""
        config = ModelConfig.from_pretrained(path)
        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise OSError(f"no *.safetensors weights in {str(path)!r}")
        with torch.device("meta"), skip_weight_init():
            model = cls(config)
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(f, device=str(device)))
        if config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        state = {k: v.to(dtype) for k, v in state.items() if "rotary_emb" not in k}
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
        if missing or unexpected:
            raise ValueError(f"checkpoint {str(path)!r} does not fit the model: missing "
                             f"{missing[:5]}, unexpected {unexpected[:5]}")
        if config.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        model.model.rotary.inv_freq = rope_inv_freq(config).to(device)
        return model.eval()
