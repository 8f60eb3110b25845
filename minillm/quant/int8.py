"""Weight-only int8 quantization with one symmetric scale per output channel.

Each row w of a Linear's weight (one output channel) is stored as int8 integers q and one fp32
scale s = max|w| / 127, so w ~= s * q with q = round(w / s) in [-127, 127]: the error of any
weight is at most s / 2, half a step of its own row. A scale per row, not per tensor, keeps one
large channel from coarsening every other channel's steps; symmetric (no zero point) because
trained weights are centred on zero, and -128 is left unused so that q and -q both fit.
Activations stay in the model's dtype (weight-only, W8A16 in the usual shorthand): the bytes a
decode step reads drop ~2x from bf16 and ~4x from fp32, and the arithmetic stays floating point.

On the CPU Int8Linear dequantizes and multiplies (the readable reference); on CUDA it calls the
Triton kernel in minillm.quant.int8_kernel, which reads the int8 bytes and scales in registers.
Shapes: M token rows, K input features, N output features (channels).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

QMAX = 127  # symmetric int8: [-127, 127]


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight (N, K) -> (q (N, K) int8, scale (N,) fp32) with weight ~= q * scale[:, None],
    each element within scale / 2 of its row's exact value. An all-zero row gets scale 1."""
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"weight must be a floating-point (N, K) matrix, got "
                         f"{tuple(weight.shape)} {weight.dtype}")
    w = weight.detach().float()
    absmax = w.abs().amax(dim=1)  # (N,)
    scale = torch.where(absmax > 0, absmax / QMAX, torch.ones_like(absmax))  # (N,)
    q = torch.round(w / scale[:, None]).clamp(-QMAX, QMAX).to(torch.int8)  # (N, K)
    return q, scale.contiguous()


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """q (N, K) int8 and scale (N,) -> the weights (N, K) in dtype (computed in fp32)."""
    return (q.float() * scale[:, None]).to(dtype)  # (N, K) * (N, 1) -> (N, K)


class Int8Linear(nn.Module):
    """nn.Linear's forward over int8 weights: qweight (N, K) int8 and scale (N,) fp32 buffers,
    bias (N,) kept in the model's dtype (N values: nothing to save). x (..., K) -> (..., N)."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 dtype: torch.dtype):
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.dtype = dtype  # the activations' dtype, which the output keeps
        self.register_buffer("qweight", qweight.contiguous())
        self.register_buffer("scale", scale.float().contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        """Quantize linear's weight per output channel; the bias is kept as it is."""
        q, scale = quantize_per_channel(linear.weight)
        return cls(q, scale, linear.bias, linear.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cuda":
            from minillm.quant import int8_kernel  # imports triton: only on CUDA
            out = int8_kernel.int8_matmul(x.reshape(-1, self.in_features).contiguous(),
                                          self.qweight, self.scale, self.bias)
            return out.view(*x.shape[:-1], self.out_features)  # (M, N) -> (..., N)
        # The reference: rebuild the weights in x's dtype, then an ordinary Linear.
        return F.linear(x, dequantize(self.qweight, self.scale, x.dtype), self.bias)

    def weight_bytes(self) -> int:
        """Bytes of the weights as stored: the int8 values plus the fp32 scales."""
        return self.qweight.numel() * self.qweight.element_size() \
            + self.scale.numel() * self.scale.element_size()

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, weights=int8 per-channel, dtype={self.dtype}")


def quantize_model(model: nn.Module) -> nn.Module:
    """Swap every Linear inside the decoder layers (model.model.layers: the merged qkv_proj and
    gate_up_proj, o_proj, down_proj) for an Int8Linear, in place; returns model.

    lm_head and the embeddings stay in the model's dtype. The embedding is a gather: a step
    reads T of its rows, not the table, so int8 would save memory but no step bandwidth. The
    lm_head is often tied to it (the shipped model's is), and it makes the logits themselves,
    where an error shifts the sampled distribution directly; vLLM's weight-only schemes keep it
    unquantized by default too. (The engine also reads the model dtype off lm_head.weight.)
    """
    layers = model.model.layers
    targets = [(parent, name, child) for parent in layers.modules()
               for name, child in parent.named_children() if isinstance(child, nn.Linear)]
    if not targets:
        raise ValueError("found no nn.Linear in model.model.layers to quantize: is the model "
                         "quantized already?")
    for parent, name, child in targets:
        setattr(parent, name, Int8Linear.from_linear(child))
    return model


def projection_weight_bytes(model: nn.Module) -> int:
    """Bytes of the decoder layers' projection weights as stored (int8 values plus scales for
    Int8Linear, weight elements for nn.Linear; biases excluded): what a decode step reads."""
    total = 0
    for module in model.model.layers.modules():
        if isinstance(module, Int8Linear):
            total += module.weight_bytes()
        elif isinstance(module, nn.Linear):
            total += module.weight.numel() * module.weight.element_size()
    return total
