"""The Triton attention kernels (minillm.attention.triton_*) against the torch reference.

Without CUDA the kernels run on CPU under Triton's interpreter, which must be switched on before
triton is first imported: hence the environment line at the very top (conftest imports torch
only). With CUDA the same tests run on the GPU. Each step builds a paged cache that holds NaN in
every slot outside the requests' contexts, so a kernel that reads one shows NaN, and compares
with TorchAttention run in float64 on the same (rounded) inputs. Shapes: T tokens in the step,
B requests, H query heads, K KV heads (H = G * K), D head dim, N blocks of P slots.
"""


# Without CUDA the kernels run under Triton's interpreter: conftest.py switches it on.
from dataclasses import dataclass

import pytest
import torch
from aot_support import compile_every_kernel, compile_in_subprocess
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.attention import tiles, torch_ref, triton_decode
from minillm.attention.triton_backend import TritonAttention, triton_available
from minillm.attention.triton_decode import (
    MIN_SPLIT_TOKENS,
    choose_num_splits,
    decode_attention,
    decode_splits,
)
from minillm.attention.triton_write_kv import write_kv
from minillm.batch import AttentionMetadata, build_batch
from minillm.request import Request
from minillm.sampling import SamplingParams
from minillm.scheduler import ScheduledRequest

pytestmark = pytest.mark.kernels

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
K = 2  # KV heads
FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
# Against float64 on the same inputs, the kernels' error is the fp32 arithmetic plus one rounding
# of the output: 2**-11 relative for fp16, 2**-8 for bf16, whose values here reach 4. The
# interpreter truncates fp32 -> bf16 instead of rounding to nearest, so bf16 allows a whole step.
TOLERANCES = {
    FP32: dict(atol=2e-5, rtol=2e-5),
    FP16: dict(atol=2e-3, rtol=2e-3),
    BF16: dict(atol=2e-2, rtol=2e-2),
}


@dataclass
class Step:
    q: torch.Tensor  # (T, H, D)
    k: torch.Tensor  # (T, K, D)
    v: torch.Tensor  # (T, K, D)
    kv_cache: torch.Tensor  # (2, N, P, K, D): prefixes written, NaN in every other slot
    meta: AttentionMetadata


def make_step(rows: list[tuple[int, int]], P: int, G: int, D: int, dtype: torch.dtype,
              seed: int = 0) -> Step:
    """A step over requests of (cached prefix, new tokens), with shuffled block tables. The
    values depend on the seed only, not on P, so block sizes can be compared."""
    gen = torch.Generator().manual_seed(seed)
    H = K * G
    qs = [torch.randn(n, H, D, generator=gen) for _, n in rows]
    ks = [torch.randn(prefix + n, K, D, generator=gen) for prefix, n in rows]  # (S, K, D)
    vs = [torch.randn(prefix + n, K, D, generator=gen) for prefix, n in rows]
    blocks = [-(-(prefix + n) // P) for prefix, n in rows]
    N = sum(blocks) + 2
    perm = torch.randperm(N, generator=gen).tolist()
    kv_cache = torch.full((2, N * P, K, D), float("nan"))
    scheduled = []
    for b, (prefix, n) in enumerate(rows):
        table = perm[sum(blocks[:b]):sum(blocks[:b + 1])]
        slots = [table[pos // P] * P + pos % P for pos in range(prefix)]
        kv_cache[0, slots], kv_cache[1, slots] = ks[b][:prefix], vs[b][:prefix]
        req = Request(str(b), [0] * (prefix + n), SamplingParams(), arrival_time=0.0)
        req.block_table = table
        scheduled.append(ScheduledRequest(req, n, prefix, "decode" if n == 1 else "prefill"))
    meta = build_batch(scheduled, P, DEVICE).attn

    def new_tokens(full: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([x[prefix:] for x, (prefix, _) in zip(full, rows)])  # (T, K, D)

    def to(x: torch.Tensor) -> torch.Tensor:
        return x.to(dtype).to(DEVICE)

    return Step(to(torch.cat(qs)), to(new_tokens(ks)), to(new_tokens(vs)),
                to(kv_cache.view(2, N, P, K, D)), meta)


def reference(step: Step) -> tuple[torch.Tensor, torch.Tensor]:
    """TorchAttention in float64 on the step's inputs: (output (T, H, D), cache after)."""
    cache = step.kv_cache.double().nan_to_num()  # the reference reads whole blocks: no NaN
    out = torch_ref.TorchAttention().forward(step.q.double(), step.k.double(), step.v.double(),
                                             cache, step.meta)
    return out, cache


def boundary_rows(P: int) -> list[tuple[int, int]]:
    """(prefix, new tokens) at block boundaries +-1: decodes (one a whole context of 1),
    prompts over an empty prefix, extends over a cached one; and some spanning several tiles."""
    decodes = [(s - 1, 1) for s in (1, P - 1, P, P + 1, 2 * P, 2 * P + 1, 100) if s >= 1]
    prompts = [(0, n) for n in (2, P - 1, P, P + 1, 70) if n >= 2]
    extends = [(prefix, n) for prefix in (P - 1, P, P + 1, 40) for n in (2, P + 1, 33)
               if prefix >= 1]
    rows = list(dict.fromkeys(decodes + prompts + extends))
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(P)).tolist()
    return [rows[i] for i in order]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert actual.dtype == dtype and not actual.isnan().any()
    torch.testing.assert_close(actual.double(), expected.double(), **TOLERANCES[dtype])


# Each dtype, block size, group size and head dim appears, without the full cross product.
CONFIGS = [  # (dtype, P, G, D)
    (FP32, 16, 4, 64), (FP32, 1, 5, 80),
    (FP16, 16, 5, 80), (FP16, 1, 1, 64),
    (BF16, 16, 1, 80), (BF16, 1, 4, 64),
]


@pytest.mark.parametrize("dtype, P, G, D", CONFIGS, ids=lambda x: str(x).replace("torch.", ""))
def test_forward_matches_the_reference_on_a_mixed_batch(dtype: torch.dtype, P: int, G: int,
                                                        D: int) -> None:
    step = make_step(boundary_rows(P), P, G, D, dtype, seed=P + G + D)
    expected, expected_cache = reference(step)
    out = TritonAttention().forward(step.q, step.k, step.v, step.kv_cache, step.meta)
    assert out.shape == step.q.shape
    assert_close(out, expected, dtype)
    written = ~step.kv_cache.isnan()  # the prefixes and the step's tokens, NaN elsewhere
    assert torch.equal(step.kv_cache[written].double(), expected_cache[written])
    assert written.sum() == 2 * K * D * sum(step.meta.seq_lens_cpu)


@settings(max_examples=10, deadline=None)
@given(
    P=st.sampled_from([1, 2, 4, 16]),
    G=st.sampled_from([1, 2, 3, 4, 5]),
    rows=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 20)), min_size=1, max_size=5),
    D=st.sampled_from([8, 24]),  # padded to 16 and 32 for tl.dot
    seed=st.integers(0, 2**16),
)
def test_forward_matches_the_reference_on_random_batches(
        P: int, G: int, rows: list[tuple[int, int]], D: int, seed: int) -> None:
    step = make_step(rows, P, G, D, dtype=FP32, seed=seed)
    expected, _ = reference(step)
    out = TritonAttention().forward(step.q, step.k, step.v, step.kv_cache, step.meta)
    assert_close(out, expected, FP32)


@pytest.mark.parametrize("dtype, P, G, D", [(FP32, 16, 4, 64), (BF16, 1, 5, 80)],
                         ids=["fp32-P16-G4-D64", "bf16-P1-G5-D80"])
def test_decode_gives_one_result_for_every_split_count(dtype: torch.dtype, P: int, G: int,
                                                       D: int) -> None:
    rows = [(s - 1, 1) for s in (1, 31, 32, 33, 64, 65, 100)]  # around the 32-position tiles
    step = make_step(rows, P, G, D, dtype, seed=7)
    expected, _ = reference(step)
    write_kv(step.k, step.v, step.kv_cache, step.meta.slot_mapping)
    meta = step.meta
    one = decode_attention(step.q, step.kv_cache, meta.block_tables, meta.seq_lens, num_splits=1)
    assert_close(one, expected, dtype)
    num_blocks = meta.block_tables.shape[1]
    for num_splits in (2, 3, num_blocks + 5):  # the last leaves most splits empty
        out = decode_attention(step.q, step.kv_cache, meta.block_tables, meta.seq_lens,
                               num_splits=num_splits, min_split_len=1)  # splits of one tile
        assert_close(out, expected, dtype)
        assert_close(out, one, dtype)


def test_decode_splits_each_context_by_its_own_length_under_a_huge_max_model_len() -> None:
    # Llama-3's max_model_len of 131072 at P = 16: block tables 8192 wide, as a CUDA graph
    # captures them, over contexts of 3000 and 300 positions. With q = 0 every score is 0, so
    # 2^lse of a split is the number of positions it read: the kernel's own count of its work.
    P, D, num_splits = 16, 16, 8
    seq_lens = [3000, 300]
    blocks = [-(-s // P) for s in seq_lens]
    gen = torch.Generator().manual_seed(0)
    cache = torch.randn(2, sum(blocks), P, K, D, generator=gen).to(DEVICE)
    tables = torch.zeros(2, 131072 // P, dtype=torch.int32)
    tables[0, :blocks[0]] = torch.arange(blocks[0])
    tables[1, :blocks[1]] = torch.arange(blocks[0], sum(blocks))
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    q = torch.zeros(2, K, D, device=DEVICE)
    _, lse = decode_splits(q, cache, tables.to(DEVICE), lens, num_splits)  # (B, H, splits)
    work = lse.exp2().round().long().cpu()  # positions read by each split, 0 if empty
    block_n = tiles.tiles_for(DEVICE, D, FP32).decode.block_n
    assert work.sum(-1).tolist() == [[3000] * K, [300] * K]
    # 3000 positions: every split works, none more than its share plus one tile.
    assert (work[0] > 0).all() and work[0].max() <= 3000 / num_splits + block_n
    # 300 positions: splits of at least MIN_SPLIT_TOKENS, so two work and the rest are empty.
    assert (work[1, :, 0] == MIN_SPLIT_TOKENS).all() and (work[1, :, 2:] == 0).all()


def test_decode_launch_depends_on_shapes_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # A CUDA graph replays the launch it captured: grid and arguments must not depend on the
    # values of seq_lens, which change every step while the graph stays the same.
    launches = []

    class Recorder:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getitem__(self, grid: tuple):
            def launch(*args, **kwargs) -> None:
                args = [(tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a
                        for a in args]
                launches.append((self.name, grid, args, kwargs))
            return launch

    for name in ("decode_kernel", "merge_splits_kernel"):
        monkeypatch.setattr(triton_decode, name, Recorder(name))
    monkeypatch.setattr(triton_decode, "num_sms", lambda device: 132)  # an H100's SMs
    step = make_step([(0, 1), (0, 1)], P=16, G=2, D=64, dtype=FP32)
    tables = torch.zeros(2, 8192, dtype=torch.int32, device=DEVICE)  # 131072 positions
    for seq_lens in ([1, 1], [3000, 70000]):
        lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
        decode_attention(step.q, step.kv_cache, tables, lens)
    assert launches[0][1][2] > 1  # split: 2 requests x 2 KV heads leave the SMs idle
    assert launches[:2] == launches[2:]


def test_the_block_size_does_not_change_the_result() -> None:
    # Tiles are cut by position, not by block, so only the addresses differ: bit-equal outputs.
    rows = [(0, 1), (20, 1), (0, 37), (17, 16), (33, 2)]
    outs = []
    for P in (1, 16):
        step = make_step(rows, P, G=4, D=80, dtype=FP16, seed=3)
        outs.append(TritonAttention().forward(step.q, step.k, step.v, step.kv_cache, step.meta))
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_write_kv_fills_the_given_slots_and_skips_padding(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    N, P, D = 5, 4, 80
    slots = torch.tensor([13, -1, 2, 7, -1, 19])  # -1: padding tokens of a fixed-size batch
    k = torch.randn(6, K, D, generator=gen).to(dtype).to(DEVICE)
    v = torch.randn(6, K, D, generator=gen).to(dtype).to(DEVICE)
    cache = torch.randn(2, N, P, K, D, generator=gen).to(dtype).to(DEVICE)
    expected = cache.clone()
    real = slots >= 0
    torch_ref.write_kv(k[real], v[real], expected, slots[real].to(DEVICE))
    write_kv(k, v, cache, slots.to(DEVICE))
    assert torch.equal(cache, expected)


def test_choose_num_splits_fills_the_gpu_only_for_long_contexts_at_small_batch() -> None:
    assert choose_num_splits(num_seqs=64, num_kv_heads=8, max_seq_len=32768, num_sms=132) == 1
    assert choose_num_splits(num_seqs=1, num_kv_heads=8, max_seq_len=300, num_sms=132) == 1
    assert choose_num_splits(num_seqs=1, num_kv_heads=8, max_seq_len=1024, num_sms=132) == 4
    assert choose_num_splits(num_seqs=2, num_kv_heads=8, max_seq_len=32768, num_sms=132) == 9
    assert choose_num_splits(num_seqs=1, num_kv_heads=1, max_seq_len=32768, num_sms=132) == 16


def test_launchers_reject_bad_inputs_with_clear_errors() -> None:
    step = make_step([(3, 1), (0, 1)], P=4, G=2, D=64, dtype=FP32)
    meta = step.meta
    with pytest.raises(TypeError, match="q and kv_cache must share"):
        decode_attention(step.q.half(), step.kv_cache, meta.block_tables, meta.seq_lens)
    with pytest.raises(ValueError, match="block_tables must be contiguous int32"):
        decode_attention(step.q, step.kv_cache, meta.block_tables.long(), meta.seq_lens)
    with pytest.raises(ValueError, match="q must be contiguous"):
        decode_attention(step.q.transpose(0, 1).contiguous().transpose(0, 1), step.kv_cache,
                         meta.block_tables, meta.seq_lens)
    with pytest.raises(ValueError, match=r"k must be \(T, K, D\)"):
        write_kv(step.k[:, :1], step.v, step.kv_cache, meta.slot_mapping)


def test_triton_available_says_how_to_switch_on_the_interpreter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="set TRITON_INTERPRET=1 .* before triton"):
        triton_available(torch.device("cpu"))


# sm_75 (T4) has no bf16; sm_86 (A10, RTX 30xx) has the smallest shared memory of the table;
# head dim 256 (Gemma) takes the smaller tiles.
@pytest.mark.parametrize("arch, dtype_name, block_d", [
    (75, "fp16", 128), (80, "bf16", 128), (86, "bf16", 128), (90, "bf16", 128), (90, "fp32", 128),
    (90, "bf16", 256)])
def test_every_kernel_compiles_ahead_of_time(arch: int, dtype_name: str, block_d: int) -> None:
    # No GPU needed: triton compiles for a named target.
    compile_in_subprocess(compile_every_kernel, arch, dtype_name, block_d)


def test_engine_with_triton_matches_torch_backend():
    """The whole engine on the shipped model: same greedy tokens with either backend, with
    chunked prefill (a small budget splits the prompts) and prefix caching on."""
    from minillm import LLM, SamplingParams

    system = "Duke.\nWhat, is Antonio here?\n\nAnt.\nReady, so please your grace.\n"
    prompts = [system + "Duke.\nI am sorry", system + "Ant.\nI have heard", "O"]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    tokens = {}
    for backend in ("torch", "triton"):
        llm = LLM(num_kv_blocks=64, block_size=16, max_num_batched_tokens=24,
                  enable_prefix_caching=True, attention_backend=backend, device=DEVICE,
                  dtype="float32")
        llm.generate(prompts[:1], params, use_tqdm=False)  # fills the prefix cache
        tokens[backend] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert llm.stats()["prefix_cache_hits"] > 0
        assert llm.stats()["num_free_blocks"] == llm.stats()["num_blocks"]
    assert tokens["triton"] == tokens["torch"]
