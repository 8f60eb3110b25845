"""The decoder's building blocks beyond plain torch (nano-vllm keeps the same in layers/).

    merged_weights.py  merged qkv / gate_up Linears that keep the checkpoint's names
    fused_ops.py       Triton kernels for the decoder's small ops (add+RMSNorm, q/k rotary,
                       silu-and-mul), used on CUDA; model.py holds their PyTorch references
    weight_layout.py   float32 projection weights stored transposed, for MKL on x86 CPUs

A namespace: this file imports neither (fused_ops imports triton).
"""
