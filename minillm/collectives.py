"""What crossing a link costs: ring all-reduce and gather, point-to-point sends, and the bubbles
of a pipeline. minillm.parallel prices a TP x PP step with them.

Links are minillm.hardware.Link: bytes/s one way per GPU and a latency per ring step. The ring
runs at the link's peak, an optimism stated in minillm.parallel.
"""

from __future__ import annotations

from collections.abc import Sequence

from minillm.hardware import Link


def all_reduce_time(nbytes: float, n: int, link: Link) -> float:
    """Seconds of a ring all-reduce of nbytes over n GPUs: a reduce-scatter and an all-gather,
    each n - 1 steps moving nbytes / n per GPU, so 2 (n - 1) / n * nbytes / bandwidth +
    2 (n - 1) * latency. 0 for n = 1. NCCL's bus bandwidth (nccl-tests, doc/PERFORMANCE.md) is
    this 2 (n - 1) / n * nbytes / time, the link's speed whatever n."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int (GPUs in the group), got {n!r}")
    if not nbytes >= 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    steps = 2 * (n - 1)
    return steps / n * nbytes / link.bandwidth + steps * link.latency if n > 1 else 0.0


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
