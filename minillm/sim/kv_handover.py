"""The decode side of disaggregated serving: a simulated replica that takes in prompts whose
K/V were computed elsewhere (minillm.disaggregation).

A request's prompt K/V land from a prefill replica; DecodeReplica.land allocates their blocks at
once to a stand-in request (they occupy the pool from then on) and queues the real request,
whose admission then finds those blocks through HandoverBlockManager's prefix lookup, as an
external prefix-cache hit in vLLM's KV connector would.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from minillm.kv_cache import BlockManager, PrefixMatch
from minillm.request import Request, RequestStatus
from minillm.sampling import SamplingParams
from minillm.scheduler import Scheduler
from minillm.sim.simulator import Simulator
from minillm.swap import SwapSpace, num_swap_blocks


class DecodeReplica(Simulator):
    """A Simulator that admits requests whose prompt K/V arrived from elsewhere.

    land() allocates the K/V's blocks to a stand-in request (they take up the pool from then
    on) and queues the real one; at its admission the scheduler's prefix lookup is answered
    with the stand-in's whole blocks, as a prefix-cache hit would be, and after that step the
    stand-in lets go of them, leaving the real request their only holder."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        c = self.config
        assert c.num_kv_blocks is not None
        self.block_manager = HandoverBlockManager(c.num_kv_blocks, c.block_size, False)
        swap_space = (SwapSpace(num_swap_blocks(c.swap_space, self.block_bytes))
                      if c.preemption_mode == "swap" else None)
        self.scheduler = Scheduler(c, self.block_manager, swap_space)
        self.backlog: deque[tuple[int, list[int], int, float]] = deque()  # waiting for blocks
        self.unadmitted: list[tuple[Request, Request]] = []  # (request, stand-in)
        self.num_dropped_handovers = 0

    def land(self, index: int, token_ids: list[int], max_tokens: int, now: float) -> None:
        """The K/V of token_ids[:-1] arrived at now: queue request str(index) to generate
        max_tokens more, or keep it in the backlog until the pool has blocks for them."""
        if not self.scheduler.has_unfinished_requests():  # idle: its clock waits for this one
            self.clock = max(self.clock, now)
        if self.backlog or not self._try_land(index, token_ids, max_tokens, now):
            self.backlog.append((index, token_ids, max_tokens, now))

    def _try_land(self, index: int, token_ids: list[int], max_tokens: int, now: float) -> bool:
        num_kv = len(token_ids) - 1
        stand_in = Request(f"kv-{index}", token_ids[:num_kv], SamplingParams(max_tokens=1), now)
        if not self.block_manager.allocate(stand_in, num_kv):
            return False
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        req = Request(str(index), token_ids, params, now)
        self.block_manager.handed_over[id(req.token_ids)] = stand_in
        self.unadmitted.append((req, stand_in))
        self.scheduler.add_request(req)
        return True

    def step(self) -> list[Request]:
        """Simulator.step, then the stand-ins of requests it admitted let go, and the backlog
        lands while blocks allow."""
        self._unblock()
        finished = super().step()
        if self.unadmitted:
            bm, still = self.block_manager, []
            for req, stand_in in self.unadmitted:
                if req.status is RequestStatus.WAITING:
                    still.append((req, stand_in))
                else:
                    del bm.handed_over[id(req.token_ids)]
                    bm.free(stand_in)
            self.unadmitted = still
        while self.backlog and self._try_land(*self.backlog[0]):
            self.backlog.popleft()
        return finished

    def _unblock(self) -> None:
        """If nothing runs and the head of the queue cannot have the blocks of its first step,
        drop the K/V that landed for requests queued behind it, newest first: they recompute
        their prompts here, as a preempted request does. Without this, K/V that arrived early
        could hold the pool while the request that must go first waits for it forever."""
        sched, bm, c = self.scheduler, self.block_manager, self.config
        if sched.running or not sched.waiting or not self.unadmitted:
            return
        sched.waiting.order()
        head = sched.waiting[0]
        held = ((len(head.token_ids) - 1) // bm.block_size
                if id(head.token_ids) in bm.handed_over else 0)
        num_new = head.num_tokens - held * bm.block_size
        if c.enable_chunked_prefill:
            num_new = min(num_new, c.max_num_batched_tokens)
        need = bm.num_blocks_for(held * bm.block_size + num_new) - held
        while bm.num_free_blocks < need:
            others = [pair for pair in self.unadmitted if pair[0] is not head]
            if not others:
                return
            req, stand_in = others[-1]
            self.unadmitted.remove((req, stand_in))
            del bm.handed_over[id(req.token_ids)]
            bm.free(stand_in)
            self.num_dropped_handovers += 1

    def stats(self) -> dict[str, int]:
        """Simulator.stats, and how many landed K/V were dropped to unblock the queue."""
        return super().stats() | {"kv_handovers_dropped": self.num_dropped_handovers}


class HandoverBlockManager(BlockManager):
    """A BlockManager whose prefix lookup returns, for a request that landed and is not yet
    admitted, the whole blocks its K/V arrived in (handed_over: id of its token_ids -> the
    stand-in request holding them); otherwise the usual lookup (off on a decode replica)."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.handed_over: dict[int, Request] = {}

    def match_prefix(self, token_ids: Sequence[int]) -> PrefixMatch:
        stand_in = self.handed_over.get(id(token_ids))
        if stand_in is None:
            return super().match_prefix(token_ids)
        num_full = (len(token_ids) - 1) // self.block_size  # at least one token to compute
        return PrefixMatch(stand_in.block_table[:num_full], num_full)
