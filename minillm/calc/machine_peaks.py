"""This machine's achieved peaks, measured: a square matmul for FLOP/s, a large copy for bytes/s.

measure_machine returns them as a roofline Hardware, so every calculator and the simulator can
price a step on the reader's own machine beside a datasheet GPU (minillm.roofline re-exports
it). The fastest of repeated runs is kept: it is the one least disturbed by whatever else the
machine is doing.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from minillm.calc.hardware import Hardware

if TYPE_CHECKING:
    import torch


def _best_seconds(fn: Callable[[], object], sync: Callable[[], None], budget: float) -> float:
    """The fastest of repeated runs of fn within `budget` seconds (after one warm-up run)."""
    fn()
    sync()
    best, deadline = math.inf, time.perf_counter() + budget
    while time.perf_counter() < deadline or best == math.inf:
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_flops(dev: torch.device, seconds: float) -> float:
    """Achieved FLOP/s of a square matmul, 2 * n^3 FLOPs, in the engine's dtype on this device
    (minillm.device: fp32 on a CPU, bf16 from sm_80, fp16 on a T4; a GPU's 16-bit type during
    the GPU-shaped run, whose CPU matmuls in bf16 are far slower than in fp32)."""
    import torch

    from minillm.device import capabilities

    dtype = capabilities(dev).dtype
    n = 8192 if dev.type == "cuda" else 1024
    x, weight = (torch.randn(n, n, device=dev, dtype=dtype) for _ in range(2))
    # F.linear, x @ weight.T, as every nn.Linear of the model runs: on a CPU in bf16 the plain
    # x @ weight layout falls to a kernel some 30x slower, which is no peak of the engine's.
    return 2 * n**3 / _best_seconds(lambda: torch.nn.functional.linear(x, weight), _sync(dev),
                                    seconds)


def copy_bandwidth(dev: torch.device, seconds: float) -> float:
    """Achieved bytes/s of a tensor copy, counting the bytes read and the bytes written."""
    import torch

    numel = 2**28 if dev.type == "cuda" else 2**24  # 1 GiB / 64 MiB of fp32: past the caches
    src = torch.ones(numel, device=dev)
    dst = torch.empty_like(src)
    return 2 * src.nbytes / _best_seconds(lambda: dst.copy_(src), _sync(dev), seconds)


def _sync(dev: torch.device) -> Callable[[], None]:
    import torch

    return (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)


def measure_machine(device: str | None = None, seconds: float = 1.0) -> Hardware:
    """This machine's achieved peaks as a Hardware, from two microbenchmarks of seconds / 2
    each: flops from a square matmul (fp32 on CPU, bf16 on CUDA), bandwidth from a large tensor
    copy (bytes read + bytes written per second); memory: RAM or GPU memory, bytes. Measured
    with torch's current thread count; nothing here is a datasheet peak."""
    import torch

    if not seconds > 0:
        raise ValueError(f"seconds must be positive, got {seconds!r}")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    flops = matmul_flops(dev, seconds / 2)
    bandwidth = copy_bandwidth(dev, seconds / 2)
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        return Hardware(f"this machine (cuda: {props.name})", flops, bandwidth,
                        props.total_memory)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    # A CPU's "host pool" is the same RAM: a swap is a copy at the copy bandwidth, one way.
    return Hardware(f"this machine ({dev.type})", flops, bandwidth, ram, host_link=bandwidth / 2)
