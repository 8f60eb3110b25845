"""Decode CUDA graphs (minillm.cuda_graph): padding, buckets and replay against the plain forward.

Without CUDA the runner's eager path (capture=False) runs the same padded static buffers with
the Triton kernels under Triton's interpreter, which must be switched on before triton is first
imported: hence the environment line at the very top, as in test_kernels.py. With CUDA the same
tests run on the GPU, and the capture=True cases record and replay real graphs.
"""


# Without CUDA the kernels run under Triton's interpreter: conftest.py switches it on.
import subprocess
import sys

import pytest
import torch

from minillm.attention import get_backend
from minillm.batch import AttentionMetadata, build_batch
from minillm.bench.__main__ import main as bench_main
from minillm.config import EngineConfig
from minillm.cuda_graph import DecodeGraphRunner, bucket_sizes
from minillm.engine import Engine
from minillm.model import LlamaForCausalLM
from minillm.model_config import ModelConfig
from minillm.request import Request
from minillm.sampling import SamplingParams
from minillm.scheduler import ScheduledRequest

pytestmark = pytest.mark.kernels  # they run the Triton kernels: selected on a lent GPU too

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
MODEL = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    max_position_embeddings=128)
CONFIG = EngineConfig(block_size=4, max_num_seqs=8, num_kv_blocks=64, max_model_len=64,
                      attention_backend="triton")  # buckets 1, 2, 4, 8; tables 16 blocks wide
PROMPT_LENS = [3, 4, 7, 8, 1, 12, 5, 15]  # with the decode token: contexts at block edges +-1
CAPTURE = [
    pytest.param(False, id="eager"),
    pytest.param(True, id="graph", marks=[
        pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="CUDA graphs need CUDA")]),
]


def make_engine() -> Engine:
    """An engine on the plain forward: the tests put their own runner in front of it."""
    model = LlamaForCausalLM.random(MODEL, device=DEVICE, seed=1)
    engine = Engine(model, None, CONFIG)
    engine.runner.graph_runner = None  # on CUDA the engine would otherwise replay its own graphs
    return engine


def prompt(n: int, seed: int) -> list[int]:
    """Never token 0 first: a padding row (token 0 at position 0) would compute its K and V."""
    return [(seed * 31 + 7 * i + 1) % MODEL.vocab_size for i in range(n)]


def decoding(engine: Engine) -> list[ScheduledRequest]:
    """Prefill every prompt, then schedule (without running) a step where each decodes."""
    for i, n in enumerate(PROMPT_LENS):
        engine.add_request(prompt(n, i), SamplingParams(max_tokens=4, temperature=0))
    engine.step()
    scheduled = engine.scheduler.schedule().scheduled
    assert [s.phase for s in scheduled] == ["decode"] * len(PROMPT_LENS)
    return scheduled


def changed_slots(before: torch.Tensor, after: torch.Tensor) -> set[int]:
    """Cache slots whose K or V changed in any layer: (L, 2, N, P, K, D) -> slot ids."""
    L, _, N, P = before.shape[:4]
    diff = (before != after).view(L, 2, N * P, -1).any(-1).any(1).any(0)  # (N * P,)
    return set(diff.nonzero().flatten().tolist())


@pytest.mark.parametrize("capture", CAPTURE)
def test_padded_decode_matches_the_plain_forward(capture: bool) -> None:
    engine = make_engine()
    scheduled = decoding(engine)
    runner = DecodeGraphRunner(engine.model, engine.runner.kv_cache, engine.runner.backend,
                               CONFIG, capture)
    # Inside buckets and on their edges, bigger after smaller and back, so stale rows of an
    # earlier, bigger batch must be padded over.
    for step, B in enumerate([3, 8, 5, 1, 4, 2, 7]):
        batch = build_batch(scheduled[:B], CONFIG.block_size, DEVICE)
        assert runner.can_run(batch.attn) and runner.bucket_for(B) >= B
        before = engine.runner.kv_cache.clone()
        hidden = runner.run(batch.input_ids, batch.positions, batch.attn).clone()
        slots = set(batch.attn.slot_mapping.tolist())
        changed = changed_slots(before, engine.runner.kv_cache)
        assert changed == slots if step == 0 else changed <= slots  # padding wrote nothing
        expected = engine.model(batch.input_ids, batch.positions, engine.runner.kv_cache,
                                batch.attn, engine.runner.backend)
        assert hidden.shape == expected.shape == (B, MODEL.hidden_size)
        torch.testing.assert_close(hidden, expected, atol=1e-4, rtol=1e-4)
        logits = engine.model.compute_logits(hidden)
        assert torch.equal(logits.argmax(-1), engine.model.compute_logits(expected).argmax(-1))


class RoutedModel:
    """The model as the engine sees it once it uses the runner: decode-only steps go through
    the runner, every other step through the model itself. Counts the buckets used."""

    def __init__(self, model: LlamaForCausalLM, runner: DecodeGraphRunner):
        self.model, self.runner, self.buckets_used = model, runner, []

    def __getattr__(self, name: str) -> object:
        return getattr(self.model, name)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                 meta: AttentionMetadata, backend: object) -> torch.Tensor:
        if self.runner.can_run(meta):
            self.buckets_used.append(self.runner.bucket_for(meta.num_seqs))
            return self.runner.run(input_ids, positions, meta)
        return self.model(input_ids, positions, kv_cache, meta, backend)


def generate(engine: Engine) -> dict[str, list[int]]:
    """Greedy outputs of requests that finish one after another, so decode batches shrink
    through every bucket, with one late request whose prefill makes a mixed step."""
    greedy = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in range(2, 8)]
    for i, params in enumerate(greedy[:5]):
        engine.add_request(prompt(PROMPT_LENS[i], i), params, request_id=str(i))
    finished: dict[str, list[int]] = {}
    for step in range(40):
        if step == 2:
            engine.add_request(prompt(6, 9), greedy[5], request_id="late")
        finished.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
        if not engine.has_unfinished_requests():
            return finished
    raise AssertionError("the requests did not finish")


@pytest.mark.parametrize("capture", CAPTURE)
def test_engine_with_the_runner_generates_the_same_tokens(capture: bool) -> None:
    expected = generate(make_engine())
    engine = make_engine()
    runner = DecodeGraphRunner(engine.model, engine.runner.kv_cache, engine.runner.backend,
                               CONFIG, capture)
    engine.runner.model = routed = RoutedModel(engine.model, runner)  # the runner's forward
    assert generate(engine) == expected
    assert set(routed.buckets_used) == {1, 2, 4, 8}
    assert engine.stats()["num_free_blocks"] == CONFIG.num_kv_blocks


def scheduled_request(prefix: int, num_tokens: int, num_blocks: int) -> ScheduledRequest:
    req = Request("r", [0] * (prefix + num_tokens), SamplingParams(), arrival_time=0.0)
    req.block_table = list(range(num_blocks))
    return ScheduledRequest(req, num_tokens, prefix, "decode" if num_tokens == 1 else "prefill")


def test_can_run_takes_only_decode_batches_that_fit() -> None:
    engine = make_engine()
    runner = DecodeGraphRunner(engine.model, engine.runner.kv_cache, engine.runner.backend, CONFIG,
                               capture=False)

    def can_run(rows: list[tuple[int, int, int]]) -> bool:
        batch = build_batch([scheduled_request(*row) for row in rows], CONFIG.block_size, DEVICE)
        return runner.can_run(batch.attn)

    assert can_run([(5, 1, 2)] * 8)
    assert not can_run([(5, 1, 2)] * 9)  # more requests than the largest bucket
    assert not can_run([(0, 6, 2)])  # a prefill
    assert not can_run([(5, 1, 2), (0, 6, 2)])  # a mixed step
    assert not can_run([(5, 1, 2), (3, 2, 2)])  # an extend of two tokens
    assert not can_run([(5, 1, 17)])  # a block table wider than max_model_len / block_size


def test_bucket_sizes_double_then_step_by_16_up_to_max_num_seqs() -> None:
    assert bucket_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert bucket_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert bucket_sizes(8) == [1, 2, 4, 8]
    assert bucket_sizes(5) == [1, 2, 4, 5]
    assert bucket_sizes(1) == [1]


def test_runner_refuses_the_torch_backend_and_capture_off_cuda() -> None:
    engine = make_engine()
    with pytest.raises(ValueError, match="need the triton attention backend"):
        DecodeGraphRunner(engine.model, engine.runner.kv_cache, get_backend("torch", DEVICE),
                          CONFIG, capture=False)
    if not CUDA:
        with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
            DecodeGraphRunner(engine.model, engine.runner.kv_cache, engine.runner.backend, CONFIG)


@pytest.mark.skipif(CUDA, reason="checks the message shown without CUDA")
def test_gpu_benchmarks_say_they_need_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["kernels"]) == 2
    assert "needs CUDA" in capsys.readouterr().err
    run = subprocess.run([sys.executable, "-m", "minillm.bench", "gpu", "--out", "unused"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert "needs CUDA" in run.stderr and "Traceback" not in run.stderr
