"""Merged Linears under the checkpoint's names.

One GEMM instead of several: a layer that applies several of the checkpoint's Linears to one
input (q, k and v; gate and up) holds them as one merged Linear, their output rows stacked. Its
state dict keeps the checkpoint's separate names in both directions, so Hugging Face checkpoints
load unchanged and transformers can load what minillm saves.
"""

from __future__ import annotations

import torch
from torch import nn


def stack_parts(module: nn.Module, state: dict[str, torch.Tensor], prefix: str, *_: object
                ) -> None:
    """Replace, in state, the checkpoint's separate Linears under prefix (module's name) by the
    merged Linears module holds (module.checkpoint_parts), their rows stacked in order. In
    place: each part is freed as soon as it is stacked."""
    for merged, parts in module.checkpoint_parts.items():
        for kind in ("weight", "bias"):
            keys = [f"{prefix}{part}.{kind}" for part in parts]
            if all(key in state for key in keys):
                state[f"{prefix}{merged}.{kind}"] = torch.cat([state.pop(key) for key in keys])


def split_parts(module: nn.Module, state: dict[str, torch.Tensor], prefix: str, *_: object
                ) -> None:
    """The inverse of stack_parts, for state_dict(): the checkpoint's names, as row views."""
    for merged, parts in module.checkpoint_parts.items():
        for kind in ("weight", "bias"):
            stacked = state.pop(f"{prefix}{merged}.{kind}", None)
            if stacked is not None:
                for part, rows in zip(parts, stacked.split(list(parts.values())), strict=True):
                    state[f"{prefix}{part}.{kind}"] = rows


def keep_checkpoint_names(module: nn.Module, parts: dict[str, dict[str, int]]) -> None:
    """module computes several of the checkpoint's Linears that read one input as one merged
    Linear (one GEMM instead of several): parts maps each merged Linear's name to the
    checkpoint's Linears it stacks, in order, with their output rows. Its state dict keeps the
    checkpoint's names both ways, so checkpoints load unchanged and transformers can read it."""
    module.checkpoint_parts = parts
    module.register_load_state_dict_pre_hook(stack_parts)
    module.register_state_dict_post_hook(split_parts)
