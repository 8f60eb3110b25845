"""The OpenAI API as minillm speaks it: request bodies in, response bodies and stream chunks out
(those are responses.py's ResponseWriter).

Parsing checks each field's type and names it in the error; ranges are SamplingParams' own
checks, whose messages already start with the field's name. Fields that change nothing here
(user, metadata, ...) are ignored, as vLLM does; a field minillm cannot honour (n > 1, echo,
best_of > 1, logit_bias, a penalty, a response format, a required tool call, suffix) is refused
with its name rather than silently dropped. Lists are bounded as OpenAI bounds them (4 stop
strings; 20 log-probabilities, EngineConfig.max_logprobs), so no request can make a step or a
response arbitrarily large.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from minillm.llm import Prompt
from minillm.sampling import SamplingParams, check_unicode
from minillm.serve.responses import ResponseWriter as ResponseWriter
from minillm.serve.responses import usage as usage

Json = dict[str, Any]
MAX_STOP_STRINGS = 4  # OpenAI's limit; each is checked against the text after every token


class APIError(Exception):
    """An error the client caused (status 400 by default), as OpenAI's error object."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "BadRequestError"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind

    def body(self) -> Json:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.status}}


@dataclass(frozen=True)
class ParsedRequest:
    """What a completions or chat request asks for, checked."""

    prompt: Prompt
    params: SamplingParams
    stream: bool
    include_usage: bool
    chat: bool
    top_logprobs: int | None  # chat: how many alternatives per token, when logprobs is on
    priority: int = 0  # vLLM's extra field: lower runs first under --scheduling-policy priority


def _field(body: Json, name: str, kinds: tuple[type, ...], what: str, default: Any = None) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise APIError(f"{name} must be {what}, got {value!r:.80}", name)
    if isinstance(value, float) and not math.isfinite(value):
        raise APIError(f"{name} must be a finite number, got {value!r}", name)
    return value


def check_model(body: Json, served_name: str) -> None:
    """An unknown model is 404 NotFoundError, as OpenAI and vLLM answer."""
    model = _field(body, "model", (str,), "a string")
    if model is not None and model != served_name:
        raise APIError(f"model {model!r:.80} is not served here; this server serves "
                       f"{served_name!r} (GET /v1/models lists it)", "model", status=404,
                       kind="NotFoundError")


# Fields minillm cannot honour, refused unless they hold the value that asks for nothing.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "logit_bias": (None, {}), "response_format": (None, {"type": "text"}),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0), "min_p": (None, 0, 0.0), "suffix": (None, ""),
    "use_beam_search": (None, False), "prompt_logprobs": (None,), "guided_json": (None,),
    "guided_regex": (None,), "guided_choice": (None,), "guided_grammar": (None,),
}


def refuse_unsupported(body: Json) -> None:
    for name, neutral in UNSUPPORTED.items():
        value = body.get(name)
        if not any(value == n and type(value) is type(n) for n in neutral):
            raise APIError(f"{name}={value!r:.80} is not supported by minillm (it would be "
                           "silently ignored): leave it out", name)
    tools, choice = body.get("tools"), body.get("tool_choice")
    if (tools or choice not in (None, "none")) and choice != "none":
        raise APIError("tools are not supported by minillm: it cannot call them, so only "
                       "tool_choice='none' is accepted", "tool_choice" if choice else "tools")


def engine_param(message: str, chat: bool) -> str | None:
    """The field an Engine.make_request ValueError is about, from its message."""
    if message.startswith("logprobs"):
        return "top_logprobs" if chat else "logprobs"
    if "max_tokens" in message:
        return "max_tokens"
    if message.startswith("request_id"):
        return None
    return "messages" if chat else "prompt"


def parse_completion(body: Json) -> ParsedRequest:
    """POST /v1/completions: prompt is a str or a list of token ids (or a list of one of either)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        if len(prompt) > 1:
            raise APIError(f"prompt holds {len(prompt)} prompts; minillm serves one prompt per "
                           "request: send them as separate requests", "prompt")
        prompt = prompt[0]
    is_ids = isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    if not (isinstance(prompt, str) or is_ids):
        raise APIError(f"prompt must be a string or a list of token ids, got {prompt!r:.80}",
                       "prompt")
    if not prompt:
        raise APIError("prompt is empty: it needs at least one token", "prompt")
    if body.get("echo"):
        raise APIError("echo is not supported by minillm", "echo")
    refuse_unsupported(body)
    logprobs = _field(body, "logprobs", (int,), "an integer >= 0 or null")
    return _parsed(body, prompt, default_max_tokens=16, logprobs=logprobs, chat=False)


def parse_chat(body: Json, render: Any, capacity: int) -> ParsedRequest:
    """POST /v1/chat/completions. render(messages) -> prompt token ids (the chat template).
    capacity: the most tokens one request can hold (max_model_len, or the KV pool if smaller):
    without max_tokens a request may generate what is left of it, as vLLM's default does."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(f"messages must be a non-empty list of {{role, content}} objects, got "
                       f"{messages!r:.80}", "messages")
    turns = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("system", "user", "assistant", "developer"):
            raise APIError(f"messages[{i}].role must be system, user or assistant, got "
                           f"{role!r}", f"messages[{i}].role")
        turns.append({"role": "system" if role == "developer" else role,
                      "content": _content_text(m.get("content"), i)})
    refuse_unsupported(body)
    want_logprobs = _field(body, "logprobs", (bool,), "true or false", False)
    top = _field(body, "top_logprobs", (int,), "an integer >= 0")
    if top is not None and top < 0:
        raise APIError(f"top_logprobs must be an integer >= 0, got {top}", "top_logprobs")
    if top is not None and not want_logprobs:
        raise APIError("top_logprobs needs logprobs: true", "top_logprobs")
    top = top or 0
    prompt = render(turns)
    max_tokens = _field(body, "max_completion_tokens", (int,), "an integer >= 1")
    if max_tokens is not None and max_tokens < 1:
        raise APIError(f"max_completion_tokens must be an integer >= 1, got {max_tokens}",
                       "max_completion_tokens")
    if max_tokens is not None:  # the newer name wins, as in OpenAI's API
        body = {**body, "max_tokens": max_tokens}
    # No max_tokens: as much as the context leaves (vLLM's default), at least 1 so a prompt that
    # fills the context is reported as too long rather than as a bad max_tokens.
    parsed = _parsed(body, prompt, default_max_tokens=max(capacity - len(prompt), 1),
                     logprobs=top if want_logprobs else None, chat=True)
    return ParsedRequest(parsed.prompt, parsed.params, parsed.stream, parsed.include_usage,
                         True, top if want_logprobs else None, parsed.priority)


def _content_text(content: Any, i: int) -> str:
    """A message's content: a string, or a list of {"type": "text", "text": ...} parts."""
    text = None
    if isinstance(content, str):
        text = content
    elif isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content):
        text = "".join(p["text"] for p in content)
    if text is not None:
        try:
            return check_unicode(f"messages[{i}].content", text)
        except ValueError as e:
            raise APIError(str(e), f"messages[{i}].content") from None
    raise APIError(f"messages[{i}].content must be a string or a list of text parts, got "
                   f"{content!r:.80}", f"messages[{i}].content")


def _parsed(body: Json, prompt: Prompt, default_max_tokens: int, logprobs: int | None,
            chat: bool) -> ParsedRequest:
    n = _field(body, "n", (int,), "an integer", 1)
    if n != 1:
        raise APIError(f"n={n} is not supported: minillm returns one choice per request", "n")
    best_of = _field(body, "best_of", (int,), "an integer", 1)
    if best_of != 1:
        raise APIError(f"best_of={best_of} is not supported", "best_of")
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, (str, list)):
        raise APIError(f"stop must be a string or a list of strings, got {stop!r:.80}", "stop")
    if isinstance(stop, list) and len(stop) > MAX_STOP_STRINGS:
        raise APIError(f"stop holds {len(stop)} strings; at most {MAX_STOP_STRINGS} are "
                       "allowed (as in OpenAI's API)", "stop")
    top_k = _field(body, "top_k", (int,), "an integer (-1 or 0 disables it)", 0)
    stream = _field(body, "stream", (bool,), "true or false", False)
    options = _field(body, "stream_options", (dict,), "an object")
    if options is not None and not stream:
        raise APIError("stream_options is only allowed when stream is true", "stream_options")
    include_usage = bool((options or {}).get("include_usage", False))
    try:
        params = SamplingParams(
            max_tokens=_field(body, "max_tokens", (int,), "an integer >= 1", default_max_tokens),
            temperature=_field(body, "temperature", (int, float), "a number >= 0", 1.0),
            top_p=_field(body, "top_p", (int, float), "a number in (0, 1]", 1.0),
            top_k=0 if top_k == -1 else top_k,  # vLLM spells "off" as -1
            stop=None if stop == [] else stop,
            seed=_field(body, "seed", (int,), "an integer"),
            logprobs=logprobs,
            ignore_eos=_field(body, "ignore_eos", (bool,), "true or false", False),
            min_tokens=_field(body, "min_tokens", (int,), "an integer >= 0", 0))
    except ValueError as e:  # SamplingParams' messages start with the field's name
        name = re.match(r"[a-z_]+", str(e))
        raise APIError(str(e), name.group(0) if name else None) from None
    priority = _field(body, "priority", (int,), "an integer (lower runs first)", 0)
    return ParsedRequest(prompt, params, stream, include_usage, chat, None, priority)
