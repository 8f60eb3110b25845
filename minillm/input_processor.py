"""A request's prompt and parameters checked and tokenized before any engine step sees them.

The checks need no model: the tokenizer, the resolved EngineConfig (max_model_len and the pool's
num_kv_blocks set) and the vocabulary's size. So the engine runs them (Engine.make_request) and
so does the front end of an engine core in another process (minillm.serve.core_client), which
holds no weights: a bad request is refused by name there, and never reaches the core.
(vLLM V1's InputProcessor has the same place: the API server's process, before the core.)
"""

from __future__ import annotations

from typing import Any

from minillm.config import EngineConfig
from minillm.sampling import SamplingParams, check_unicode


class InputProcessor:
    """Tokenizes a prompt and checks that a request can run: ValueError names any bad value."""

    def __init__(self, tokenizer: Any, config: EngineConfig, vocab_size: int):
        assert config.num_kv_blocks is not None and config.max_model_len is not None
        self.tokenizer, self.config, self.vocab_size = tokenizer, config, vocab_size

    def process(self, prompt: str | list[int], params: SamplingParams, priority: int = 0
                ) -> list[int]:
        """The prompt's token ids, once the whole request is known to fit this engine."""
        self.check_priority(priority)
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        self.check_logprobs(params)
        token_ids = self.tokenize(prompt)
        self.check_fits(token_ids, params)
        return token_ids

    @staticmethod
    def check_priority(priority: object) -> None:
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"priority must be an int (lower runs first), got {priority!r}")

    def check_logprobs(self, params: SamplingParams) -> None:
        """logprobs=k costs a (B, k) top-k and k entries per token of the response: bounded."""
        k, most = params.logprobs, self.config.max_logprobs
        if k is not None and k > min(most, self.vocab_size):
            raise ValueError(f"logprobs={k} exceeds the most this engine returns, "
                             f"max_logprobs={most} (vLLM's default; a vocabulary of "
                             f"{self.vocab_size} tokens bounds it too)")

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        """A prompt's token ids, checked: non-empty, valid text, ids inside the vocabulary."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: pass prompts as lists of token ids")
            token_ids = self.tokenizer.encode(check_unicode("the prompt", prompt))
        elif isinstance(prompt, (list, tuple)) and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            token_ids = list(prompt)
        else:
            raise ValueError(f"a prompt must be a str or a list of token ids, got {prompt!r:.80}")
        if not token_ids:
            raise ValueError("the prompt is empty: it needs at least one token")
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary "
                             f"[0, {self.vocab_size})")
        return token_ids

    def check_fits(self, token_ids: list[int], params: SamplingParams) -> None:
        """The request's prompt and max_tokens fit the context, the step budget and the pool."""
        c, n = self.config, len(token_ids)
        assert c.max_model_len is not None and c.num_kv_blocks is not None
        if n + params.max_tokens > c.max_model_len:
            raise ValueError(
                f"prompt of {n} tokens plus max_tokens={params.max_tokens} exceeds the model's "
                f"context of max_model_len={c.max_model_len} tokens; shorten the prompt or lower "
                "max_tokens")
        if not c.enable_chunked_prefill and n > c.max_num_batched_tokens:
            raise ValueError(
                f"prompt of {n} tokens exceeds max_num_batched_tokens={c.max_num_batched_tokens}"
                " and chunked prefill is off; raise the budget or enable_chunked_prefill=True")
        needed = -(-(n + params.max_tokens) // c.block_size)  # BlockManager.num_blocks_for
        if needed > c.num_kv_blocks:
            raise ValueError(
                f"a request of {n} prompt tokens + max_tokens={params.max_tokens} needs {needed} "
                f"KV blocks but the pool has num_kv_blocks={c.num_kv_blocks}; enlarge the pool")
