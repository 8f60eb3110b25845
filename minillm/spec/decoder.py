"""Speculative decoding inside a step: propose before the forward, verify after it.

The scheduler has already reserved 1 + k tokens (budget and KV slots) for each decode
(Scheduler._num_decode_tokens). Here each such request gets up to k proposals (prompt lookup or
the draft model) in request.spec_token_ids, and its entry shrinks to 1 + what was proposed. The
target then runs one forward over every request's rows - prefill chunks, plain decodes and
[last token, d_1..d_k] alike - and verify keeps each request's accepted proposals plus one token.
The step loop (minillm.step_loop) does the rest: num_computed_tokens counts only the accepted
tokens' K/V (the rejected ones' slots are simply written over later) and the unused lookahead
blocks go back to the pool.
"""

from __future__ import annotations

import dataclasses

import torch

from minillm.model import LlamaForCausalLM
from minillm.request import ScheduledRequest, SchedulerOutput
from minillm.sampling import Sampler
from minillm.spec.config import SpeculativeConfig
from minillm.spec.draft import DraftModelProposer
from minillm.spec.ngram import propose_ngram
from minillm.spec.rejection import verify


class SpeculativeDecoder:
    """Proposes and verifies; counts proposals and acceptances under vLLM's metric names."""

    def __init__(self, config: SpeculativeConfig, draft: DraftModelProposer | None = None):
        if (config.method == "draft_model") != (draft is not None):
            raise ValueError("the draft_model method needs a DraftModelProposer, ngram none")
        self.config, self.draft = config, draft
        self.draft_probs: dict[str, torch.Tensor | None] = {}
        self.num_drafts = 0  # verifications with at least one proposed token
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        # Per position i of a proposal: how often a verification reached it (d_1..d_i-1 were
        # accepted and d_i existed), and how often d_i was accepted then. Their ratio is the
        # acceptance rate at i; pooled, the rate alpha of E = (1 - alpha^(k+1)) / (1 - alpha).
        self.reached = [0] * config.num_speculative_tokens
        self.accepted_at = [0] * config.num_speculative_tokens

    @classmethod
    def build(cls, config: SpeculativeConfig, target: LlamaForCausalLM, draft_model:
              LlamaForCausalLM | None, num_blocks: int, block_size: int, attention_backend: str
              ) -> SpeculativeDecoder:
        if draft_model is None:
            return cls(config)
        if draft_model.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"the draft model's vocabulary ({draft_model.config.vocab_size} "
                             f"tokens) differs from the target's ({target.config.vocab_size}): "
                             "a draft must share the target's tokenizer")
        return cls(config, DraftModelProposer(draft_model, num_blocks, block_size,
                                              attention_backend))

    def propose(self, out: SchedulerOutput) -> None:
        """Fill spec_token_ids of the step's decodes and shrink their entries to match."""
        for req in out.preempted:  # the draft pool is neither kept nor swapped: catch up again
            req.num_draft_computed = 0
        entries = [s for s in out.scheduled if s.phase == "decode" and s.num_tokens > 1]
        if not entries:
            return
        ks = [s.num_tokens - 1 for s in entries]
        reqs = [s.request for s in entries]
        if self.draft is None:
            c = self.config
            proposals = [propose_ngram(r.token_ids, k, c.prompt_lookup_max, c.prompt_lookup_min)
                         for r, k in zip(reqs, ks)]
            probs: list[torch.Tensor | None] = [None] * len(reqs)
        else:
            proposals, probs = self.draft.propose(reqs, ks)
        resized: dict[int, ScheduledRequest] = {}
        for s, d, p in zip(entries, proposals, probs):
            s.request.spec_token_ids = d
            self.draft_probs[s.request.request_id] = p
            resized[id(s)] = dataclasses.replace(s, num_tokens=1 + len(d))
        out.scheduled = [resized.get(id(s), s) for s in out.scheduled]

    def verify(self, logits: torch.Tensor, sampled: list[ScheduledRequest], out: SchedulerOutput
               ) -> list[list[int]]:
        """The tokens each sampled request emits (minillm.spec.rejection.verify), counted."""
        reqs = [s.request for s in sampled]
        proposals = [r.spec_token_ids for r in reqs]
        # Read, then forget once verified: a failed batch is verified again one request at a
        # time (Engine._sample), with the same draft distributions.
        emitted = verify(logits, proposals,
                         [self.draft_probs.get(r.request_id) for r in reqs],
                         [r.params for r in reqs], [r.generator for r in reqs])
        for r in reqs:
            self.draft_probs.pop(r.request_id, None)
        for d, tokens in zip(proposals, emitted):
            if d:
                self.num_drafts += 1
                self.num_draft_tokens += len(d)
                self.num_accepted_tokens += len(tokens) - 1
                out.num_draft_tokens += len(d)
                out.num_accepted_tokens += len(tokens) - 1
                for i in range(min(len(tokens), len(d))):
                    self.reached[i] += 1
                    self.accepted_at[i] += i < len(tokens) - 1
        return emitted

    @staticmethod
    def logprobs(logits: torch.Tensor, sampled: list[ScheduledRequest], emitted: list[list[int]]
                 ) -> list[list[dict[int, float] | None]]:
        """The logprobs of each emitted token, from the row that predicted it (a request's rows
        are its 1 + k sample rows, in order), for the requests that ask for them."""
        if all(s.request.params.logprobs is None for s in sampled):
            return [[None] * len(tokens) for tokens in emitted]
        rows, params, first = [], [], 0
        for s, tokens in zip(sampled, emitted):
            rows += range(first, first + len(tokens))
            params += [s.request.params] * len(tokens)
            first += 1 + len(s.request.spec_token_ids)
        flat = torch.tensor([t for tokens in emitted for t in tokens], device=logits.device)
        per_row = Sampler.packed(logits[rows].float(), params, flat).read().logprobs
        out, i = [], 0
        for tokens in emitted:
            out.append(per_row[i:i + len(tokens)])
            i += len(tokens)
        return out

    @property
    def acceptance_rate(self) -> float:
        """Accepted over reached, all positions pooled: the maximum-likelihood alpha of a model
        in which each proposal is accepted independently with probability alpha."""
        return sum(self.accepted_at) / max(sum(self.reached), 1)

    def stats(self) -> dict[str, int]:
        return {"spec_decode_num_drafts": self.num_drafts,
                "spec_decode_num_draft_tokens": self.num_draft_tokens,
                "spec_decode_num_accepted_tokens": self.num_accepted_tokens}
