"""The engine: requests in, steps of the model, outputs out.

Each step is minillm.step_loop's (schedule, advance, stops, metrics, trace: the bookkeeping
the simulator shares); the engine executes it by running the model and sampling. The device
side (weights, K/V pool, graphs, the step's tensors) is the model runner's
(minillm.model_runner); the engine holds the requests and the scheduler, and decides."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from minillm.batch import Batch
from minillm.config import TRACE_BLOCKS_MAX_POOL, EngineConfig
from minillm.input_processor import InputProcessor
from minillm.kv_cache import BlockManager
from minillm.model import LlamaForCausalLM
from minillm.model_runner import InFlight, ModelRunner
from minillm.request import Request, RequestOutput, ScheduledRequest, SchedulerOutput
from minillm.sampling import Sampler, SamplingParams, mask_eos_before_min_tokens
from minillm.scheduler import Scheduler
from minillm.spec.decoder import SpeculativeDecoder
from minillm.step_loop import Executed, Logprobs, StepLoop
from minillm.swap import SwapSpace
from minillm.tokenizer import IncrementalDetokenizer, find_stop

log = logging.getLogger(__name__)


class Engine(StepLoop):
    """Owns the scheduler, every request in flight and the model runner that runs their steps.

    config must be resolved: num_kv_blocks and max_model_len set (LLM does that). draft_model:
    the loaded draft under speculative_config's "draft_model" method.
    """

    def __init__(self, model: LlamaForCausalLM, tokenizer: Any, config: EngineConfig,
                 clock: Callable[[], float] = time.perf_counter,
                 draft_model: LlamaForCausalLM | None = None):
        assert config.num_kv_blocks is not None and config.max_model_len is not None
        self.model, self.tokenizer, self.config, self.clock = model, tokenizer, config, clock
        self.device = model.lm_head.weight.device
        self.runner = ModelRunner(model, tokenizer, config)
        block_manager = BlockManager(config.num_kv_blocks, config.block_size,
                                     config.enable_prefix_caching, config.prefix_caching)
        swap_space = SwapSpace(self.runner.num_swap_blocks)  # no blocks without swap preemption
        super().__init__(config, block_manager, Scheduler(config, block_manager, swap_space),
                         trace_block_tables=(config.trace_block_tables
                                             if config.trace_block_tables is not None else
                                             config.num_kv_blocks <= TRACE_BLOCKS_MAX_POOL),
                         speculative=config.speculative_config is not None)
        self.spec = None if config.speculative_config is None else SpeculativeDecoder.build(
            config.speculative_config, model, draft_model, config.num_kv_blocks,
            config.block_size, config.attention_backend)
        self.sampler = Sampler()
        self.requests: dict[str, Request] = {}
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
        self.eos_token_ids = self._eos_token_ids()
        self.processor = InputProcessor(tokenizer, config, model.config.vocab_size)
        self._counter = itertools.count()
        # Set while a server's thread drives the engine (minillm.serve): no other thread may
        # queue, step or abort, or two loops would share one scheduler.
        self.owner_thread: int | None = None

    def _check_thread(self) -> None:
        if self.owner_thread is not None and threading.get_ident() != self.owner_thread:
            raise RuntimeError("this engine is being served over HTTP (minillm.serve): send it "
                               "requests through the server, or make another LLM for "
                               "in-process runs")

    def _eos_token_ids(self) -> set[int]:
        eos = self.model.config.eos_token_id
        ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    # ---- requests in -------------------------------------------------------------------------

    def add_request(self, prompt: str | list[int], params: SamplingParams,
                    request_id: str | None = None, arrival_time: float | None = None,
                    priority: int = 0) -> str:
        """Validate and queue one request; nothing changes if it is rejected."""
        req = self.make_request(prompt, params, request_id, arrival_time, priority)
        self.enqueue(req)
        return req.request_id

    def make_request(self, prompt: str | list[int], params: SamplingParams,
                     request_id: str | None = None, arrival_time: float | None = None,
                     priority: int = 0, detokenize: bool = True) -> Request:
        """A validated Request, not yet queued. Raises ValueError naming any bad value.

        priority: lower is served first under scheduling_policy="priority" (ignored otherwise).
        detokenize: False leaves the text and stop strings to the caller (Request.detokenize).
        """
        self.processor.check_priority(priority)
        index = next(self._counter)  # taken by a refused request too: later seeds do not shift
        request_id = str(index) if request_id is None else request_id
        if not isinstance(request_id, str):
            raise ValueError(f"request_id must be a str, got {request_id!r:.80}")
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        token_ids = self.processor.process(prompt, params, priority)
        generator = None
        if params.temperature > 0:
            seed = params.seed if params.seed is not None else self.config.seed * 1_000_003 + index
            generator = torch.Generator(self.device).manual_seed(seed)
        return Request(request_id, token_ids, params,
                       self.clock() if arrival_time is None else arrival_time,
                       prompt=prompt if isinstance(prompt, str) else None, generator=generator,
                       priority=priority, detokenize=detokenize)

    def enqueue(self, req: Request) -> None:
        self._check_thread()
        self.requests[req.request_id] = req
        if req.detokenize:
            self.detokenizers[req.request_id] = IncrementalDetokenizer(self.tokenizer,
                                                                       req.prompt_token_ids)
        self.scheduler.add_request(req)

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        """A prompt's token ids, checked: non-empty, valid text, ids inside the vocabulary."""
        return self.processor.tokenize(prompt)

    def abort_request(self, request_id: str) -> None:
        """Drop an unfinished request and free its blocks."""
        self._check_thread()
        if request_id not in self.requests:
            raise ValueError(f"no unfinished request with request_id {request_id!r}")
        self._retire(self.requests[request_id])

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # ---- one step ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one step; return an output for every request that produced a token in it."""
        self._check_thread()
        return [RequestOutput.of(req) for req in self.run_step()[0]]

    # ---- the step loop's executor: the model ---------------------------------------------------

    def now(self) -> float:
        return self.clock()

    def move_blocks(self, out: SchedulerOutput, copies: list[tuple[int, int]]) -> None:
        self.runner.move_blocks(out.swap_out, copies, out.swap_in)

    def execute(self, out: SchedulerOutput) -> Executed:
        """The model's forward over the step and its sampling."""
        return self.read(self.launch(out, None))

    def launch(self, out: SchedulerOutput,  # type: ignore[override]
               previous: InFlight | None) -> InFlight:
        """Queue the step's forward and sampling on the device, reading nothing back (but
        speculative decoding's verification); placeholders take previous's tokens there."""
        if self.spec is not None:  # decodes get their proposals; entries shrink to fit them
            self.spec.propose(out)
        batch = self.runner.prepare(out.scheduled, previous)
        hidden = self.runner.forward(batch)
        return self._sample(batch, hidden, out)

    def _sample(self, batch: Batch, hidden: torch.Tensor, out: SchedulerOutput) -> InFlight:
        """Each sampled request's new tokens (one, or under speculative decoding its accepted
        proposals and one more) and logprobs. A failure of the batched call is retried one
        request at a time, so it ends only the request that caused it (a seeded bystander's
        draw in that one step may then differ from a run without the failure)."""
        if not batch.sampled:  # every request in the step is mid-prefill
            return InFlight([], done=Executed([], []))
        logits = self.runner.logits(hidden, batch)  # (S, V)
        # Row j of a request predicts its output j, counting those still being sampled.
        logits = mask_eos_before_min_tokens(logits, self.eos_token_ids, [
            (s.request.params.min_tokens - s.request.num_output_tokens
             - s.request.num_placeholders, 1 + len(s.request.spec_token_ids))
            for s in batch.sampled])
        try:
            if self.spec is None:
                return InFlight(batch.sampled, self.sampler.launch(
                    logits, [s.request.params for s in batch.sampled],
                    [s.request.generator for s in batch.sampled]))
            return InFlight(batch.sampled, done=Executed(
                batch.sampled, *self._sample_rows(logits, batch.sampled, out)))
        except Exception:
            log.warning("sampling a batch of %d failed: sampling each request alone",
                        len(batch.sampled), exc_info=True)
        emitted: list[list[int]] = []
        logprobs: list[list[Logprobs]] = []
        failed: dict[str, str] = {}
        first = 0
        for s in batch.sampled:
            rows = 1 + len(s.request.spec_token_ids)  # its sample rows, in order
            try:
                tokens, lps = self._sample_rows(logits[first:first + rows], [s], out)
            except Exception as e:
                failed[s.request.request_id] = f"sampling failed: {type(e).__name__}: {e}"
                tokens, lps = [[]], [[]]
            emitted += tokens
            logprobs += lps
            first += rows
        return InFlight(batch.sampled, done=Executed(batch.sampled, emitted, logprobs, failed))

    def _sample_rows(self, logits: torch.Tensor, sampled: list[ScheduledRequest],
                     out: SchedulerOutput
                     ) -> tuple[list[list[int]], list[list[Logprobs]]]:
        """Sample the rows of logits (1 + proposals per request in sampled, in order)."""
        params = [s.request.params for s in sampled]
        if self.spec is None:
            result = self.sampler(logits, params, [s.request.generator for s in sampled])
            return [[t] for t in result.token_ids], [[lp] for lp in result.logprobs]
        emitted = self.spec.verify(logits, sampled, out)
        return emitted, self.spec.logprobs(logits, sampled, emitted)

    def _retire(self, req: Request) -> None:
        """Free a finished, failed or aborted request's blocks and forget it."""
        super()._retire(req)
        del self.requests[req.request_id]
        self.detokenizers.pop(req.request_id, None)

    def stops(self, req: Request, token: int) -> bool:
        """Detokenize the new token; past min_tokens, a stop string it completes or an
        end-of-sequence token (unless ignore_eos) ends the request. A request whose caller
        detokenizes (Request.detokenize False) is ended here by end-of-sequence alone."""
        if req.detokenize:
            old_len = len(req.text)
            req.text += self.detokenizers[req.request_id].step(req.token_ids)
        if req.num_output_tokens < req.params.min_tokens:
            return False
        if req.detokenize:
            cut = find_stop(req.text, old_len, req.params.stop_strings)
            if cut is not None:
                req.text = req.text[:cut]
                return True
        return token in self.eos_token_ids and not req.params.ignore_eos

    def stats(self) -> dict[str, int]:
        stats = self.scheduler.stats(self.runner.block_bytes)
        if self.spec is not None:
            stats |= self.spec.stats()
        return stats
