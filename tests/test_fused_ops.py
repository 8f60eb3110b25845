"""The fused Triton ops (minillm.fused_ops) against the PyTorch code in minillm.model, and the
merged qkv / gate_up weights against the checkpoint's separate ones.

Without CUDA the kernels run under Triton's interpreter, switched on before triton is first
imported (hence the environment line at the top, as in test_kernels.py). The interpreter
truncates fp32 -> bf16 instead of rounding to nearest, so bf16 allows one step of the format;
fp32 and fp16 agree but for the order of RMSNorm's sum. Shapes: T tokens, E hidden size, H query
heads, K KV heads, D head dim, F MLP width.
"""


# Without CUDA the kernels run under Triton's interpreter: conftest.py switches it on.
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from aot_support import compile_in_subprocess
from torch.utils._python_dispatch import TorchDispatchMode

from minillm.attention import get_backend
from minillm.config import EngineConfig
from minillm.cuda_graph import DecodeGraphRunner
from minillm.layers import fused_ops
from minillm.model import LlamaForCausalLM, Rotary, split_qkv_rotary
from minillm.model_config import ModelConfig

pytestmark = pytest.mark.kernels

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
TOLERANCES = {FP32: dict(atol=1e-6, rtol=1e-6), FP16: dict(atol=1e-3, rtol=1e-3),
              BF16: dict(atol=2e-2, rtol=2e-2)}
DTYPES = [FP32, FP16, BF16]
# Llama-3.2-1B's shape with narrow matrices: the kernels a step launches depend on the layers
# and the code path, not on the widths, so this counts what the real shape launches.
LLAMA_1B_LAYOUT = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                              num_hidden_layers=16, num_attention_heads=8, num_key_value_heads=2,
                              head_dim=16, max_position_embeddings=256, rope_theta=500000.0,
                              tie_word_embeddings=True)
SMALL = ModelConfig(vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                    num_attention_heads=6, num_key_value_heads=2, head_dim=24,
                    max_position_embeddings=300, qkv_bias=True, o_bias=True)


def randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(DEVICE, dtype)


# ---- each kernel against its reference ---------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_matches_the_reference(dtype: torch.dtype, with_residual: bool) -> None:
    T, E = 5, 200  # E not a power of two: the row's tail is masked
    x, weight = randn(T, E, dtype=dtype, seed=0), 1 + 0.2 * randn(E, dtype=dtype, seed=1)
    residual = randn(T, E, dtype=dtype, seed=2) if with_residual else None
    norm = SMALL_NORM(E, weight)
    want_out, want_sum = norm(x, residual)
    got_out, got_sum = fused_ops.add_rms_norm(x, residual, weight, norm.eps)
    torch.testing.assert_close(got_sum, want_sum, **TOLERANCES[dtype])
    torch.testing.assert_close(got_out, want_out, **TOLERANCES[dtype])
    if not with_residual:
        assert got_sum is x  # nothing added, nothing copied


def SMALL_NORM(E: int, weight: torch.Tensor) -> torch.nn.Module:
    from minillm.model import RMSNorm

    norm = RMSNorm(E, eps=1e-5).to(DEVICE, weight.dtype)
    norm.weight.data.copy_(weight)
    return norm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H, K, D", [(6, 2, 24), (4, 4, 16), (8, 1, 80)])
def test_qkv_rotary_matches_the_reference(dtype: torch.dtype, H: int, K: int, D: int) -> None:
    config = ModelConfig(vocab_size=8, hidden_size=H * D, intermediate_size=8, num_hidden_layers=1,
                         num_attention_heads=H, num_key_value_heads=K, head_dim=D,
                         max_position_embeddings=4096, rope_theta=10000.0)
    positions = torch.tensor([0, 1, 17, 511, 4095, 3], device=DEVICE)  # far positions too
    T = len(positions)
    rope = Rotary(config).to(DEVICE)(positions, dtype)  # (T, D)
    qkv = randn(T, (H + 2 * K) * D, dtype=dtype, seed=3)
    want = split_qkv_rotary(qkv, rope, H, K)
    got = fused_ops.qkv_rotary(qkv, rope, H, K)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.is_contiguous()
        torch.testing.assert_close(g, w, **TOLERANCES[dtype])
    assert torch.equal(got[2], want[2])  # v is copied, not computed


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_the_reference(dtype: torch.dtype) -> None:
    T, Fw = 3, fused_ops.SILU_BLOCK + 37  # two programs per token, the second one masked
    gate_up = 3 * randn(T, 2 * Fw, dtype=dtype, seed=4)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(fused_ops.silu_and_mul(gate_up), F.silu(gate) * up,
                               **TOLERANCES[dtype])


def test_the_rotary_table_holds_what_the_angles_give() -> None:
    """One table computed at load, not cos and sin recomputed every step: its rows are the
    angles position * inv_freq exactly as transformers computes them (in fp32)."""
    rotary = Rotary(SMALL)
    assert rotary.cos_sin.shape == (SMALL.max_position_embeddings, SMALL.head_dim)
    positions = torch.tensor([0, 5, 299])
    angles = positions[:, None].float() @ rotary.inv_freq[None, :]  # (T, D/2), as transformers
    want = torch.cat((angles.cos(), angles.sin()), dim=-1)
    assert torch.equal(rotary(positions, FP32), want)


def test_launchers_reject_bad_inputs_with_clear_errors() -> None:
    x = torch.zeros(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="weight must be"):
        fused_ops.add_rms_norm(x, None, torch.ones(4, device=DEVICE), 1e-5)
    with pytest.raises(ValueError, match="residual must be contiguous"):
        fused_ops.add_rms_norm(x, torch.zeros(8, 2, device=DEVICE).t(), torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match="qkv must be contiguous"):
        fused_ops.qkv_rotary(torch.zeros(2, 40, device=DEVICE), torch.zeros(2, 8), 2, 1)
    with pytest.raises(ValueError, match="gate_up must be contiguous"):
        fused_ops.silu_and_mul(torch.zeros(2, 7, device=DEVICE))


@pytest.mark.skipif(DEVICE.type == "cuda", reason="the CPU needs the interpreter")
def test_fusing_on_the_cpu_without_the_interpreter_says_how(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    model = LlamaForCausalLM.random(SMALL)
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        model.fuse()
    assert model.fuse(False) is model


# ---- merged weights: checkpoints in, checkpoints out -------------------------------------------


def hf_llama(config: ModelConfig) -> torch.nn.Module:
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HFLlama

    c = config
    hf = HFLlama(LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta, attention_bias=c.qkv_bias, tie_word_embeddings=False))
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.1)
    return hf.eval()


def test_state_dict_keeps_the_checkpoint_names_both_ways() -> None:
    """q/k/v and gate/up stack into qkv_proj and gate_up_proj on load; state_dict() splits them
    back, so transformers loads minillm's weights and minillm loads transformers'."""
    torch.manual_seed(0)
    hf = hf_llama(SMALL)
    model = LlamaForCausalLM.random(SMALL)
    missing, unexpected = model.load_state_dict(hf.state_dict(), strict=False)
    assert missing == [] and unexpected == ["model.rotary_emb.inv_freq"] * (
        "model.rotary_emb.inv_freq" in hf.state_dict())
    attn, hf_attn = model.model.layers[1].self_attn, hf.model.layers[1].self_attn
    rows = attn.qkv_proj.weight.split([6 * 24, 2 * 24, 2 * 24])
    for ours, theirs in zip(rows, (hf_attn.q_proj, hf_attn.k_proj, hf_attn.v_proj), strict=True):
        assert torch.equal(ours, theirs.weight)
    assert torch.equal(attn.qkv_proj.bias[-2 * 24:], hf_attn.v_proj.bias)
    saved = model.state_dict()
    assert set(saved) == set(hf.state_dict()) - {"model.rotary_emb.inv_freq"}
    for name, tensor in hf.state_dict().items():
        if name in saved:
            assert torch.equal(saved[name], tensor), name


# ---- the fused model against the reference -----------------------------------------------------


def decode_runner(model: LlamaForCausalLM, prompt_len: int = 5, capture: bool = False
                  ) -> DecodeGraphRunner:
    """A batch-1 decode step after a prompt of prompt_len tokens, on the padded static buffers
    CUDA graphs replay (recorded with capture, else run eagerly): the step whose launches
    batch-1 decode pays."""
    c = model.config
    config = EngineConfig(block_size=4, max_num_seqs=1, num_kv_blocks=8, max_model_len=32,
                          attention_backend="triton")
    kv_cache = torch.randn(c.num_hidden_layers, 2, 8, 4, c.num_key_value_heads, c.head_dim,
                           generator=torch.Generator().manual_seed(5)).to(DEVICE)
    runner = DecodeGraphRunner(model, kv_cache.to(model.lm_head.weight.dtype),
                               get_backend("triton", DEVICE), config, capture=capture)
    runner.inputs.input_ids[0], runner.inputs.positions[0] = 7, prompt_len
    runner.inputs.slot_mapping[0], runner.inputs.seq_lens[0] = prompt_len, prompt_len + 1
    runner.inputs.block_tables[0, :2] = torch.tensor([3, 1])
    return runner


CAPTURE = [
    pytest.param(False, id="eager"),
    pytest.param(True, id="graph", marks=[
        pytest.mark.gpu, pytest.mark.skipif(DEVICE.type != "cuda", reason="graphs need CUDA")]),
]


@pytest.mark.parametrize("capture", CAPTURE)
@pytest.mark.parametrize("dtype", [FP32, BF16])
def test_fused_model_matches_the_reference_model(dtype: torch.dtype, capture: bool) -> None:
    """The decoder with every fused kernel (replayed as a CUDA graph with capture) against
    itself unfused and eager, on a decode step through the static buffers graphs replay.
    Loading fuses on CUDA only."""
    model = LlamaForCausalLM.random(SMALL, dtype=dtype, device=DEVICE, seed=2)
    assert model.model.norm.fused == (DEVICE.type == "cuda")
    logits = {}
    for fused in (False, True):
        runner = decode_runner(model.fuse(fused), capture=capture and fused)
        logits[fused] = model.compute_logits(runner.forward_bucket(1))
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == FP32 else dict(atol=0.1, rtol=0)
    torch.testing.assert_close(logits[True], logits[False], **tol)


def test_fused_model_keeps_transformers_parity() -> None:
    """Prompt logits of the fused decoder (merged weights, every kernel) against transformers
    on the same weights, within test_model's fp32 tolerance."""
    from minillm.attention.torch_ref import TorchAttention
    from minillm.batch import build_batch
    from minillm.request import Request
    from minillm.sampling import SamplingParams
    from minillm.scheduler import ScheduledRequest

    torch.manual_seed(1)
    hf = hf_llama(SMALL)
    model = LlamaForCausalLM.random(SMALL)
    missing, _ = model.load_state_dict(hf.state_dict(), strict=False)
    assert missing == []
    model.to(DEVICE).fuse(True)  # the kernels run where the model is: CUDA, or the interpreter
    prompt = list(range(3, 40, 2))
    req = Request("0", prompt, SamplingParams(), arrival_time=0.0)
    req.block_table = [2, 0, 4, 1, 3]
    batch = build_batch([ScheduledRequest(req, len(prompt), 0, "prefill")], 4, DEVICE)
    kv_cache = torch.zeros(SMALL.num_hidden_layers, 2, 5, 4, SMALL.num_key_value_heads,
                           SMALL.head_dim, device=DEVICE)
    got = model.compute_logits(model(batch.input_ids, batch.positions, kv_cache, batch.attn,
                                     TorchAttention()))
    with torch.no_grad():
        want = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(got.cpu(), want, atol=2e-5, rtol=1e-5)


# ---- kernel launches per decode step -----------------------------------------------------------


class LaunchCounter(TorchDispatchMode):
    """Counts the kernels a function launches: every PyTorch op that computes (not views,
    allocations or detaches; under inference mode a `to` or `reshape` is a view op that may
    copy, so an op counts when its output does not alias its input) and every Triton kernel
    (the interpreter's own copies excluded)."""

    NO_KERNEL = {"empty", "empty_strided", "new_empty", "new_empty_strided", "empty_like",
                 "detach", "detach_", "lift_fresh", "set_", "resize_"}

    def __init__(self) -> None:
        super().__init__()
        self.torch_ops: dict[str, int] = {}
        self.triton_kernels: dict[str, int] = {}
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if not self.paused and name not in self.NO_KERNEL and (
                not func.is_view or not aliases(out, args[0])):
            self.torch_ops[name] = self.torch_ops.get(name, 0) + 1
        return out

    @property
    def total(self) -> int:
        return sum(self.torch_ops.values()) + sum(self.triton_kernels.values())


def aliases(out: object, source: object) -> bool:
    """Whether a view op's output (a tensor or several) shares source's storage."""
    outs = out if isinstance(out, (list, tuple)) else [out]
    return isinstance(source, torch.Tensor) and all(
        isinstance(o, torch.Tensor)
        and o.untyped_storage().data_ptr() == source.untyped_storage().data_ptr() for o in outs)


def count_launches(fn: Callable[[], object]) -> LaunchCounter:
    """Run fn once under a LaunchCounter (Triton's interpreter needed for its kernels)."""
    from triton.runtime import interpreter

    counter = LaunchCounter()
    launch = interpreter.GridExecutor.__call__

    def counted(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        name = self.fn.__name__
        counter.triton_kernels[name] = counter.triton_kernels.get(name, 0) + 1
        counter.paused = True
        try:
            return launch(self, *args, **kwargs)
        finally:
            counter.paused = False

    interpreter.GridExecutor.__call__ = counted
    try:
        with counter, torch.inference_mode():
            fn()
    finally:
        interpreter.GridExecutor.__call__ = launch
    return counter


@pytest.mark.skipif(DEVICE.type == "cuda", reason="counts through Triton's CPU interpreter")
def test_fused_decode_step_launches_eight_kernels_per_layer_around_attention() -> None:
    """Batch-1 decode of the Llama-3.2-1B layout (16 layers) on the static buffers CUDA graphs
    replay: forward and logits. Around attention (whose kernels minillm.attention owns), a
    layer was ~38 kernels unfused (two RMSNorms of ~8, rotary ~7 for q and for k, SwiGLU's
    silu and mul, five GEMMs, two adds); fused it is 8: two add+RMSNorms, the qkv GEMM, rotary,
    o, gate_up, silu_and_mul, down. The whole step goes from ~642 launches to ~166."""
    model = LlamaForCausalLM.random(LLAMA_1B_LAYOUT, dtype=BF16)
    L = LLAMA_1B_LAYOUT.num_hidden_layers
    attention = {"write_kv_kernel", "decode_kernel", "merge_splits_kernel", "extend_kernel"}
    outside = {}
    for fused in (False, True):
        runner = decode_runner(model.fuse(fused))
        counter = count_launches(lambda r=runner: model.compute_logits(r.forward_bucket(1)))
        outside[fused] = counter.total - sum(n for name, n in counter.triton_kernels.items()
                                             if name in attention)
    # + embedding, the rope gather and cast, the final norm, lm_head and the logits' cast
    assert outside[True] <= 8 * L + 6, outside
    assert outside[False] >= 30 * L, outside


# ---- ahead-of-time compilation -----------------------------------------------------------------


def compile_every_fused_kernel(arch: int, dtype_name: str) -> None:
    """Compile each fused kernel to PTX for sm_<arch> with the constexprs and warps its launcher
    passes (E = 2048, D = 64: Llama-3.2-1B; E = 4096, D = 128: Llama-3-8B; E = 8192: 70B).
    Self-contained: run in a fresh process, where TRITON_INTERPRET is off, so the kernels are
    JIT functions."""
    import triton
    from triton.backends.compiler import GPUTarget

    from minillm.layers import fused_ops

    def build(kernel, constexprs: dict, num_warps: int = 4) -> None:  # noqa: ANN001
        signature = {name: "constexpr" if name in constexprs else
                     f"*{dtype_name}" if name.endswith("_ptr") else
                     "fp32" if name == "eps" else "i32" for name in kernel.arg_names}
        source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                                  options={"num_warps": num_warps})
        assert f".entry {kernel.__name__}(" in compiled.asm["ptx"], kernel.__name__

    for residual, E in ((False, 2048), (True, 2048), (True, 4096), (True, 8192)):
        build(fused_ops.add_rms_norm_kernel, dict(HAS_RESIDUAL=residual, BLOCK_E=E),
              fused_ops.norm_num_warps(E))
    for D in (64, 128):
        build(fused_ops.qkv_rotary_kernel, dict(HALF=D // 2, BLOCK_HALF=D // 2),
              fused_ops.ROTARY_WARPS)
    build(fused_ops.silu_and_mul_kernel, dict(BLOCK=fused_ops.SILU_BLOCK))


@pytest.mark.parametrize("arch, dtype_name", [(75, "fp16"), (80, "bf16"), (90, "bf16")])
def test_every_fused_kernel_compiles_ahead_of_time(arch: int, dtype_name: str) -> None:
    compile_in_subprocess(compile_every_fused_kernel, arch, dtype_name)


def test_positions_past_the_checkpoints_window_extrapolate():
    """An engine longer than max_position_embeddings (2048 for the shipped model) still runs:
    the cos/sin table grows to max_model_len."""
    from minillm import LLM, SamplingParams

    llm = LLM(device="cpu", max_model_len=2100, num_kv_blocks=140, max_num_seqs=1)
    out = llm.generate([[1] * 2090], SamplingParams(max_tokens=5, temperature=0,
                                                    ignore_eos=True), use_tqdm=False)[0]
    assert len(out.token_ids) == 5
    assert llm.model.model.rotary.cos_sin.shape[0] == 2100
