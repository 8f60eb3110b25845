"""The server's side of an engine core in another process: each request's tokens become text.

The core sends token ids (engine_core.CoreOutput); this process keeps a copy of each request in
flight (a Request, as the engine's own) and grows it with the news: tokens, log-probabilities,
their times, then the text, which it detokenizes here, checking stop strings as the engine does
(Engine.stops: after min_tokens, the first stop string the new text completes cuts the text and
ends the request). Outputs are built from the copy exactly as the engine builds them
(RequestOutput.of), so a stream reads the same whichever side detokenized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minillm.request import Request, RequestOutput, RequestStatus
from minillm.serve.engine_core import CoreOutput
from minillm.tokenizer import IncrementalDetokenizer, find_stop


@dataclass
class _State:
    request: Request  # this process's copy: prompt, tokens and text so far, metrics
    detokenizer: IncrementalDetokenizer


class OutputProcessor:
    """Requests in flight, as this process knows them (vLLM V1's OutputProcessor)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._states: dict[str, _State] = {}

    def add(self, req: Request) -> None:
        self._states[req.request_id] = _State(
            req, IncrementalDetokenizer(self.tokenizer, req.prompt_token_ids))

    def drop(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def process(self, news: CoreOutput) -> tuple[RequestOutput | None, bool]:
        """The request's output after news (None for a request no longer here), and whether
        a stop string ended it here, so the core must be told to drop it."""
        state = self._states.get(news.request_id)
        if state is None:
            return None, False
        req = state.request
        m = req.metrics
        if m.first_scheduled_time is None:
            m.first_scheduled_time = news.first_scheduled_time
        req.num_cached_tokens = news.num_cached_tokens
        stopped = self._take(state, news)
        if not stopped and news.finish_reason is not None:
            req.finish_reason, req.error = news.finish_reason, news.error
            m.finished_time = news.finished_time
        if req.finish_reason is not None:
            req.status = RequestStatus.FINISHED
            del self._states[req.request_id]
        return RequestOutput.of(req), stopped

    def _take(self, state: _State, news: CoreOutput) -> bool:
        """Append news's tokens one by one until a stop string ends the request (True)."""
        req, m = state.request, state.request.metrics
        logprobs = news.new_logprobs
        for i, (token, when) in enumerate(zip(news.new_token_ids, news.token_times)):
            req.token_ids.append(token)
            if logprobs is not None:
                req.output_logprobs.append(logprobs[i])
            m.token_times.append(when)
            if m.first_token_time is None:
                m.first_token_time = when
            old_len = len(req.text)
            req.text += state.detokenizer.step(req.token_ids)
            if req.num_output_tokens < req.params.min_tokens:
                continue
            cut = find_stop(req.text, old_len, req.params.stop_strings)
            if cut is not None:
                req.text = req.text[:cut]
                req.finish_reason, m.finished_time = "stop", when
                return True
        return False
