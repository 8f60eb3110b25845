"""How a model's projection weights sit in memory for the CPU's matmul.

transpose_weights stores each Linear's weight (out, in) as its transpose's rows: the same
values and shape, so F.linear computes the same x @ W^T, but reads W^T from contiguous memory.
For float32 on an x86 CPU, torch's matmul (MKL) is faster so: a decode step's projections 2x at
one sequence and 10% at 64, on a 2-core AMD EPYC (Zen 2). bfloat16 and float16 are 4x slower
so: they keep the checkpoint's layout (ModelRunner decides), as GPUs do.
"""

from __future__ import annotations

from torch import nn


def transpose_weights(model: nn.Module, tied: nn.Parameter | None = None) -> None:
    """Every nn.Linear's weight in model, column-major; tied (the embedding a tied lm_head
    shares, read by rows) stays as it is."""
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.weight is not tied:
            column_major = module.weight.detach().t().contiguous().t()  # (out, in) view
            module.weight = nn.Parameter(column_major, requires_grad=False)
