"""A step's metadata (minillm.batch.build_batch) reaches the device once, and the Triton backend
(minillm.attention.triton_backend) runs a mixed step in one attention launch per layer, with no
host-to-device copy of its own: on a GPU each copy from pageable memory stalls the host, and
per layer they cost 2 x layers stalls a step.

Without CUDA the Triton kernels run under Triton's interpreter, which must be switched on before
triton is first imported: hence the environment line at the very top, as in test_kernels.py.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

from minillm.attention import triton_backend  # noqa: E402
from minillm.batch import build_batch  # noqa: E402
from minillm.config import EngineConfig  # noqa: E402
from minillm.engine import Engine  # noqa: E402
from minillm.model import LlamaForCausalLM  # noqa: E402
from minillm.model_config import ModelConfig  # noqa: E402
from minillm.request import Request  # noqa: E402
from minillm.sampling import SamplingParams  # noqa: E402
from minillm.sampling import sampler as sampling  # noqa: E402
from minillm.scheduler import ScheduledRequest  # noqa: E402

pytestmark = pytest.mark.kernels  # they run the Triton kernels: selected on a lent GPU too

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
P = 4  # block size


class HostToDevice:
    """Counts the calls that can copy host values to a device: torch.tensor, and Tensor.to with
    a device (a cast to another dtype is no copy between host and device)."""

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        real_tensor, real_to = torch.tensor, torch.Tensor.to

        def to(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            if "device" in kwargs or any(isinstance(a, (torch.device, str)) for a in args):
                self.calls.append("to")
            return real_to(x, *args, **kwargs)

        monkeypatch.setattr(torch, "tensor", lambda *a, **k: self.calls.append("tensor")
                            or real_tensor(*a, **k))
        monkeypatch.setattr(torch.Tensor, "to", to)


def scheduled_step(rows: list[tuple[int, int]]) -> list[ScheduledRequest]:
    """Requests of (cached tokens, new tokens) with made-up block tables."""
    scheduled, next_block = [], 0
    for b, (cached, new) in enumerate(rows):
        req = Request(str(b), list(range(1, cached + new + 1)), SamplingParams(), 0.0)
        blocks = -(-(cached + new) // P)
        req.block_table = list(range(next_block, next_block + blocks))
        next_block += blocks
        scheduled.append(ScheduledRequest(req, new, cached, "decode" if new == 1 else "prefill"))
    return scheduled


@pytest.mark.parametrize("rows", [[(5, 1)], [(5, 1), (0, 7), (9, 3)] * 7])
def test_build_batch_copies_once_per_dtype_whatever_the_batch(monkeypatch, rows):
    copies = HostToDevice(monkeypatch)
    batch = build_batch(scheduled_step(rows), P, DEVICE)
    assert copies.calls == ["tensor", "to"] * 2  # the int64 values, then the int32 ones
    # what the kernels read: contiguous, with the same values the per-field copies gave
    for x in (batch.attn.slot_mapping, batch.attn.block_tables, batch.attn.seq_lens,
              batch.attn.query_start_loc, batch.input_ids, batch.positions, batch.sample_indices):
        assert x.is_contiguous() and x.device.type == DEVICE.type
    assert batch.attn.block_tables.dtype == torch.int32 and batch.input_ids.dtype == torch.int64
    assert batch.attn.seq_lens.tolist() == [cached + new for cached, new in rows]
    assert batch.attn.block_tables[-1].tolist()[:3] == scheduled_step(rows)[-1].request.block_table
    assert batch.positions.tolist() == [p for c, n in rows for p in range(c, c + n)]


def test_the_copy_is_pinned_and_non_blocking_on_cuda(monkeypatch):
    """A CUDA copy from pageable memory blocks the host; from pinned memory it is queued."""
    seen = []
    real_tensor = torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda values, dtype, pin_memory: seen.append(
        ("pin_memory", pin_memory)) or real_tensor(values, dtype=dtype))
    monkeypatch.setattr(torch.Tensor, "to", lambda x, device, non_blocking: seen.append(
        ("non_blocking", non_blocking)) or x)
    sampling.host_to_device([1, 2], torch.int64, torch.device("cuda"))
    assert seen == [("pin_memory", True), ("non_blocking", True)]
    seen.clear()
    sampling.host_to_device([1, 2], torch.int64, torch.device("cpu"))  # pinning needs CUDA
    assert seen == [("pin_memory", False), ("non_blocking", False)]


def make_engine(num_layers: int) -> Engine:
    model = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=num_layers, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    config = EngineConfig(block_size=P, max_num_seqs=4, num_kv_blocks=32, max_model_len=64,
                          attention_backend="triton")
    engine = Engine(LlamaForCausalLM.random(model, device=DEVICE, seed=0), None, config)
    engine.runner.graph_runner = None  # eager forward: the step under test, not a graph replay
    return engine


def mixed_step_counts(monkeypatch, num_layers: int) -> tuple[list[str], list[str]]:
    """(host-to-device calls, attention launches) of a step where one request decodes while
    another prefills, on a model of num_layers layers."""
    engine = make_engine(num_layers)
    params = SamplingParams(max_tokens=4, temperature=0.8, seed=1)
    engine.enqueue(engine.make_request([3, 1, 4, 1, 5], params))
    engine.step()  # its prefill: it decodes next
    engine.enqueue(engine.make_request([2, 7, 1, 8, 2, 8, 1, 8, 2], params))
    launches: list[str] = []
    for name in ("decode_attention", "extend_attention"):
        real = getattr(triton_backend, name)
        monkeypatch.setattr(triton_backend, name, lambda *a, real=real, name=name, **k:
                            launches.append(name) or real(*a, **k))
    copies = HostToDevice(monkeypatch)
    outputs = engine.step()
    monkeypatch.undo()
    assert len(outputs) == 2  # both sampled: the step was mixed, one decode and one prefill
    return copies.calls, launches


def test_a_mixed_step_launches_attention_once_per_layer_and_copies_once(monkeypatch):
    copies_2, launches_2 = mixed_step_counts(monkeypatch, num_layers=2)
    copies_4, launches_4 = mixed_step_counts(monkeypatch, num_layers=4)
    assert launches_2 == ["extend_attention"] * 2 and launches_4 == ["extend_attention"] * 4
    assert copies_4 == copies_2  # no copy per layer: build_batch's two, and the sampler's one


def test_a_mixed_step_matches_separate_decode_and_extend(monkeypatch):
    """The one launch computes what the two kernels computed apart: the decode rows of a mixed
    step through the extend kernel give the decode kernel's result."""
    from minillm.attention.triton_decode import decode_attention

    rows = [(6, 1), (0, 5), (13, 1), (3, 4), (8, 1)]
    meta = build_batch(scheduled_step(rows), P, DEVICE).attn
    gen = torch.Generator().manual_seed(0)
    H, K, D, N = 4, 2, 16, 16
    T = sum(new for _, new in rows)
    q, k, v = (torch.randn(T, heads, D, generator=gen).to(DEVICE) for heads in (H, K, K))
    kv_cache = torch.randn(2, N, P, K, D, generator=gen).to(DEVICE)
    out = triton_backend.TritonAttention().forward(q, k, v, kv_cache, meta)
    decodes = [b for b, (_, new) in enumerate(rows) if new == 1]
    starts = [meta.query_start_cpu[b] for b in decodes]
    alone = decode_attention(q[starts].contiguous(), kv_cache, meta.block_tables[decodes],
                             meta.seq_lens[decodes])
    torch.testing.assert_close(out[starts], alone, atol=2e-5, rtol=2e-5)
