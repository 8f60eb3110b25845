"""KV-cache quantization (minillm.quant.kv, kv_cache_dtype "int8" | "fp8"): the quantizer, the
torch reference and Triton kernels on a quantized pool, the engine, the pool's size, swap and
the kernels compiled ahead of time.

Without CUDA the Triton kernels run under Triton's interpreter, switched on before triton is
first imported (as in test_kernels.py). Shapes: T tokens, H query heads, K KV heads, D head dim,
N blocks of P slots.
"""


# Without CUDA the kernels run under Triton's interpreter: conftest.py switches it on.
import pytest
import torch
from aot_support import compile_every_kernel, compile_in_subprocess

from minillm import LLM, ModelConfig, SamplingParams
from minillm.attention.torch_ref import TorchAttention
from minillm.attention.torch_ref import decode_attention as reference_decode
from minillm.attention.triton_backend import TritonAttention
from minillm.attention.triton_decode import decode_attention
from minillm.attention.triton_write_kv import write_kv
from minillm.batch import AttentionMetadata, build_batch
from minillm.bench.quant import ppl_text, teacher_forced_logits
from minillm.config import EngineConfig
from minillm.cuda_graph import DecodeGraphRunner
from minillm.kv_cache import kv_cache_block_bytes
from minillm.llm import MemoryReport, num_kv_blocks_for_memory
from minillm.model import LlamaForCausalLM
from minillm.quality import perplexity
from minillm.quant.kv import (
    CALIBRATION_MARGIN,
    KV_QMAX,
    dequantize_kv,
    kv_storage_dtype,
    quantize_kv,
    scales_from_amax,
)
from minillm.quant.kv_pool import (
    allocate_kv_pool,
    calibrate_kv_scales,
    kv_pool_block_bytes,
)
from minillm.request import Request
from minillm.scheduler import ScheduledRequest
from minillm.serve.datasets import shakespeare_passages
from minillm.swap import KVSwapper

pytestmark = pytest.mark.ch10

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
INT8, FP8, FP32 = torch.int8, torch.float8_e4m3fn, torch.float32
NAMES = {INT8: "int8", FP8: "fp8"}
# Attention through a quantized pool against the fp32 pool, on K and V of std 1-2 with scales
# from their own amax (x1.25): int8's step is ~2% of amax and e4m3 keeps 3 mantissa bits
# (~6% relative), so outputs (averages of V, std ~1) move by at most a few hundredths (int8)
# or a tenth or two (fp8): measured 0.07 and 0.19 worst at T = 55.
ATTENTION_ATOL = {INT8: 0.15, FP8: 0.35}
TINY = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   max_position_embeddings=256)


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def own_scales(k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Scales (2, K) calibrated on k and v (T, K, D) themselves."""
    amax = torch.stack([k.abs().amax((0, 2)), v.abs().amax((0, 2))])  # (2, K)
    return scales_from_amax(amax[None], NAMES[dtype])[0]


# ---- the quantizer -----------------------------------------------------------------------------


def test_int8_round_trip_is_within_half_a_step_and_saturates() -> None:
    x = randn(40, 2, 16, seed=0) * torch.tensor([1.0, 10.0], device=DEVICE)[None, :, None]
    scale = x.abs().amax((0, 2)) * CALIBRATION_MARGIN / 127  # (K,)
    q = quantize_kv(x, scale, INT8)
    assert q.dtype == INT8 and q.shape == x.shape and q.abs().max() <= 127
    err = (dequantize_kv(q, scale, FP32) - x).abs()  # (T, K, D)
    assert (err <= scale[None, :, None] / 2 * (1 + 1e-6)).all()
    big = torch.full_like(x, 1e6)  # far past the calibrated range: clamps, never wraps
    assert (quantize_kv(big, scale, INT8) == 127).all()
    assert (quantize_kv(-big, scale, INT8) == -127).all()


def test_fp8_round_trip_keeps_three_mantissa_bits_and_saturates() -> None:
    x = randn(40, 2, 16, seed=1) * 3
    scale = x.abs().amax((0, 2)) * CALIBRATION_MARGIN / 448
    back = dequantize_kv(quantize_kv(x, scale, FP8), scale, FP32)
    normal = (x / scale[None, :, None]).abs() >= 2**-6  # below: e4m3's subnormals, fixed step
    rel = ((back - x).abs() / x.abs())[normal]
    assert rel.max() <= 2**-4 * (1 + 1e-6)  # half of 2^-3, the spacing of 3 mantissa bits
    saturated = quantize_kv(torch.full_like(x, 1e9), scale, FP8).float()
    assert (saturated == 448).all() and not saturated.isnan().any()  # no inf in e4m3: 448


def test_scales_need_a_margin_of_at_least_one_and_never_divide_by_zero() -> None:
    amax = torch.tensor([[[2.0, 0.0], [2.0, 0.0]]])  # (L, 2, K): KV head 1 was all zeros
    scale = scales_from_amax(amax, "int8")
    assert scale[0, 0, 0] == pytest.approx(2.0 * CALIBRATION_MARGIN / KV_QMAX["int8"])
    assert scale[0, 0, 1] == 1.0  # a head that was all zeros
    with pytest.raises(ValueError, match="margin must be >= 1"):
        scales_from_amax(amax, "fp8", margin=0.5)
    with pytest.raises(ValueError, match="kv_cache_dtype must be .*'int4'"):
        kv_storage_dtype("int4", FP32)
    with pytest.raises(ValueError, match="kv_cache_dtype must be"):
        EngineConfig(kv_cache_dtype="fp16")  # type: ignore[arg-type]


def test_calibration_gives_positive_scales_per_layer_and_head() -> None:
    model = LlamaForCausalLM.random(TINY, FP32, DEVICE, seed=0)
    scales = calibrate_kv_scales(model, None, "int8", block_size=16)  # no tokenizer: cycled ids
    assert scales.shape == (2, 2, 2) and scales.dtype == FP32 and (scales > 0).all()
    # The same passage gives the same scales: calibration is deterministic.
    assert torch.equal(scales, calibrate_kv_scales(model, None, "int8", block_size=16))


# ---- attention through a quantized pool ----------------------------------------------------------


def mixed_step(P: int = 16) -> AttentionMetadata:
    """A chunk over a cached prefix, a whole prompt and two decodes, on disjoint blocks."""
    scheduled, next_block = [], 0
    for i, (cached, new) in enumerate([(20, 13), (0, 40), (37, 1), (5, 1)]):
        req = Request(f"r{i}", list(range(cached + new)), SamplingParams(), 0.0)
        n = -(-(cached + new) // P)
        req.block_table = list(range(next_block, next_block + n))
        next_block += n
        scheduled.append(ScheduledRequest(req, new, cached, "prefill"))
    return build_batch(scheduled, P, DEVICE).attn


def run_step(backend: object, dtype: torch.dtype, seed: int = 0
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One mixed step on a fresh (2, N, P, K, D) pool in dtype: (out, pool, fp32 out)."""
    meta = mixed_step()
    T, K, G, D = meta.slot_mapping.shape[0], 2, 3, 32
    q, k, v = randn(T, K * G, D, seed=seed), randn(T, K, D, seed=seed + 1) * 2, randn(
        T, K, D, seed=seed + 2)
    scales = own_scales(k, v, dtype) if dtype != FP32 else None
    pool = torch.zeros(2, 32, 16, K, D, dtype=dtype, device=DEVICE)
    out = backend.forward(q, k, v, pool, meta, scales)  # type: ignore[attr-defined]
    want = TorchAttention().forward(q, k, v, torch.zeros(2, 32, 16, K, D, device=DEVICE), meta)
    return out, pool, want


@pytest.mark.parametrize("dtype", [INT8, FP8], ids=["int8", "fp8"])
def test_reference_attention_on_a_quantized_pool_stays_near_fp32(dtype: torch.dtype) -> None:
    out, pool, want = run_step(TorchAttention(), dtype)
    assert pool.dtype == dtype
    error = (out - want).abs().max().item()
    assert 0 < error < ATTENTION_ATOL[dtype], error


@pytest.mark.parametrize("dtype", [INT8, FP8], ids=["int8", "fp8"])
def test_triton_kernels_match_the_reference_on_a_quantized_pool(dtype: torch.dtype) -> None:
    """Same quantized bytes written (write_kv), same outputs (extend kernel: the step has
    prompts; decode kernel with and without splits, on the same pool)."""
    got, got_pool, _ = run_step(TritonAttention(), dtype)
    want, want_pool, _ = run_step(TorchAttention(), dtype)
    assert torch.equal(got_pool.view(torch.uint8), want_pool.view(torch.uint8))
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    # The decode kernel alone, splitting each context into pieces of >= 16 positions.
    meta = mixed_step()
    q = randn(4, 6, 32, seed=9)
    k, v = randn(meta.slot_mapping.shape[0], 2, 32, seed=1) * 2, randn(
        meta.slot_mapping.shape[0], 2, 32, seed=2)
    scales = own_scales(k, v, dtype)
    for splits in (1, 3):
        out = decode_attention(q, want_pool, meta.block_tables, meta.seq_lens, splits, 16,
                               kv_scales=scales)
        ref = reference_decode(q, want_pool, meta.block_tables, meta.seq_lens, scales)
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


def test_a_quantized_pool_without_scales_and_scales_without_one_are_errors() -> None:
    meta = mixed_step()
    T = meta.slot_mapping.shape[0]
    q, k, v = randn(T, 4, 8, seed=0), randn(T, 2, 8, seed=1), randn(T, 2, 8, seed=2)
    int8_pool = torch.zeros(2, 32, 16, 2, 8, dtype=INT8, device=DEVICE)
    for backend in (TorchAttention(), TritonAttention()):
        with pytest.raises(ValueError, match="needs kv_scales"):
            backend.forward(q, k, v, int8_pool, meta)
        with pytest.raises(ValueError, match="scales go with an int8 or fp8 cache"):
            backend.forward(q, k, v, torch.zeros(2, 32, 16, 2, 8, device=DEVICE), meta,
                            torch.ones(2, 2, device=DEVICE))
        with pytest.raises(ValueError, match=r"kv_scales must be \(2, 2\) float32"):
            backend.forward(q, k, v, int8_pool, meta, torch.ones(2, 3, device=DEVICE))
    with pytest.raises(ValueError, match="needs kv_scales"):
        write_kv(k, v, int8_pool, meta.slot_mapping)


# ---- the engine ----------------------------------------------------------------------------------


def test_the_pool_holds_4x_the_blocks_of_fp32_and_2x_those_of_bf16_in_the_same_memory() -> None:
    # 0.5 GiB for the KV (a whole number of blocks of any size here); seats far beyond, so
    # memory alone sets the pool.
    report = MemoryReport(total=2**30, free=2**30, allocated=0, peak=0)
    config = dict(max_num_seqs=1024, max_model_len=2**16, gpu_memory_utilization=0.5)
    for model_dtype, ratio in ((FP32, 4), (torch.bfloat16, 2)):
        model = LlamaForCausalLM.random(TINY, model_dtype, "cpu", seed=0)
        auto = EngineConfig(**config)
        blocks = {kv: num_kv_blocks_for_memory(EngineConfig(**config, kv_cache_dtype=kv), model,
                                               2**16, report) for kv in ("auto", "int8", "fp8")}
        auto_bytes = kv_pool_block_bytes(model, auto)
        assert auto_bytes == kv_cache_block_bytes(2, 16, 2, 8, model_dtype.itemsize)
        for kv in ("int8", "fp8"):
            assert kv_pool_block_bytes(model, EngineConfig(kv_cache_dtype=kv)) * ratio \
                == auto_bytes
            assert blocks[kv] == ratio * blocks["auto"], (model_dtype, blocks)


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_engine_runs_a_quantized_pool_with_chunking_prefix_caching_and_swap(kv: str) -> None:
    """Chunked prefill (24-token budget), prefix caching (a shared system prompt) and swap
    preemption (a pool too small for all four) on an int8 / fp8 pool: every request finishes,
    the cache hits, swaps happen and no block leaks; greedy tokens mostly agree with fp32."""
    system = "Duke.\nWhat, is Antonio here?\n\nAnt.\nReady, so please your grace.\n"
    prompts = [system + "Duke.\nI am sorry", system + "Ant.\nI have heard", "O", system]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    tokens = {}
    for kv_cache_dtype in ("auto", kv):
        llm = LLM(num_kv_blocks=12, block_size=8, max_num_batched_tokens=24, max_num_seqs=4,
                  enable_prefix_caching=True, preemption_mode="swap", swap_space=0.01,
                  kv_cache_dtype=kv_cache_dtype, device="cpu", dtype="float32")
        llm.generate(prompts[:1], params, use_tqdm=False)  # fills the prefix cache
        outs = llm.generate(prompts, params, use_tqdm=False)
        tokens[kv_cache_dtype] = [o.token_ids for o in outs]
        stats = llm.stats()
        assert stats["prefix_cache_hits"] > 0
        assert stats["num_free_blocks"] == stats["num_blocks"]
        assert sum(r.swap_in_blocks for r in llm.engine.trace) > 0  # swapped out and back
        assert llm.engine.runner.kv_cache.dtype == kv_storage_dtype(kv_cache_dtype, FP32)
    assert all(len(t) == 12 for t in tokens[kv])
    first = [t[0] for t in tokens[kv]]
    assert first == [t[0] for t in tokens["auto"]]  # the first token reads the prompt only


@pytest.mark.parametrize("dtype", [INT8, FP8], ids=["int8", "fp8"])
def test_swap_moves_quantized_blocks_byte_for_byte(dtype: torch.dtype) -> None:
    pool = (randn(2, 2, 6, 4, 2, 8, seed=3) * 20).to(dtype)  # (L, 2, N, P, K, D)
    before = pool.clone()
    swapper = KVSwapper(pool, 3)
    assert swapper.host.dtype == dtype
    swapper.copy([(1, 0), (4, 2)], [])
    pool[:, :, 1].zero_()
    pool[:, :, 4].zero_()
    swapper.copy([], [(0, 4), (2, 1)])  # back, into each other's slot
    assert torch.equal(pool[:, :, 4].view(torch.uint8), before[:, :, 1].view(torch.uint8))
    assert torch.equal(pool[:, :, 1].view(torch.uint8), before[:, :, 4].view(torch.uint8))


def test_the_decode_graph_runner_passes_the_scales_down() -> None:
    """The runner's padded path (capture=False: no CUDA here) on an int8 pool gives the same
    hidden states as the model's own forward, which needs the scales to read the pool."""
    config = EngineConfig(block_size=4, max_num_seqs=4, num_kv_blocks=16, max_model_len=32,
                          kv_cache_dtype="int8", attention_backend="triton")
    model = LlamaForCausalLM.random(TINY, FP32, DEVICE, seed=0)
    pool, scales = allocate_kv_pool(model, None, config)
    runner = DecodeGraphRunner(model, pool, TritonAttention(), config, capture=False,
                               kv_scales=scales)
    req = Request("a", [1, 2, 3, 4, 5], SamplingParams(), 0.0)
    req.block_table = [3, 7]
    prefill = build_batch([ScheduledRequest(req, 4, 0, "prefill")], 4, DEVICE)
    model(prefill.input_ids, prefill.positions, pool, prefill.attn, TritonAttention(),
          kv_scales=scales)
    decode = build_batch([ScheduledRequest(req, 1, 4, "decode")], 4, DEVICE)
    got = runner.run(decode.input_ids, decode.positions, decode.attn).clone()
    want = model(decode.input_ids, decode.positions, pool, decode.attn, TritonAttention(),
                 kv_scales=scales)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="captures CUDA graphs")
@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_captured_decode_graphs_read_the_scales(kv: str) -> None:
    """On a GPU: the engine with decode graphs captured over an int8 / fp8 pool gives the same
    greedy tokens as without graphs (fp8 only where the GPU has e4m3: sm_89 and up)."""
    if kv == "fp8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 e4m3 needs sm_89+")
    prompts = ["Duke.\nWhat, is Antonio here?\n", "O", "Ant.\nI have heard"]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    tokens = []
    for graphs in (False, True):
        llm = LLM(device="cuda", dtype="bfloat16", num_kv_blocks=64, max_num_seqs=4,
                  kv_cache_dtype=kv, enable_cuda_graphs=graphs)
        assert (llm.engine.runner.graph_runner is not None) == graphs
        tokens.append([o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)])
    assert tokens[0] == tokens[1]


# ---- quality on the shipped model ----------------------------------------------------------------

# Teacher-forced over 16 passages' first 24 tokens plus fp32's 24 greedy tokens (768 positions,
# logits of std ~3), each setting against the fp32 pool: measured max / mean |logit error| and
# argmax agreement 0.23 / 0.015 / 99.1% (int8 KV), 0.55 / 0.037 / 97.4% (fp8 KV). Perplexity
# on the held-out play moved by -0.0024 (int8) and +0.0001 (fp8) nats over its first 2,048
# tokens, and by -0.0001 / +0.0000 over all 35,072 (4.1637 nats in fp32).
KV_QUALITY = {"int8": dict(max_error=0.5, mean_error=0.03, agreement=0.97),
              "fp8": dict(max_error=1.0, mean_error=0.06, agreement=0.95)}
PPL_DELTA_NATS = 0.01  # over the first 1,024 tokens of The Tempest


@pytest.fixture(scope="module")
def shipped() -> dict[str, LLM]:
    """The shipped model in fp32 on the CPU with an fp32, int8 and fp8 pool."""
    return {kv: LLM(device="cpu", num_kv_blocks=64, max_num_seqs=16, kv_cache_dtype=kv)
            for kv in ("auto", "int8", "fp8")}


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_kv_quantization_keeps_logits_greedy_picks_and_perplexity(shipped: dict[str, LLM],
                                                                   kv: str) -> None:
    ref, quant = shipped["auto"], shipped[kv]
    prompts = [ref.tokenizer.encode(text)[:24] for text in shakespeare_passages()[:16]]
    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    seqs = [p + out.token_ids for p, out in zip(prompts, ref.generate(prompts, greedy,
                                                                       use_tqdm=False))]
    want = torch.cat(teacher_forced_logits(ref, seqs))  # (T, V)
    got = torch.cat(teacher_forced_logits(quant, seqs))
    error, bound = (got - want).abs(), KV_QUALITY[kv]
    assert 0 < error.max() < bound["max_error"] and error.mean() < bound["mean_error"]
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= bound["agreement"]
    text = ppl_text(ref, 1024)
    delta = perplexity(quant, text).loss - perplexity(ref, text).loss
    assert abs(delta) < PPL_DELTA_NATS, delta


# ---- ahead of time ------------------------------------------------------------------------------


# int8 on every generation (sm_75 in fp16: the T4 has no bf16); fp8 e4m3 needs sm_89+, where
# Triton has the conversion (the launchers refuse it below with a clear error).
@pytest.mark.kernels
@pytest.mark.parametrize("arch, dtype_name, kv_dtype", [
    (75, "fp16", "int8"), (80, "bf16", "int8"), (90, "bf16", "int8"), (90, "bf16", "fp8")])
def test_quantized_kernels_compile_ahead_of_time(arch: int, dtype_name: str, kv_dtype: str
                                                 ) -> None:
    compile_in_subprocess(compile_every_kernel, arch, dtype_name, 128, kv_dtype)


@pytest.mark.kernels
def test_fp8_kernels_do_not_compile_before_sm_89() -> None:
    """Why the launchers refuse kv_cache_dtype='fp8' on an A100 or T4: Triton has no e4m3 there."""
    with pytest.raises(AssertionError, match="fp8e4nv not supported in this architecture"):
        compile_in_subprocess(compile_every_kernel, 80, "bf16", 128, "fp8")
