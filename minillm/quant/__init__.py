"""Quantization: fewer bytes per weight or per cached K/V, so a bandwidth-bound decode step
reads less.

int8: weight-only int8 with per-output-channel scales (LLM(quantization="int8")); its Triton
GEMM/GEMV is in int8_kernel, imported only on CUDA (or by tests) since it imports triton.
kv: the KV cache in int8 or fp8 e4m3 with static per-head scales (LLM(kv_cache_dtype="int8" or
"fp8")), quantized on write and dequantized inside attention.
schemes: the weight schemes as the cost model prices them (bf16, int8 W8A16, and the modelled
int4 W4A16 and FP8 W8A8), for the calculators and the recipe.
"""

from minillm.quant.int8 import (
    Int8Linear,
    dequantize,
    projection_weight_bytes,
    quantize_model,
    quantize_per_channel,
)
from minillm.quant.kv import (
    calibrate_kv_scales,
    dequantize_kv,
    kv_pool_block_bytes,
    kv_storage_dtype,
    quantize_kv,
)
from minillm.quant.schemes import SCHEMES, QuantScheme, get_scheme

__all__ = ["SCHEMES", "Int8Linear", "QuantScheme", "calibrate_kv_scales", "dequantize",
           "dequantize_kv", "get_scheme", "kv_pool_block_bytes", "kv_storage_dtype",
           "projection_weight_bytes", "quantize_kv", "quantize_model", "quantize_per_channel"]
