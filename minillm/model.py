"""A Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM, TinyLlama) over a paged KV cache.

Module and parameter names mirror Hugging Face's, so a checkpoint's state dict loads as it is.
Shapes: T tokens in the step (all requests flattened), E hidden size, H query heads, K KV heads,
D head dim, F MLP width, V vocabulary.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from minillm.attention.torch_ref import TorchAttention
from minillm.batch import AttentionMetadata
from minillm.calc.models import ModelLike, as_config
from minillm.layers.merged_weights import keep_checkpoint_names, stack_parts
from minillm.model_config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.fused = False  # one Triton kernel instead of this code (LlamaForCausalLM.fuse)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """RMSNorm of x + residual: (normalised, x + residual), (T, E) each. The sum is the
        residual stream, which the next block adds its output to; with no residual, x is."""
        if self.fused:
            from minillm.layers import fused_ops
            return fused_ops.add_rms_norm(x, residual, self.weight, self.eps)
        if residual is not None:
            x = x + residual
        # Normalise in fp32 and scale after casting back, as the reference implementation does.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype), x


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
    """RoPE's cos and sin for every position the model takes, computed once, in fp32, on the
    CPU (so every device reads the same table), as a (max_position_embeddings, D) table of
    cos halves then sin halves: a step gathers its positions' rows instead of recomputing."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)
        self.register_buffer("cos_sin", self.table(config.max_position_embeddings),
                             persistent=False)  # (S, D)

    def table(self, num_positions: int) -> torch.Tensor:
        positions = torch.arange(num_positions, dtype=torch.float, device="cpu")
        angles = positions[:, None] * self.inv_freq.cpu()[None, :]  # (S, D/2)
        return torch.cat((angles.cos(), angles.sin()), dim=-1)

    def cover(self, num_positions: int) -> None:
        """Grow the table to num_positions rows (an engine's max_model_len past the checkpoint's
        max_position_embeddings: RoPE extrapolates, as it did before the table existed)."""
        if num_positions > self.cos_sin.shape[0]:
            self.cos_sin = self.table(num_positions).to(self.cos_sin.device)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Each token's cos and sin halves, once per step: positions (T,) -> (T, D) in dtype."""
        return self.cos_sin.index_select(0, positions).to(dtype)


def apply_rotary(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate (T, heads, D) by rope (T, D), pairing dimension i with i + D/2 (Hugging Face's
    layout): (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), in x's dtype as transformers does."""
    cos, sin = rope[:, None, :].chunk(2, dim=-1)  # (T, 1, D/2) each
    x1, x2 = x.chunk(2, dim=-1)  # (T, heads, D/2) each
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)  # (T, heads, D)


def split_qkv_rotary(qkv: torch.Tensor, rope: torch.Tensor, num_heads: int, num_kv_heads: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv (T, (H + 2K) D) -> q (T, H, D) and k (T, K, D) rotated by rope (T, D), and v (T, K, D),
    all contiguous (the Triton attention kernels read them so)."""
    T, D = rope.shape
    q, k, v = qkv.view(T, num_heads + 2 * num_kv_heads, D).split(
        [num_heads, num_kv_heads, num_kv_heads], dim=1)  # (T, H + 2K, D) -> H, K, K heads
    return apply_rotary(q, rope), apply_rotary(k, rope), v.contiguous()


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        E, self.H, self.K, self.D = (config.hidden_size, config.num_attention_heads,
                                     config.num_key_value_heads, config.head_dim)
        self.qkv_proj = nn.Linear(E, (self.H + 2 * self.K) * self.D, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.H * self.D, E, bias=config.o_bias)
        keep_checkpoint_names(self, {"qkv_proj": {"q_proj": self.H * self.D,
                                                  "k_proj": self.K * self.D,
                                                  "v_proj": self.K * self.D}})
        self.fused = False  # split and rotate in one Triton kernel (LlamaForCausalLM.fuse)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, backend: TorchAttention,
                kv_scales: torch.Tensor | None = None) -> torch.Tensor:
        """x (T, E), rope (T, D) from Rotary -> (T, E). kv_scales (2, K): this layer's, for an
        int8 or fp8 cache (minillm.quant.kv); None when the cache is in x's dtype."""
        T = x.shape[0]
        qkv = self.qkv_proj(x)  # (T, E) -> (T, (H + 2K) D)
        if self.fused:
            from minillm.layers import fused_ops
            q, k, v = fused_ops.qkv_rotary(qkv, rope, self.H, self.K)
        else:
            q, k, v = split_qkv_rotary(qkv, rope, self.H, self.K)
        if kv_scales is None:  # the call every backend takes
            out = backend.forward(q, k, v, kv_cache, meta)  # (T, H, D)
        else:
            out = backend.forward(q, k, v, kv_cache, meta, kv_scales)
        return self.o_proj(out.reshape(T, self.H * self.D))  # (T, H*D) -> (T, E)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        E, Fw = config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Linear(E, 2 * Fw, bias=False)
        self.down_proj = nn.Linear(Fw, E, bias=False)
        keep_checkpoint_names(self, {"gate_up_proj": {"gate_proj": Fw, "up_proj": Fw}})
        self.fused = False  # silu and multiply in one Triton kernel (LlamaForCausalLM.fuse)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # (T, E) -> (T, 2F)
        if self.fused:
            from minillm.layers import fused_ops
            return self.down_proj(fused_ops.silu_and_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)  # (T, F) each
        return self.down_proj(F.silu(gate) * up)  # SwiGLU: (T, F) -> (T, E)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rope: torch.Tensor,
                kv_cache: torch.Tensor, meta: AttentionMetadata, backend: TorchAttention,
                kv_scales: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The previous block's output x and the residual stream before it (None for the first
        layer) -> this layer's MLP output and the stream before it, (T, E) each. Each norm adds
        the pending output to the stream as it normalises (one fused kernel), so the stream is
        x + attention + MLP exactly as written the usual way."""
        h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(h, rope, kv_cache, meta, backend, kv_scales)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


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
                meta: AttentionMetadata, backend: TorchAttention,
                kv_scales: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, positions (T,); kv_cache (L, 2, N, P, K, D) -> hidden states (T, E).
        kv_scales (L, 2, K) fp32 go with an int8 or fp8 pool (minillm.quant.kv); None (a pool
        in the model's dtype) calls every layer and backend exactly as without them."""
        x = self.model.embed_tokens(input_ids)  # (T, E)
        rope = self.model.rotary(positions, x.dtype)  # (T, D)
        residual = None
        for i, (layer, layer_cache) in enumerate(zip(self.model.layers, kv_cache)):
            layer_scales = None if kv_scales is None else kv_scales[i]  # (2, K)
            x, residual = layer(x, residual, rope, layer_cache, meta, backend, layer_scales)
        return self.model.norm(x, residual)[0]

    def fuse(self, enabled: bool = True) -> LlamaForCausalLM:
        """Run the norms, rotary and SwiGLU with minillm.fused_ops' Triton kernels (enabled) or
        the PyTorch code here (the reference). Loading fuses on CUDA; on the CPU the kernels
        run only under Triton's interpreter (TRITON_INTERPRET=1), for tests. Returns self."""
        device = self.lm_head.weight.device
        if enabled and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(f"the fused Triton ops run on CUDA, or on the CPU under Triton's "
                               f"interpreter (TRITON_INTERPRET=1 before triton is imported); "
                               f"this model is on {device}: keep fuse(False) there")
        for module in self.modules():
            if isinstance(module, (RMSNorm, Attention, MLP)):
                module.fused = enabled
        return self

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()  # (S, E) -> (S, V)

    @classmethod
    def random(cls, config: ModelLike, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu", seed: int = 0) -> LlamaForCausalLM:
        """Random weights of the given shape (a ModelConfig, or a name in minillm.models), for
        speed and memory experiments. Memory: num_params * dtype bytes on `device` (llama-3-8b
        in bfloat16: 16 GB), so the large shapes are for a GPU or the meta device. A Qwen3
        shape runs without its q/k norms: its speed and memory are the model's (the norms are
        0.001% of the weights and FLOPs); its numerics are random anyway."""
        config = as_config(config)
        torch.manual_seed(seed)
        with torch.device(device), skip_weight_init():
            model = cls(config)
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                continue
            nn.init.normal_(p, std=0.02)
        model = model.to(dtype).eval()
        # .to(dtype) also rounded the RoPE table; angles must stay fp32, as on loading.
        model.model.rotary = Rotary(config).to(device)
        return model.fuse(torch.device(device).type == "cuda")

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
        for name, module in model.named_modules():  # as loading would, but freeing each part
            if hasattr(module, "checkpoint_parts"):
                stack_parts(module, state, f"{name}.")
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
        if missing or unexpected:
            raise ValueError(f"checkpoint {str(path)!r} does not fit the model: missing "
                             f"{missing[:5]}, unexpected {unexpected[:5]}")
        if config.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        model.model.rotary = Rotary(config).to(device)
        return model.eval().fuse(torch.device(device).type == "cuda")
