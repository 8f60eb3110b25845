"""Quantization: fewer bytes per weight, so a bandwidth-bound decode step reads less.

int8: weight-only int8 with per-output-channel scales (LLM(quantization="int8")); its Triton
GEMM/GEMV is in int8_kernel, imported only on CUDA (or by tests) since it imports triton.
"""

from minillm.quant.int8 import (
    Int8Linear,
    dequantize,
    projection_weight_bytes,
    quantize_model,
    quantize_per_channel,
)

__all__ = ["Int8Linear", "dequantize", "projection_weight_bytes", "quantize_model",
           "quantize_per_channel"]
