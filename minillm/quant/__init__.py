"""Quantization: fewer bytes per weight or per cached K/V, so a bandwidth-bound decode step
reads less.

int8: weight-only int8 with per-output-channel scales (LLM(quantization="int8")); its Triton
GEMM/GEMV is in int8_kernel, imported only on CUDA (or by tests) since it imports triton.
kv: the KV cache in int8 or fp8 e4m3 with static per-head scales (LLM(kv_cache_dtype="int8" or
"fp8")), quantized on write and dequantized inside attention: the codec, beneath attention.
kv_pool: an engine's pool (allocate_kv_cache; quantized or not), and the one forward that
calibrates a quantized pool's scales.
schemes: the weight schemes as the cost model prices them (bf16, int8 W8A16, and the modelled
int4 W4A16 and FP8 W8A8), for the calculators and the recipe.

A namespace: import from the module that owns a name (each stands at its own layer, so this
file imports none of them).
"""
