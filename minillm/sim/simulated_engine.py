"""The simulated engine: the engine's own step loop, Scheduler and BlockManager on a virtual
clock, no model.

Each step is minillm.step_loop's, the code Engine.step runs (schedule, advance
num_computed_tokens, register full blocks in the prefix cache, append a token for every request
whose known tokens are all computed, stop at max_tokens, record metrics and a StepRecord); only
its executor differs: instead of running a forward pass it moves the clock on by
roofline.step_time of the step's batch, as Vidur (MLSys '24) does with profiled kernels. The
scheduling decisions are therefore exactly the engine's, and an H100-scale deployment of
Llama-3-8B runs on a laptop CPU in seconds.

Sampled tokens are fake but deterministic: a function of the request's tokens so far, like a
model, so the prefix cache and recompute after preemption behave as in the engine.
Under speculative decoding a seeded draw stands in for the model that accepts or rejects each
decode's proposals (minillm.spec.simulate), and the step pays for verifying them and drafting.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Sequence

from minillm.calc import parallel, roofline
from minillm.config import TRACE_BLOCKS_MAX_POOL, EngineConfig
from minillm.kv_cache import BlockManager
from minillm.model_config import ModelConfig
from minillm.request import Request, ScheduledRequest, SchedulerOutput
from minillm.sampling import SamplingParams
from minillm.scheduler import Scheduler
from minillm.sim.pricing import Pricing
from minillm.sim.simulated_pool import block_bytes
from minillm.spec.cost import with_verified_rows
from minillm.spec.simulate import SimulatedSpeculation, is_speculative
from minillm.step_loop import Executed, StepLoop
from minillm.swap import SwapSpace, num_swap_blocks
from minillm.workloads.streams import Arrivals, RequestSpec, Workload


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """The garbage collector off inside, as it was after: a simulation makes millions of small
    objects and no cycles, so collections would only rescan them."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Simulator(StepLoop):
    """The engine's step loop around a real Scheduler and BlockManager, on a virtual clock."""

    def __init__(self, model: ModelConfig, hw: roofline.Hardware, config: EngineConfig,
                 pricing: Pricing | None = None, record_block_tables: bool = True, *,
                 speculation: SimulatedSpeculation | None = None,
                 layout: parallel.ParallelConfig | None = None):
        """pricing: how its steps, pool and swaps are priced (minillm.sim.pricing; default: the
        roofline at 2 bytes a number, no overheads). layout: the TP x PP GPUs it runs on."""
        assert config.num_kv_blocks is not None and config.max_model_len is not None
        if (config.speculative_config is None) != (speculation is None):
            raise ValueError("speculative decoding needs both config.speculative_config and "
                             "speculation=SimulatedSpeculation(acceptance_rate, draft), or "
                             "neither (simulate builds it from acceptance_rate=)")
        self.model, self.hw, self.config = model, hw, config
        self.pricing = pricing = pricing or Pricing()
        layout = layout or parallel.ParallelConfig()
        self.dtype_bytes, self.step_kwargs = pricing.dtype_bytes, pricing.step_kwargs()
        self._overhead_args = pricing.overheads.as_tuple()  # passed on every step, unpacked once
        self.record_block_tables = record_block_tables
        self.step_time = pricing.timer(layout)  # virtual engines replace it (minillm.sim)
        self.speculation = speculation
        block_manager = BlockManager(config.num_kv_blocks, config.block_size,
                                     config.enable_prefix_caching, config.prefix_caching)
        # Bytes of a block on one GPU: each swaps its own shard over its own host link.
        self.block_bytes = (block_bytes(model, config.block_size, pricing.dtype_bytes,
                                        pricing.kv_dtype_bytes,
                                        speculation.draft if speculation else None)
                            if layout.world_size == 1 else
                            parallel.kv_block_bytes_per_gpu(model, layout, config.block_size,
                                                            pricing.kv_bytes))
        swap_space = (SwapSpace(num_swap_blocks(config.swap_space, self.block_bytes))
                      if config.preemption_mode == "swap" else None)
        # The prefix cache's snapshot only for pools up to TRACE_BLOCKS_MAX_POOL blocks (the
        # engine's default rule): a GPU-sized cache's every step would cost more than the run.
        super().__init__(config, block_manager, Scheduler(config, block_manager, swap_space),
                         trace_block_tables=record_block_tables,
                         trace_prefix_cache=(record_block_tables and
                                             config.num_kv_blocks <= TRACE_BLOCKS_MAX_POOL),
                         speculative=speculation is not None)
        self.clock = 0.0  # seconds since the start of the run

    def run(self, workload: Workload | Sequence[RequestSpec]) -> list[Request]:
        """Serve every request to completion; the Requests come back in workload order."""
        for index, spec in enumerate(workload):
            self.check_fits(index, spec)
        requests = self._serve(Arrivals(workload))
        bm = self.block_manager
        if not all(r.is_finished for r in requests) or bm.num_free_blocks != bm.num_blocks:
            raise RuntimeError(f"a request or a KV block was lost: {self.stats()}")
        return requests

    def _serve(self, arrivals: Arrivals) -> list[Request]:
        """Requests join the queue at the first step boundary at or after they are sent; an idle
        engine's clock jumps to the next one."""
        workload, sched = arrivals.workload, self.scheduler
        requests: list[Request | None] = [None] * len(workload)
        while arrivals or sched.has_unfinished_requests():
            while arrivals and arrivals.next_time() <= self.clock:
                sent, i = arrivals.pop()
                requests[i] = self.add_request(i, workload[i], sent)
            if not sched.has_unfinished_requests():
                self.clock = max(self.clock, arrivals.next_time())
                continue
            for _ in self.step():
                arrivals.finished(self.clock)
        return requests  # type: ignore[return-value]

    def check_fits(self, index: int, spec: RequestSpec) -> None:
        """What InputProcessor.check_fits rejects, rejected up front, naming the request."""
        c, n, out = self.config, spec.prompt_len, spec.output_len
        assert c.max_model_len is not None and c.num_kv_blocks is not None
        where = f"request {index} of the workload"
        if n + out > c.max_model_len:
            raise ValueError(f"{where}: prompt_len={n} plus output_len={out} exceeds "
                             f"max_model_len={c.max_model_len}; raise max_model_len")
        if not c.enable_chunked_prefill and n > c.max_num_batched_tokens:
            raise ValueError(f"{where}: prompt_len={n} exceeds max_num_batched_tokens="
                             f"{c.max_num_batched_tokens} and chunked prefill is off")
        needed = self.block_manager.num_blocks_for(n + out)
        if needed > c.num_kv_blocks:
            raise ValueError(f"{where} needs {needed} KV blocks but the pool has "
                             f"num_kv_blocks={c.num_kv_blocks}; enlarge the pool")

    def add_request(self, index: int, spec: RequestSpec, arrival_time: float) -> Request:
        """Queue the spec as request str(index), which is the id LLM.generate would give it."""
        params = SamplingParams(max_tokens=spec.output_len, temperature=0.0, ignore_eos=True)
        # Only the prefix cache reads token values; without it, skip drawing them (placeholders).
        prompt = (spec.token_ids(self.model.vocab_size) if self.config.enable_prefix_caching
                  else [1] * spec.prompt_len)
        req = Request(str(index), prompt, params, arrival_time, priority=spec.priority)
        self.scheduler.add_request(req)
        return req

    def step(self) -> list[Request]:
        """One engine step on the virtual clock; returns the requests that finished in it."""
        return self.run_step()[1]

    # ---- the step loop's executor: a priced step ----------------------------------------------

    def now(self) -> float:
        return self.clock

    def move_blocks(self, out: SchedulerOutput, copies: list[tuple[int, int]]) -> None:
        """Swapped blocks cross the host link before the step's kernels may run (minillm.swap).
        Copy-on-write copies stay on the device, a block each: not priced."""
        self.clock += (len(out.swap_out) + len(out.swap_in)) * self.block_bytes / self.hw.host_link

    def execute(self, out: SchedulerOutput) -> Executed:
        """Move the clock on by the step's price; every request whose known tokens are all
        computed gets stand-in tokens (a speculative decode: its accepted proposals and one)."""
        scheduled = out.scheduled
        batch = [(s.num_tokens, s.num_computed_tokens + s.num_tokens) for s in scheduled]
        self.clock += self._price(self.model, batch, scheduled)
        sampled, tokens = [], []
        for s in scheduled:
            req = s.request
            if is_speculative(s):
                emitted = 1 + self._accept(s, out)
            elif s.num_computed_tokens + s.num_tokens == len(req.token_ids):
                emitted = 1
            else:
                continue  # mid-prefill
            sampled.append(s)
            tokens.append(self._stand_in_tokens(req.token_ids, emitted))
        return Executed(sampled, tokens)

    def _price(self, model: ModelConfig, batch: list[tuple[int, int]],
                scheduled: Sequence[ScheduledRequest] = ()) -> float:
        """Seconds of one forward of model over batch by the cost model; given the step's
        scheduled requests, the target's forward also computes logits at every proposed token,
        and a draft model's forwards come before it (minillm.spec.simulate)."""
        cost = self.step_time(model, self.hw, batch, self.dtype_bytes, *self._overhead_args,
                              **self.step_kwargs)
        if self.speculation is None or not scheduled:
            return cost.time
        proposed = sum(s.num_tokens - 1 for s in scheduled if is_speculative(s))
        return (with_verified_rows(cost, model, self.hw, proposed).time
                + self.speculation.draft_time(scheduled, self._price))

    def _accept(self, s: ScheduledRequest, out: SchedulerOutput) -> int:
        """How many of a speculative decode's num_tokens - 1 proposals are accepted (drawn);
        the proposals sit in spec_token_ids as the engine's do, for the step loop to count."""
        assert self.speculation is not None  # Simulator.__init__ checks it
        proposed = s.num_tokens - 1
        accepted = self.speculation.accept(proposed)
        out.num_draft_tokens += proposed
        out.num_accepted_tokens += accepted
        s.request.spec_token_ids = [0] * proposed  # their values are never read
        return accepted

    def _stand_in_tokens(self, token_ids: list[int], n: int) -> list[int]:
        """n fake tokens after token_ids, each a function of the sequence so far like a model's,
        so the prefix cache and recompute after preemption behave as in the engine."""
        length, vocab = len(token_ids), self.model.vocab_size
        if n == 1:  # the usual case, kept quick: a simulation appends millions
            return [(token_ids[-1] * 31 + length) % vocab]
        tokens, last = [], token_ids[-1]
        for _ in range(n):
            last = (last * 31 + length) % vocab
            tokens.append(last)
            length += 1
        return tokens

    def stats(self) -> dict[str, int]:
        """The same counters as LLM.stats(); spec_decode_* too under speculative decoding."""
        stats = self.scheduler.stats(self.block_bytes)
        return stats if self.speculation is None else stats | self.speculation.stats()
