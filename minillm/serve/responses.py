"""The OpenAI API's response bodies as minillm writes them: a whole response, or stream chunks of
new text, with usage and log-probabilities in the completions or the chat format.

A request's body is parsed (protocol.py) into a ParsedRequest; its ResponseWriter turns the
engine's RequestOutputs into what the client reads. Streamed text that could still be the start
of a stop string is held back until it is known not to be one, so nothing a stop string cuts off
is ever sent.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from minillm.request import RequestOutput

if TYPE_CHECKING:  # annotations only: protocol.py re-exports ResponseWriter, so a real import
    # would be a cycle
    from minillm.serve.protocol import Json, ParsedRequest


def usage(out: RequestOutput) -> Json:
    """OpenAI's usage, with the prompt tokens the prefix cache served (what vLLM reports under
    --enable-prompt-tokens-details, and AIPerf reads for prefix-cache figures)."""
    prompt, completion = len(out.prompt_token_ids), len(out.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": out.num_cached_tokens}}


class ResponseWriter:
    """Builds the bodies of one request's response: whole, or as stream chunks of new text."""

    def __init__(self, request_id: str, model: str, parsed: ParsedRequest, tokenizer: Any):
        self.request_id, self.model, self.parsed = request_id, model, parsed
        self.tokenizer = tokenizer
        self.created = int(time.time())
        self.text_sent = 0  # characters of text already sent
        self.tokens_sent = 0  # tokens whose logprobs were already sent
        stops = parsed.params.stop_strings
        # Text that could be the start of a stop string waits until it is known not to be one.
        self.holdback = max((len(s) for s in stops), default=1) - 1

    def _envelope(self, choices: list[Json], chunk: bool) -> Json:
        kind = ("chat.completion" if self.parsed.chat else "text_completion")
        return {"id": self.request_id, "object": kind + (".chunk" if chunk and self.parsed.chat
                                                          else ""),
                "created": self.created, "model": self.model, "choices": choices}

    def response(self, out: RequestOutput) -> Json:
        """The whole response of a finished request (stream=false)."""
        choice: Json = {"index": 0, "finish_reason": out.finish_reason,
                        "logprobs": self._logprobs(out, 0, len(out.token_ids), 0)}
        if self.parsed.chat:
            choice["message"] = {"role": "assistant", "content": out.text}
        else:
            choice["text"] = out.text
        return {**self._envelope([choice], chunk=False), "usage": usage(out)}

    def first_chunk(self) -> Json | None:
        """Chat streams open with the assistant's role and no text, as OpenAI's do; it is sent
        with the first token (as vLLM's server does), since clients time TTFT by it."""
        if not self.parsed.chat:
            return None
        return self._envelope([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                "logprobs": None, "finish_reason": None}], chunk=True)

    def chunk(self, out: RequestOutput) -> Json | None:
        """The stream chunk for out's new text (None when nothing new can be sent yet)."""
        visible = len(out.text) if out.finished else max(len(out.text) - self.holdback, 0)
        if visible <= self.text_sent and not out.finished:
            return None
        delta = out.text[self.text_sent:visible]
        logprobs = self._logprobs(out, self.tokens_sent, len(out.token_ids), self.text_sent)
        self.text_sent, self.tokens_sent = visible, len(out.token_ids)
        choice: Json = {"index": 0, "logprobs": logprobs,
                        "finish_reason": out.finish_reason if out.finished else None}
        if self.parsed.chat:
            choice["delta"] = {"content": delta}
        else:
            choice["text"] = delta
        return self._envelope([choice], chunk=True)

    def usage_chunk(self, out: RequestOutput) -> Json:
        return {**self._envelope([], chunk=True), "usage": usage(out)}

    def _token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id]) if self.tokenizer is not None else str(token_id)

    def _logprobs(self, out: RequestOutput, lo: int, hi: int, offset: int) -> Json | None:
        """Log-probabilities of output tokens lo..hi, in the completions or the chat format."""
        if out.logprobs is None or lo >= hi:
            return None
        entries = list(zip(out.token_ids[lo:hi], out.logprobs[lo:hi]))
        if self.parsed.chat:
            k = self.parsed.top_logprobs or 0
            return {"content": [
                {**self._chat_entry(t, lps[t]), "top_logprobs": [
                    self._chat_entry(a, lp) for a, lp in sorted(
                        lps.items(), key=lambda kv: -kv[1])[:k]]}
                for t, lps in entries]}
        tokens = [self._token(t) for t, _ in entries]
        offsets = [offset + sum(len(s) for s in tokens[:i]) for i in range(len(tokens))]
        return {"tokens": tokens, "token_logprobs": [lps[t] for t, lps in entries],
                "top_logprobs": [{self._token(a): lp for a, lp in lps.items()}
                                 for _, lps in entries],
                "text_offset": offsets}

    def _chat_entry(self, token_id: int, logprob: float) -> Json:
        text = self._token(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}
