"""Attention backends: "torch" (the readable reference, any device) and "triton" (GPU kernels).

Both take the same inputs: the step's q, k, v, one layer's paged cache and AttentionMetadata.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minillm.attention.torch_ref import TorchAttention
from minillm.device import capabilities

if TYPE_CHECKING:
    from minillm.attention.triton_backend import TritonAttention


def get_backend(name: str, device: torch.device) -> TorchAttention | TritonAttention:
    """The backend for a name. "auto" is Triton on CUDA and the reference elsewhere."""
    if name == "auto":
        name = capabilities(device).attention_backend
    if name == "torch":
        return TorchAttention()
    if name == "triton":
        # Imported here: importing triton fixes, once, whether its kernels are compiled or
        # interpreted (TRITON_INTERPRET), and the torch backend must not need triton at all.
        from minillm.attention.triton_backend import TritonAttention, triton_available

        triton_available(device)
        return TritonAttention()
    raise ValueError(f"unknown attention backend {name!r}; use 'auto', 'torch' or 'triton'")
