"""The draft model: a small model with the target's tokenizer proposes k tokens, one forward each.

Its K/V live in a paged pool of its own that mirrors the target's: the same blocks, the same
block tables and slots, its own layers and heads. So the scheduler's blocks, prefix sharing and
the lookahead it reserves serve both models, and nothing is allocated per request.

A request's draft cache holds its first num_draft_computed tokens. Proposing first catches it up
in one extend over the tokens it lacks (the whole prompt at the first decode; afterwards the
last token, or two when every proposal was accepted), whose last row gives d_1; then one decode
step per further token. Its own proposals d_1..d_{k-1} go into its cache as it runs, so after
the target accepts j of them the cache is valid up to min(n + k - 1, n + j) tokens.
"""

from __future__ import annotations

import itertools

import torch

from minillm.attention import get_backend
from minillm.batch import flat_rows
from minillm.model import LlamaForCausalLM
from minillm.quant.kv_pool import allocate_kv_cache
from minillm.request import Request
from minillm.sampling import draw, sampling_probs


class DraftModelProposer:
    """Proposes tokens with a draft model over a KV pool shaped like the target's."""

    def __init__(self, model: LlamaForCausalLM, num_blocks: int, block_size: int,
                 attention_backend: str):
        mc = model.config
        weight = model.lm_head.weight
        self.model, self.block_size = model, block_size
        self.kv_cache = allocate_kv_cache(mc.num_hidden_layers, num_blocks, block_size,
                                          mc.num_key_value_heads, mc.head_dim, weight.dtype,
                                          weight.device)
        self.backend = get_backend(attention_backend, weight.device)

    def propose(self, requests: list[Request], ks: list[int]
                ) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        """ks[b] tokens for requests[b], each drawn from the draft's distribution under the
        request's sampling params; and those distributions, (k_b, V), or None where they are
        one-hot (greedy requests)."""
        rows = [(req.token_ids[req.num_draft_computed:], req.num_draft_computed, req.block_table)
                for req in requests]
        tokens: list[list[int]] = [[] for _ in requests]
        probs: list[list[torch.Tensor]] = [[] for _ in requests]
        active = list(range(len(requests)))
        for i in range(max(ks)):
            new = self._step([rows[b] for b in active], [requests[b] for b in active])
            for b, (token, p) in zip(active, new):
                tokens[b].append(token)
                probs[b].append(p)
                req = requests[b]
                req.num_draft_computed = rows[b][1] + len(rows[b][0])
                rows[b] = ([token], req.num_draft_computed, req.block_table)
            active = [b for b in active if ks[b] > i + 1]
        greedy = [req.params.temperature == 0 for req in requests]
        return tokens, [None if g else torch.stack(p) for g, p in zip(greedy, probs)]

    def _step(self, rows: list[tuple[list[int], int, list[int]]], requests: list[Request]
              ) -> list[tuple[int, torch.Tensor]]:
        """One draft forward over rows; each row's next token and the distribution it came from."""
        ends = [n - 1 for n in itertools.accumulate(len(tokens) for tokens, _, _ in rows)]
        input_ids, positions, attn, last = flat_rows(rows, self.block_size,
                                                     self.kv_cache.device, ends)
        hidden = self.model(input_ids, positions, self.kv_cache, attn, self.backend)
        params = [req.params for req in requests]
        p = sampling_probs(self.model.compute_logits(hidden[last]), params)  # (B, V)
        chosen = draw(p, params, [req.generator for req in requests]).tolist()
        return list(zip(chosen, p))
