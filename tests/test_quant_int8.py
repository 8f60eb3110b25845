"""Weight-only int8 (minillm.quant.int8) and its Triton kernel (minillm.quant.int8_kernel).

The quantizer's error is bounded by construction (half a step of each row), so the tests assert
that bound rather than a tolerance; the kernel must match Int8Linear's dequantize-then-matmul
path, under Triton's interpreter without CUDA (switched on before triton is first imported, as
in test_kernels.py); the whole model's logits and greedy picks are measured against the
unquantized shipped model. Shapes: M token rows, K input features, N output channels.
"""


# Without CUDA the kernels run under Triton's interpreter: conftest.py switches it on.
import pytest
import torch
import torch.nn.functional as F
from aot_support import compile_in_subprocess
from support import paged_logits  # teacher-forced logits at every position

from minillm import LLM, ModelConfig, SamplingParams
from minillm.config import EngineConfig
from minillm.quant import int8_kernel
from minillm.quant.int8 import (
    Int8Linear,
    dequantize,
    projection_weight_bytes,
    quantize_model,
    quantize_per_channel,
)
from minillm.serve.datasets import shakespeare_passages

pytestmark = pytest.mark.ch10

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
# The kernel against the fp32 reference rounded to the dtype: fp32 differs only in where the
# scale multiplies (after the sum, not into each weight); fp16/bf16 by one rounding of the
# output (the interpreter truncates to bf16 rather than rounding to nearest: one full step).
KERNEL_TOL = {FP32: dict(atol=1e-5, rtol=1e-5), FP16: dict(atol=1e-3, rtol=2**-10),
              BF16: dict(atol=1e-2, rtol=2**-7)}
# The shipped model in fp32, int8 weights against fp32 weights, teacher-forced over 16 prompts
# of 24 tokens plus 24 greedy tokens each (logits of std ~3, up to ~19 in size): measured
# worst 0.10 at one position and 0.0084 on average, and 764 of 768 argmaxes the same (99.5%).
INT8_LOGITS_ATOL, INT8_LOGITS_MEAN_ERROR, INT8_MIN_AGREEMENT = 0.25, 0.02, 0.95
TINY = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   max_position_embeddings=64, qkv_bias=True)


def randn(*shape: int, seed: int, dtype: torch.dtype = FP32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(DEVICE, dtype)


def channel_weights(N: int, K: int, seed: int) -> torch.Tensor:
    """(N, K) weights whose rows differ in size by 1000x, as real channels do (outliers)."""
    return randn(N, K, seed=seed) * torch.logspace(-3, 0, N, device=DEVICE)[:, None]


# ---- the quantizer -----------------------------------------------------------------------------


def test_round_trip_stays_within_half_a_step_of_each_row() -> None:
    w = channel_weights(48, 80, seed=0)
    w[5] = 0.0  # an all-zero channel must not divide by zero
    q, scale = quantize_per_channel(w)
    assert q.dtype == torch.int8 and q.shape == w.shape and scale.shape == (48,)
    assert q.abs().max() <= 127 and (q == -128).sum() == 0  # symmetric: -128 unused
    assert (q.abs().amax(1)[w.abs().amax(1) > 0] == 127).all()  # each row uses its full range
    err = (dequantize(q, scale, FP32) - w).abs()  # (N, K)
    assert (err <= scale[:, None] / 2 * (1 + 1e-6)).all()
    assert err[5].max() == 0
    # Per-row scales follow each row: the small rows keep small errors (a per-tensor scale
    # would give every row the largest row's step).
    assert err[0].max() < 1e-3 * err[-1].max() * 10


def test_int8_linear_stays_within_the_quantization_error_bound() -> None:
    """|y - y_exact| <= sum_k |x_k| * scale_n / 2 for each output: each weight is off by at
    most half its row's step. Bias is kept exactly."""
    linear = torch.nn.Linear(80, 48, bias=True).to(DEVICE)
    with torch.no_grad():
        linear.weight.copy_(channel_weights(48, 80, seed=1))
    qlinear = Int8Linear.from_linear(linear)
    x = randn(2, 3, 80, seed=2)  # any leading dims, as nn.Linear takes
    with torch.no_grad():
        exact, got = linear(x), qlinear(x)
    assert got.shape == exact.shape == (2, 3, 48) and got.dtype == FP32
    bound = x.abs().sum(-1, keepdim=True) * qlinear.scale / 2  # (2, 3, 1) * (N,) -> (2, 3, N)
    assert ((got - exact).abs() <= bound + 1e-5).all()
    assert torch.equal(qlinear.bias, linear.bias)
    assert qlinear.weight_bytes() == 48 * 80 + 48 * 4  # int8 values + fp32 scales


# ---- the kernel --------------------------------------------------------------------------------


@pytest.mark.kernels
@pytest.mark.parametrize("M", [1, 3, 17])  # one decode row, a small batch, past one GEMV tile
@pytest.mark.parametrize("K, N", [(32, 48), (64, 40), (48, 80)])  # 40: a ragged last N tile
@pytest.mark.parametrize("dtype", [FP32, FP16, BF16])
def test_kernel_matches_the_dequantize_then_matmul_reference(M: int, K: int, N: int,
                                                            dtype: torch.dtype) -> None:
    q, scale = quantize_per_channel(randn(N, K, seed=M + K))
    x, bias = randn(M, K, seed=N, dtype=dtype), randn(N, seed=7, dtype=dtype)
    ref = F.linear(x.float(), dequantize(q, scale, FP32), bias.float())  # (M, N), fp32
    for b in (bias, None):
        got = int8_kernel.int8_matmul(x, q, scale, b)
        assert got.dtype == dtype and got.shape == (M, N)
        want = ref if b is not None else ref - bias.float()
        torch.testing.assert_close(got.float(), want.to(dtype).float(), **KERNEL_TOL[dtype])


@pytest.mark.kernels
def test_kernel_launcher_rejects_bad_inputs_with_clear_errors() -> None:
    q, scale = quantize_per_channel(randn(16, 32, seed=0))
    x = randn(4, 32, seed=1)
    with pytest.raises(ValueError, match=r"x must be a contiguous \(M, K\)"):
        int8_kernel.int8_matmul(x.t().contiguous().t(), q, scale)
    with pytest.raises(ValueError, match=r"qweight must be contiguous \(N, 32\) int8"):
        int8_kernel.int8_matmul(x, q.float(), scale)
    with pytest.raises(ValueError, match=r"scale must be contiguous \(16,\) fp32"):
        int8_kernel.int8_matmul(x, q, scale.half())
    with pytest.raises(ValueError, match=r"bias must be \(16,\) torch.float32"):
        int8_kernel.int8_matmul(x, q, scale, randn(16, seed=2, dtype=FP16))
    assert int8_kernel.int8_matmul(x[:0], q, scale).shape == (0, 16)


def compile_int8_kernel(arch: int, dtype_name: str) -> None:
    """Compile the int8 kernel to PTX for sm_<arch> with the constexprs and warps its launcher
    passes for decode (GEMV tiles) and prefill (GEMM tiles), with and without bias.
    Self-contained: run in a fresh process, where TRITON_INTERPRET is off, so the kernel is a
    JIT function."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    from minillm.device import dot_precision
    from minillm.quant import int8_kernel as kernels

    dtype = getattr(torch, {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}[dtype_name])
    pointers = {"w_ptr": "*i8", "scale_ptr": "*fp32"}
    kernel = kernels.int8_matmul_kernel
    for M in (1, 512):
        tiles = kernels.tiles_for_rows(M)
        for has_bias in (False, True):
            constexprs = dict(HAS_BIAS=has_bias, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
                              BLOCK_K=tiles.block_k, UPCAST=False,
                              DOT_PRECISION=dot_precision(dtype))
            signature = {name: "constexpr" if name in constexprs else
                         pointers.get(name, f"*{dtype_name}") if name.endswith("_ptr") else
                         "i32" for name in kernel.arg_names}
            source = triton.compiler.ASTSource(fn=kernel, signature=signature,
                                               constexprs=constexprs)
            compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                                      options={"num_warps": tiles.num_warps})
            assert f".entry {kernel.__name__}(" in compiled.asm["ptx"], (M, has_bias)


@pytest.mark.kernels
@pytest.mark.parametrize("arch, dtype_name", [(75, "fp16"), (80, "bf16"), (90, "bf16"),
                                              (90, "fp32")])  # sm_75 (T4): no bf16
def test_int8_kernel_compiles_ahead_of_time(arch: int, dtype_name: str) -> None:
    # No GPU needed: triton compiles for a named target, as tests/test_kernels.py does.
    compile_in_subprocess(compile_int8_kernel, arch, dtype_name)


# ---- the engine --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shipped_pair() -> tuple[LLM, LLM]:
    """The shipped model in fp32 on the CPU, unquantized and with int8 weights."""
    args = dict(device="cpu", num_kv_blocks=64, max_num_seqs=16)
    return LLM(**args), LLM(quantization="int8", **args)


def test_int8_shipped_model_keeps_logits_and_greedy_picks(shipped_pair: tuple[LLM, LLM]) -> None:
    """Teacher-forced: 16 passages' first 24 tokens plus the fp32 model's 24 greedy tokens run
    through both models; the argmax at every position is compared (token by token, so one early
    difference does not count against every later token)."""
    ref, quant = shipped_pair
    prompts = [ref.tokenizer.encode(text)[:24] for text in shakespeare_passages()[:16]]
    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    seqs = [p + out.token_ids for p, out in zip(prompts, ref.generate(prompts, greedy,
                                                                       use_tqdm=False))]
    want, got = paged_logits(ref.model, seqs, 16), paged_logits(quant.model, seqs, 16)
    errors = torch.cat([(g - w).abs().flatten() for g, w in zip(got, want, strict=True)])
    assert errors.max() < INT8_LOGITS_ATOL and errors.mean() < INT8_LOGITS_MEAN_ERROR
    same = sum((g.argmax(-1) == w.argmax(-1)).sum().item() for g, w in zip(got, want))
    assert same / sum(len(s) for s in seqs) >= INT8_MIN_AGREEMENT
    assert errors.max() > 0  # the weights did change: this is not the fp32 model twice


def test_int8_quantizes_the_projections_only(shipped_pair: tuple[LLM, LLM]) -> None:
    ref, quant = shipped_pair
    layer = quant.model.model.layers[0]
    for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                   layer.mlp.down_proj):
        assert isinstance(linear, Int8Linear) and linear.qweight.dtype == torch.int8
    # lm_head stays the (tied) fp32 embedding.
    assert quant.model.lm_head.weight.dtype == FP32
    assert quant.model.lm_head.weight is quant.model.model.embed_tokens.weight
    # 4 bytes -> 1 byte per weight, plus a 4-byte scale per output channel (K of 256 or 640).
    ratio = projection_weight_bytes(ref.model) / projection_weight_bytes(quant.model)
    assert 3.9 < ratio < 4.0, ratio


def test_int8_random_weights_path_and_bias() -> None:
    llm = LLM(TINY, device="cpu", num_kv_blocks=8, max_num_seqs=2, quantization="int8")
    qkv = llm.model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, Int8Linear) and qkv.bias is not None and qkv.bias.dtype == FP32
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True),
                       use_tqdm=False)[0]
    assert len(out.token_ids) == 4
    with pytest.raises(ValueError, match="no nn.Linear .* quantized already"):
        quantize_model(llm.model)


def test_unknown_quantization_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="quantization must be None or 'int8'.*'int4'"):
        LLM(TINY, device="cpu", quantization="int4")
    with pytest.raises(ValueError, match="'fp8'"):
        EngineConfig(quantization="fp8")
    assert EngineConfig().quantization is None
