"""All-reduce algorithms beside the ring (minillm.collectives, ParallelConfig.all_reduce): a
two-level all-reduce crosses nodes only between per-node shards, so TP 16 over two HGX nodes
prices near TP 8 where the flat ring at its slowest hop made it 3x slower; NVLink SHARP's
latency does not grow with the group; "auto" takes the fastest; bad names are refused."""

from __future__ import annotations

import dataclasses

import pytest

from minillm.calc import collectives, parallel
from minillm.calc.hardware import HARDWARE, LINKS
from minillm.calc.parallel import ParallelConfig

pytestmark = pytest.mark.ch11

H100 = HARDWARE["H100-SXM"]
NVLINK, IB = LINKS["NVLink 4"], LINKS["InfiniBand NDR"]
MODEL, CONTEXT = "llama-3-70b", 4096


def tpot(tp: int, algorithm: str, batch: int = 1, hw=H100) -> float:
    layout = ParallelConfig(tp, all_reduce=algorithm)
    return parallel.parallel_step_time(MODEL, hw, [(1, CONTEXT)] * batch, layout).time


def test_hierarchical_crosses_nodes_only_between_shards() -> None:
    nbytes = 16 * 2**10  # one token's hidden state of a 70B, bf16: a decode step's message
    flat = collectives.all_reduce_time(nbytes, 16, IB)
    two_level = collectives.hierarchical_all_reduce_time(nbytes, 16, 8, NVLINK, IB)
    # 2 x 7 NVLink steps inside and 2 InfiniBand steps across, against 30 InfiniBand steps
    assert two_level == pytest.approx(14 * NVLINK.latency + 2 * IB.latency, rel=0.01)
    assert flat > 5 * two_level
    # inside one node it is the ring itself
    assert collectives.hierarchical_all_reduce_time(nbytes, 8, 8, NVLINK, IB) == \
        pytest.approx(collectives.all_reduce_time(nbytes, 8, NVLINK))


def test_tp16_over_two_nodes_is_about_tp8_with_a_two_level_all_reduce() -> None:
    for batch in (1, 64):
        assert tpot(16, "ring", batch) > 2.5 * tpot(8, "ring", batch)  # the flat ring
        assert tpot(16, "hierarchical", batch) == pytest.approx(tpot(8, "ring", batch), rel=0.15)
        # with NCCL's pick on both, the nodes' link still costs: TP 16 is slower than TP 8
        assert tpot(16, "auto", batch) > 1.1 * tpot(8, "auto", batch)


def test_nvls_latency_does_not_grow_with_the_group() -> None:
    small = 16 * 2**10
    ring = [collectives.all_reduce_time(small, n, NVLINK) for n in (8, 16)]
    nvls = [collectives.nvls_all_reduce_time(small, n, NVLINK) for n in (8, 16)]
    assert ring[1] > 2 * ring[0] and nvls[1] == pytest.approx(nvls[0], rel=0.01)
    assert nvls[0] < ring[0] / 5
    # on a 16-GPU NVLink domain TP 16 then pays off; the ring's latency had capped it
    domain = dataclasses.replace(H100, name="16 on NVLink", gpus_per_node=16)
    assert tpot(16, "ring", hw=domain) > 0.95 * tpot(8, "ring")
    assert tpot(16, "nvls", hw=domain) < 0.6 * tpot(8, "nvls")


def test_auto_is_the_fastest_the_group_can_run() -> None:
    for nbytes in (2**10, 2**20, 2**30):
        one_node = [collectives.group_all_reduce_time(nbytes, 8, 8, NVLINK, IB, a)
                    for a in ("ring", "nvls", "auto")]
        assert one_node[2] == min(one_node[:2])
        two_nodes = [collectives.group_all_reduce_time(nbytes, 16, 8, NVLINK, IB, a)
                     for a in ("ring", "hierarchical", "auto")]
        assert two_nodes[2] == min(two_nodes[:2])
    # A100's NVSwitch does not reduce: auto is the ring there
    nvlink3 = LINKS["NVLink 3"]
    assert collectives.group_all_reduce_time(2**20, 8, 8, nvlink3, IB, "auto") == \
        collectives.all_reduce_time(2**20, 8, nvlink3)


@pytest.mark.parametrize(("call", "match"), [
    (lambda: ParallelConfig(8, all_reduce="tree"), "all_reduce must be one of"),
    (lambda: collectives.nvls_all_reduce_time(1e6, 8, LINKS["NVLink 3"]),
     "no in-switch reduction"),
    (lambda: collectives.group_all_reduce_time(1e6, 16, 8, NVLINK, IB, "nvls"),
     "spans nodes"),
    (lambda: collectives.hierarchical_all_reduce_time(1e6, 12, 8, NVLINK, IB),
     "does not fill nodes"),
])
def test_bad_algorithms_are_named(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()
