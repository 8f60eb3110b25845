"""A request's life in the engine: its tokens, its progress, its KV blocks, and what it returns.

Also a step's plan, as the scheduler writes it and the step loop, the model runner and the
trace read it: each request's share of the step (ScheduledRequest) and the step as a whole
(SchedulerOutput: the shares, preemptions, swap copies, why the rest waits).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

import torch

from minillm.metrics import RequestMetrics
from minillm.sampling import SamplingParams

# "error": the request failed on its own (RequestOutput.error says why); others in its steps
# went on. vLLM V1's FinishReason has the same three outcomes (and "abort").
FinishReason = Literal["length", "stop", "error"]

Phase = Literal["prefill", "decode"]
WaitingCause = Literal["seats", "blocks", "budget", "batch"]


class RequestStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"  # preempted by swap: waiting, its K/V in the host pool
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """One prompt being served.

    token_ids holds the prompt followed by the output so far. num_computed_tokens counts the
    tokens whose K and V are in the cache; the scheduler moves it forward, preemption by
    recompute resets it, preemption by swap keeps it (the K/V wait in host blocks, swap_blocks).
    priority: lower is served first under scheduling_policy="priority" (vLLM's convention).
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    prompt: str | None = None
    generator: torch.Generator | None = None
    priority: int = 0
    # False: the caller turns tokens into text and checks stop strings (the front end of an
    # engine core in its own process, minillm.serve.output_processor, as in vLLM V1); the engine
    # then ends the request only at end-of-sequence or max_tokens, and its text stays empty.
    detokenize: bool = True
    token_ids: list[int] = field(init=False)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_prefill_tokens: int = 0  # tokens known at (re)admission: prefill runs until all are in
    block_table: list[int] = field(default_factory=list)
    swap_blocks: list[int] = field(default_factory=list)  # host blocks while swapped out
    # Speculative decoding (minillm.spec): this step's proposed tokens, which follow token_ids
    # in the batch but join them only once accepted, and how many tokens the draft model's own
    # KV cache holds (its proposals are fed back to it; 0 after a preemption).
    spec_token_ids: list[int] = field(default_factory=list)
    num_draft_computed: int = 0
    # Asynchronous scheduling: tokens the device has sampled for this request that the host has
    # not read yet (vLLM's num_output_placeholders). They follow token_ids: the next step feeds
    # the last one to the model from the device, and they count towards max_tokens.
    num_placeholders: int = 0
    finish_reason: FinishReason | None = None
    output_logprobs: list[dict[int, float]] = field(default_factory=list)
    text: str = ""
    error: str | None = None  # why it failed, with finish_reason "error"
    num_cached_tokens: int = 0  # prompt tokens whose K/V the prefix cache gave at admission
    metrics: RequestMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        self.metrics = RequestMetrics(arrival_time=self.arrival_time)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_prefill(self) -> bool:
        """True until every token known at admission has its K and V in the cache."""
        return self.num_computed_tokens < self.num_prefill_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED


@dataclass
class RequestOutput:
    """What generate returns for one prompt (and what stream builds on)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None
    logprobs: list[dict[int, float]] | None
    metrics: RequestMetrics
    finished: bool
    error: str | None = None  # set when finish_reason is "error": what failed
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (OpenAI's usage)

    @classmethod
    def of(cls, req: Request) -> RequestOutput:
        return cls(
            request_id=req.request_id,
            prompt=req.prompt,
            prompt_token_ids=list(req.prompt_token_ids),
            text=req.text,
            token_ids=list(req.output_token_ids),
            finish_reason=req.finish_reason,
            logprobs=list(req.output_logprobs) if req.params.logprobs is not None else None,
            metrics=req.metrics,
            finished=req.is_finished,
            error=req.error,
            num_cached_tokens=req.num_cached_tokens,
        )


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of a step: num_tokens new tokens after num_computed_tokens."""

    request: Request
    num_tokens: int
    num_computed_tokens: int
    phase: Phase


@dataclass
class SchedulerOutput:
    """A step's plan. swap_out: (device block, host block) copies to make before the step runs;
    swap_in: (host block, device block) copies, made after those. waiting_cause: why the
    requests left waiting were not admitted (None when none are left)."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    swapped_out: list[Request] = field(default_factory=list)
    swapped_in: list[Request] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    waiting_cause: WaitingCause | None = None
    ran_dry: bool = False  # a running request found no block: the pool is full
    num_draft_tokens: int = 0  # speculative tokens proposed and checked in the step
    num_accepted_tokens: int = 0  # of those, the ones the target accepted

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    def add(self, req: Request, num_tokens: int) -> None:
        phase: Phase = "prefill" if req.is_prefill else "decode"
        self.scheduled.append(ScheduledRequest(req, num_tokens, req.num_computed_tokens, phase))
