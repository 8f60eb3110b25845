"""What crossing a link costs: all-reduce (ring, two-level, NVLink SHARP) and gather,
point-to-point sends, and the bubbles of a pipeline. minillm.parallel prices a TP x PP step
with them.

Links are minillm.hardware.Link: bytes/s one way per GPU and a latency per ring step. Every
algorithm runs at the link's peak, an optimism stated in minillm.parallel. NCCL chooses among
its all-reduce algorithms per call by message size and topology (NCCL_ALGO: Ring, Tree,
CollNetDirect, CollNetChain, NVLS since 2.17, NVLSTree since 2.18); ALL_REDUCE_ALGORITHMS are
the three modelled here, and "auto" takes the fastest of those the group can use, as NCCL's
tuner does from its own cost model.
"""

from __future__ import annotations

from collections.abc import Sequence

from minillm.calc.hardware import Link

ALL_REDUCE_ALGORITHMS = ("ring", "hierarchical", "nvls", "auto")

# NVLink SHARP's bandwidth over the ring's, as NCCL's maintainer gives it for 8 H100 SXM
# (nccl-tests issue 212, 2024): ~480 GB/s bus bandwidth with NVLS against ~370 GB/s with
# NCCL_ALGO=RING. The model keeps the ratio, not the figures (its ring runs at the peak).
NVLS_SPEEDUP = 480 / 370


def all_reduce_time(nbytes: float, n: int, link: Link) -> float:
    """Seconds of a ring all-reduce of nbytes over n GPUs: a reduce-scatter and an all-gather,
    each n - 1 steps moving nbytes / n per GPU, so 2 (n - 1) / n * nbytes / bandwidth +
    2 (n - 1) * latency. 0 for n = 1. NCCL's bus bandwidth (nccl-tests, doc/PERFORMANCE.md) is
    this 2 (n - 1) / n * nbytes / time, the link's speed whatever n."""
    _check(nbytes, n)
    steps = 2 * (n - 1)
    return steps / n * nbytes / link.bandwidth + steps * link.latency if n > 1 else 0.0


def hierarchical_all_reduce_time(nbytes: float, n: int, gpus_per_node: int, intra: Link,
                                 inter: Link) -> float:
    """Seconds of a two-level all-reduce of nbytes over n GPUs filling nodes of gpus_per_node:
    a ring reduce-scatter inside each node (each GPU then holds the node's sum of one g-th of
    the message, g = GPUs of the group per node), a ring all-reduce of that g-th across the
    n / g nodes (g of them at once, each GPU on its own NIC), and a ring all-gather inside the
    node. Only 2 (n / g - 1) steps cross the slow link, against the flat ring's 2 (n - 1) at
    its slowest hop. Within one node it is the ring."""
    _check(nbytes, n)
    if not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be a positive int, got {gpus_per_node!r}")
    g = min(n, gpus_per_node)
    if n % g:
        raise ValueError(f"a group of n={n} GPUs does not fill nodes of {gpus_per_node}: "
                         "pick n that is a multiple of gpus_per_node, or at most it")
    nodes = n // g
    inside = (g - 1) / g * nbytes / intra.bandwidth + (g - 1) * intra.latency
    across = all_reduce_time(nbytes / g, nodes, inter)
    return 2 * inside + across


def nvls_all_reduce_time(nbytes: float, n: int, link: Link) -> float:
    """Seconds of an NVLink SHARP (NVLS) all-reduce of nbytes over n GPUs of one NVLink domain:
    the NVSwitch sums what the GPUs send and multicasts the sum back, so the latency is one
    trip to the switch and back (2 link latencies) whatever n, and the bandwidth term is the
    ring's divided by NVLS_SPEEDUP. 0 for n = 1. Needs a switch that reduces
    (link.in_switch_reduction: NVSwitch 3 of HGX H100 / H200)."""
    _check(nbytes, n)
    if not link.in_switch_reduction:
        raise ValueError(f"{link.name} has no in-switch reduction, so NVLS cannot run on it; "
                         "use all_reduce='ring' or 'hierarchical' (NVLS needs NVLink 4 with "
                         "NVSwitch, e.g. H100-SXM)")
    if n == 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / (link.bandwidth * NVLS_SPEEDUP) + 2 * link.latency


def group_all_reduce_time(nbytes: float, n: int, gpus_per_node: int, intra: Link, inter: Link,
                          algorithm: str = "ring") -> float:
    """Seconds of an all-reduce of nbytes over a group of n GPUs that fill nodes of
    gpus_per_node (joined by intra inside a node, inter between nodes) with algorithm, one of
    ALL_REDUCE_ALGORITHMS: "ring", one ring over all n, at the pace of its slowest hop (inter
    once the group spans nodes); "hierarchical" (hierarchical_all_reduce_time); "nvls"
    (nvls_all_reduce_time, one NVLink domain only); "auto", the fastest of those the group
    can run for this message."""
    if algorithm not in ALL_REDUCE_ALGORITHMS:
        raise ValueError(f"all_reduce must be one of {ALL_REDUCE_ALGORITHMS}, got {algorithm!r}")
    one_node = n <= gpus_per_node
    if algorithm == "ring":
        return all_reduce_time(nbytes, n, intra if one_node else inter)
    if algorithm == "hierarchical":
        return hierarchical_all_reduce_time(nbytes, n, gpus_per_node, intra, inter)
    if algorithm == "nvls":
        if not one_node:
            raise ValueError(f"NVLS reduces inside one NVLink domain of {gpus_per_node} GPUs; "
                             f"a group of {n} spans nodes: use all_reduce='hierarchical' or "
                             "'auto'")
        return nvls_all_reduce_time(nbytes, n, intra)
    candidates = [all_reduce_time(nbytes, n, intra if one_node else inter)]
    if not one_node and n % gpus_per_node == 0:
        candidates.append(hierarchical_all_reduce_time(nbytes, n, gpus_per_node, intra, inter))
    if one_node and intra.in_switch_reduction:
        candidates.append(nvls_all_reduce_time(nbytes, n, intra))
    return min(candidates)


def _check(nbytes: float, n: int) -> None:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int (GPUs in the group), got {n!r}")
    if not nbytes >= 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")


def bus_bandwidth(nbytes: float, n: int, seconds: float) -> float:
    """NCCL's all-reduce bus bandwidth, bytes/s: 2 (n - 1) / n * nbytes / seconds, the figure
    nccl-tests prints as busbw and comparable across group sizes."""
    return 2 * (n - 1) / n * nbytes / seconds


def send_time(nbytes: float, link: Link) -> float:
    """Seconds to send nbytes from one GPU to another over link: nbytes / bandwidth + latency."""
    return nbytes / link.bandwidth + link.latency


def gather_time(nbytes: float, n: int, link: Link) -> float:
    """A ring gather of nbytes in n shards: (n - 1) / n * nbytes / bandwidth + (n - 1) steps."""
    return (n - 1) / n * nbytes / link.bandwidth + (n - 1) * link.latency


def bubble_fraction(pipeline_parallel_size: int, micro_batches: int) -> float:
    """The idle share of a GPipe pipeline of p equal stages fed m micro-batches:
    (p - 1) / (m + p - 1) (Huang et al. 2019, GPipe, section 2.2)."""
    return (pipeline_parallel_size - 1) / (micro_batches + pipeline_parallel_size - 1)


def pipeline_time(stage_times: Sequence[float], micro_batches: int) -> float:
    """Seconds for m micro-batches to pass stages that take stage_times each per micro-batch:
    sum(stage_times) + (m - 1) * max(stage_times), the first through every stage and then one
    out per slowest stage. Equal stages t: (m + p - 1) t, GPipe's."""
    if not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches must be a positive int, got {micro_batches!r}")
    return sum(stage_times) + (micro_batches - 1) * max(stage_times)
