"""Preemption by swap: the host pool that holds a preempted request's KV blocks, and the copies.

When the KV pool runs dry the scheduler preempts a request. Under preemption_mode="recompute"
its blocks are simply freed and its K/V are computed again when it resumes: memory for compute.
Under "swap" its computed blocks are first copied to a pool in host memory (swap_space GiB) and
copied back into fresh device blocks when it resumes: memory for bytes over the host link
(PCIe, NVLink-C2C), and no token is computed twice. When the host pool is full the request is
recomputed instead.

SwapSpace is the host pool's bookkeeping, owned by the scheduler: which host blocks are free
and which wait to be freed, what went out and came back; it writes a swap's copies into the
step's plan (SchedulerOutput.swap_out, swap_in). Under preemption_mode="recompute" the
scheduler holds a pool of no blocks, so every preemption recomputes.
KVSwapper holds the host tensor and makes the copies an engine step asks for. On a GPU the host
pool is pinned and the copies run on a side stream, so they are asynchronous to the host; the
step's kernels wait for them (an event) because they read the blocks swapped in and overwrite
the blocks swapped out. On a CPU the host pool is a second tensor in the same RAM: the copies
are real and cost real bytes of bandwidth, which is what a chapter measures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minillm.request import RequestStatus

if TYPE_CHECKING:
    from minillm.request import Request, SchedulerOutput

GIB = 1 << 30


def num_swap_blocks(swap_space: float, block_bytes: int) -> int:
    """Host blocks in swap_space GiB (whole blocks only)."""
    return int(swap_space * GIB // block_bytes)


class SwapSpace:
    """Which of the host pool's num_blocks blocks are free; counts what went in and out."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.free_blocks = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self.num_swap_outs = 0  # requests swapped out
        self.num_swap_ins = 0  # requests swapped back in
        self.swap_out_blocks = 0  # blocks copied to the host
        self.swap_in_blocks = 0  # blocks copied back
        # Swapped in by the last step: its copies read them, so they are free from the next one.
        self.pending_free: list[int] = []

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def allocate(self, num_blocks: int) -> list[int] | None:
        """num_blocks host blocks, or None (and nothing taken) if the pool has fewer free."""
        if num_blocks > len(self.free_blocks):
            return None
        return [self.free_blocks.pop() for _ in range(num_blocks)]

    def free(self, block_ids: list[int]) -> None:
        self.free_blocks.extend(reversed(block_ids))

    def swap_out(self, req: Request, device_blocks: list[int], out: SchedulerOutput) -> bool:
        """Park req's computed device_blocks in host blocks, in order: the step's plan (out)
        gets the copies, req the host blocks. False (nothing taken) if the pool has too few
        free: req is recomputed instead."""
        host = self.allocate(len(device_blocks)) if device_blocks else None
        if host is None:
            return False
        self.num_swap_outs += 1
        self.swap_out_blocks += len(device_blocks)
        out.swap_out.extend(zip(device_blocks, host))
        out.swapped_out.append(req)
        req.swap_blocks, req.status = host, RequestStatus.SWAPPED
        return True

    def swap_in(self, req: Request, out: SchedulerOutput) -> None:
        """Copy req's host blocks back into the first blocks of its new table (the step's plan
        gets the copies); they are freed by the next step's free_swapped_in, once this step's
        copies have read them."""
        out.swap_in.extend(zip(req.swap_blocks, req.block_table))
        out.swapped_in.append(req)
        self.num_swap_ins += 1
        self.swap_in_blocks += len(req.swap_blocks)
        self.pending_free.extend(req.swap_blocks)
        req.swap_blocks = []

    def release(self, req: Request) -> None:
        """Free the host blocks of req, finished or aborted while swapped out."""
        self.free(req.swap_blocks)
        req.swap_blocks = []

    def stats(self, block_bytes: int) -> dict[str, int]:
        """Its counters as Scheduler.stats() reports them; block_bytes prices the copies."""
        return {"num_swap_outs": self.num_swap_outs, "num_swap_ins": self.num_swap_ins,
                "swap_out_bytes": self.swap_out_blocks * block_bytes,
                "swap_in_bytes": self.swap_in_blocks * block_bytes}

    def free_swapped_in(self) -> None:
        """Free the host blocks the last step swapped in (its copies are made)."""
        if self.pending_free:
            self.free(self.pending_free)
            self.pending_free = []


class KVSwapper:
    """The host copy of the KV pool's layout, and the step's copies to and from it.

    kv_cache is the device pool (L, 2, N, P, K, D); the host pool is (M, L, 2, P, K, D), block
    first, so that each host block is one contiguous piece of (pinned) memory: a device-to-host
    copy of one block is one transfer. Allocated with empty: the OS backs only the pages that
    swapped blocks touch, so a generous swap_space costs nothing until it is used.
    """

    def __init__(self, kv_cache: torch.Tensor, num_blocks: int):
        self.kv_cache = kv_cache
        L, two, _, P, K, D = kv_cache.shape
        on_gpu = kv_cache.device.type == "cuda"
        self.host = torch.empty((num_blocks, L, two, P, K, D), dtype=kv_cache.dtype,
                                pin_memory=on_gpu)
        self.stream = torch.cuda.Stream(kv_cache.device) if on_gpu else None

    def copy(self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        """Copy (device block, host block) pairs out, then (host block, device block) pairs in.

        Out before in: a device block freed by a swap-out may be refilled by a swap-in of the
        same step. (Host blocks freed by a swap-in are reused only from the next step on.)"""
        if not swap_out and not swap_in:
            return
        if self.stream is None:
            self._copy(swap_out, swap_in)
            return
        compute = torch.cuda.current_stream(self.kv_cache.device)
        self.stream.wait_stream(compute)  # the blocks going out hold the last step's K/V
        with torch.cuda.stream(self.stream):
            self._copy(swap_out, swap_in)
        compute.wait_stream(self.stream)  # this step's kernels read and overwrite these blocks

    def _copy(self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        kv, host, non_blocking = self.kv_cache, self.host, self.stream is not None
        if kv.dtype == torch.float8_e4m3fn:
            # A block moves as bytes (its scales are per layer and head, not per block), and
            # index_copy_ has no fp8 kernel on the CPU: copy through same-shape uint8 views.
            kv, host = kv.view(torch.uint8), host.view(torch.uint8)
        if swap_out:
            device_ids = torch.tensor([d for d, _ in swap_out], device=kv.device)
            # Gather the blocks into one contiguous (n, L, 2, P, K, D) buffer on the device,
            # then one transfer per block into the host pool.
            staged = kv.index_select(2, device_ids).permute(2, 0, 1, 3, 4, 5).contiguous()
            for i, (_, h) in enumerate(swap_out):
                host[h].copy_(staged[i], non_blocking=non_blocking)
        if swap_in:
            staged = torch.empty((len(swap_in), *host.shape[1:]), dtype=kv.dtype,
                                 device=kv.device)
            for i, (h, _) in enumerate(swap_in):
                staged[i].copy_(host[h], non_blocking=non_blocking)
            device_ids = torch.tensor([d for _, d in swap_in], device=kv.device)
            kv.index_copy_(2, device_ids, staged.permute(1, 2, 0, 3, 4, 5))
