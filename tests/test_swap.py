"""KVSwapper's copies: blocks out to the host pool and back, bit for bit, on the CPU here and
on CUDA (pinned host memory, a side stream) where there is a GPU; on a GPU the engine's outputs
under swap match recompute's."""

from __future__ import annotations

import pytest
import torch

from minillm.kv_cache import allocate_kv_cache
from minillm.swap import GIB, KVSwapper, SwapSpace, num_swap_blocks

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.ch09
@pytest.mark.gpu
@pytest.mark.parametrize("device", DEVICES)
def test_blocks_go_out_and_come_back_bit_for_bit(device: str) -> None:
    kv = allocate_kv_cache(2, 10, 4, 2, 8, torch.float16, device)
    kv.copy_(torch.randn(kv.shape, generator=torch.Generator().manual_seed(0)).to(kv))
    original = kv.clone()
    swapper = KVSwapper(kv, num_blocks=6)
    assert swapper.host.is_pinned() == (device == "cuda")
    swapper.copy([(7, 0), (2, 5), (9, 3)], [])
    kv[:, :, [7, 2, 9]] = 0  # the freed device blocks get overwritten by other requests
    # Out before in within one step: block 4 goes out to host 1 while host 0 comes in to it.
    swapper.copy([(4, 1)], [(0, 4), (5, 6), (3, 8)])
    if device == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(kv[:, :, 4], original[:, :, 7])
    assert torch.equal(kv[:, :, 6], original[:, :, 2])
    assert torch.equal(kv[:, :, 8], original[:, :, 9])
    assert torch.equal(swapper.host[1].to(device), original[:, :, 4])


@pytest.mark.ch09
def test_the_host_pool_hands_out_whole_blocks_and_takes_them_back() -> None:
    assert num_swap_blocks(1.0, GIB // 8) == 8 and num_swap_blocks(0.0, 1) == 0
    pool = SwapSpace(4)
    first = pool.allocate(3)
    assert first == [0, 1, 2] and pool.allocate(2) is None and pool.num_free_blocks == 1
    pool.free(first)
    assert pool.num_free_blocks == 4 and sorted(pool.allocate(4)) == [0, 1, 2, 3]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_swap_gives_the_tokens_recompute_gives() -> None:
    import random

    from minillm import LLM, SamplingParams

    rng = random.Random(0)
    prompts = [[rng.randrange(1, 4096) for _ in range(rng.randint(5, 60))] for _ in range(12)]
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    runs = {}
    for mode in ("recompute", "swap"):
        llm = LLM(device="cuda", dtype="float32", num_kv_blocks=14, max_num_batched_tokens=64,
                  preemption_mode=mode)
        runs[mode] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert llm.stats()["num_preemptions"] > 0
    assert runs["swap"] == runs["recompute"]
