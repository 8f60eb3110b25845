"""Attention backends: "torch" (the readable reference, any device) and "triton" (GPU kernels).

Both take the same inputs: the step's q, k, v, one layer's paged cache and AttentionMetadata.
"""

from __future__ import annotations

import torch

from minillm.attention.torch_ref import TorchAttention


def get_backend(name: str, device: torch.device) -> TorchAttention:
    """The backend for a name. "auto" is the reference until the Triton kernels land."""
    if name == "auto":
        name = "torch"
    if name == "torch":
        return TorchAttention()
    if name == "triton":
        raise NotImplementedError(
            "the triton attention backend is not built yet; use attention_backend='torch'"
        )
    raise ValueError(f"unknown attention backend {name!r}; use 'auto', 'torch' or 'triton'")
