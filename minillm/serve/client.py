"""The benchmark client: stream a workload to any OpenAI-compatible server, measure like vLLM.

Every request is a streaming POST to /v1/completions (or /v1/chat/completions) with
max_tokens = its output length, temperature 0, ignore_eos (vLLM's extra field, which minillm
and SGLang accept too) and stream_options.include_usage, so the server generates exactly the
tokens asked for and says how many it did. Per request, on time.perf_counter's clock (one
clock across processes on a Linux machine, the engine's too):

    t0    just before the POST is sent (its arrival_time)
    TTFT  the first chunk with text - t0
    ITL   every gap between later chunks with text (pooled over requests in the report)
    E2E   the last chunk with text - t0
    TPOT  (E2E - TTFT) / (output tokens - 1), output tokens from the usage chunk

A chunk may carry several tokens (a server flushes whatever its step made, a detokenizer holds
back half a character), so ITL is per chunk and TPOT per token: they differ when chunks hold
more than one token. vLLM's client counts a chunk with empty text as a first token; this one
waits for text, as vLLM's chat client does. A request whose HTTP status is not 200, whose
stream breaks, or that ends without `data: [DONE]` is a record with .error set: counted, and
left out of the figures. The run's duration is its wall time, first send to last response.

Open loop: request i is sent at its workload arrival_time whatever the server is doing;
max_concurrency (or a closed-loop workload's concurrency) caps requests in flight with a
semaphore, a later one waiting for a free slot before its t0, as vLLM's --max-concurrency does.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
from tqdm.auto import tqdm

from minillm.llm import default_model_path
from minillm.metrics import RequestMetrics
from minillm.serve.serving_result import RequestRecord, ServingResult
from minillm.tokenizer import load_tokenizer
from minillm.workloads.streams import RequestSpec, Workload

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def benchmark(base_url: str, workload: Workload, *, model: str | None = None,
              tokenizer: Any = None, max_concurrency: int | None = None, num_warmups: int = 2,
              slo: dict[str, float] | None = None, progress: bool = False,
              endpoint: str = COMPLETIONS, timeout: float = 3600.0) -> ServingResult:
    """Send workload to the server at base_url (e.g. "http://127.0.0.1:8000"); a ServingResult.

    model: the served model name (None: the first of GET /v1/models). tokenizer: a checkpoint
    folder or a loaded tokenizer, the server's (None: the shipped model's); it gives the vocab
    size of random prompts and counts tokens if a server sends no usage. num_warmups requests
    (the workload's first ones) run before the clock starts and are left out. slo: bounds in
    seconds (minillm.serving.parse_slo) for goodput. timeout: seconds per request.

    Synchronous: inside a running event loop (Jupyter) the run happens on a worker thread.
    """
    kwargs = dict(model=model, tokenizer=tokenizer, max_concurrency=max_concurrency,
                  num_warmups=num_warmups, slo=slo, progress=progress, endpoint=endpoint,
                  timeout=timeout)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(abenchmark(base_url, workload, **kwargs))
    with ThreadPoolExecutor(1, thread_name_prefix="minillm-bench") as pool:
        return pool.submit(asyncio.run, abenchmark(base_url, workload, **kwargs)).result()


async def abenchmark(base_url: str, workload: Workload, *, model: str | None = None,
                     tokenizer: Any = None, max_concurrency: int | None = None,
                     num_warmups: int = 2, slo: dict[str, float] | None = None,
                     progress: bool = False, endpoint: str = COMPLETIONS,
                     timeout: float = 3600.0) -> ServingResult:
    """benchmark, as a coroutine (see there)."""
    if not isinstance(workload, Workload) or not workload:
        raise ValueError(f"benchmark needs a non-empty Workload, got {workload!r:.80}")
    if max_concurrency is not None and (not isinstance(max_concurrency, int)
                                        or max_concurrency < 1):
        raise ValueError(f"max_concurrency must be an integer >= 1 or None, got "
                         f"{max_concurrency!r}")
    if not isinstance(num_warmups, int) or num_warmups < 0:
        raise ValueError(f"num_warmups must be an integer >= 0, got {num_warmups!r}")
    base_url = base_url.rstrip("/")
    tok = _tokenizer(tokenizer)
    limit = max_concurrency or workload.concurrency
    gate = asyncio.Semaphore(limit) if limit else None
    connector = aiohttp.TCPConnector(limit=0)  # no pool limit: the client never queues unseen
    async with aiohttp.ClientSession(connector=connector, trust_env=False,
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        name = model or await served_model(session, base_url)
        payloads = [_payload(spec, name, tok, endpoint) for spec in workload]
        run_id = uuid.uuid4().hex[:8]

        async def send(i: int, label: str) -> RequestRecord:
            if gate is None:
                return await _stream(session, base_url + endpoint, payloads[i], workload[i],
                                     f"bench-{run_id}-{label}", tok)
            async with gate:
                return await _stream(session, base_url + endpoint, payloads[i], workload[i],
                                     f"bench-{run_id}-{label}", tok)

        warm = await asyncio.gather(*(send(k % len(workload), f"warmup{k}")
                                      for k in range(num_warmups)))
        failed = [r.error for r in warm if not r.ok]
        if failed:
            raise RuntimeError(f"a warm-up request to {base_url + endpoint} failed: {failed[0]}")
        records, duration, start = await _run(workload, send, progress)
    return ServingResult.build(workload, records, start, slo, duration, source=base_url)


async def _run(workload: Workload, send: Any, progress: bool
               ) -> tuple[list[RequestRecord], float, float]:
    """Send request i at start + its arrival time; the records in workload order."""
    bar = tqdm(total=len(workload), desc="requests", unit="req", disable=not progress)

    async def timed(i: int) -> RequestRecord:
        record = await send(i, str(i))
        bar.update(1)
        return record

    order = sorted(range(len(workload)), key=lambda i: workload[i].arrival_time)
    tasks: dict[int, asyncio.Task[RequestRecord]] = {}
    start = time.perf_counter()
    try:
        for i in order:
            delay = start + workload[i].arrival_time - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks[i] = asyncio.create_task(timed(i))
        await asyncio.gather(*tasks.values())
        duration = time.perf_counter() - start
    finally:
        for task in tasks.values():
            task.cancel()
        bar.close()
    return [tasks[i].result() for i in range(len(workload))], duration, start


async def served_model(session: aiohttp.ClientSession, base_url: str) -> str:
    """The id of the first model GET /v1/models lists."""
    async with session.get(base_url + "/v1/models") as resp:
        if resp.status != 200:
            raise RuntimeError(f"GET {base_url}/v1/models: HTTP {resp.status}: "
                               f"{(await resp.text())[:200]}")
        models = (await resp.json()).get("data") or []
    if not models:
        raise RuntimeError(f"{base_url}/v1/models lists no model: pass model=")
    return models[0]["id"]


def _payload(spec: RequestSpec, model: str, tokenizer: Any, endpoint: str) -> dict[str, Any]:
    """The request body: exact output length (max_tokens with ignore_eos), greedy, streamed."""
    body: dict[str, Any] = {"model": model, "max_tokens": spec.output_len, "temperature": 0.0,
                            "ignore_eos": True, "stream": True,
                            "stream_options": {"include_usage": True}}
    prompt: str | list[int] = (spec.prompt if spec.prompt is not None
                               else spec.token_ids(_vocab_size(tokenizer)))
    if endpoint == CHAT:
        text = prompt if isinstance(prompt, str) else tokenizer.decode(prompt)
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = prompt  # token ids for random prompts: prompt_tokens is exact
    return body


async def _stream(session: aiohttp.ClientSession, url: str, payload: dict[str, Any],
                  spec: RequestSpec, request_id: str, tokenizer: Any) -> RequestRecord:
    """One streaming request, timed chunk by chunk (see the module docstring)."""
    chat = url.endswith(CHAT)
    pieces: list[str] = []
    usage: dict[str, Any] = {}
    t0 = time.perf_counter()
    m = RequestMetrics(arrival_time=t0)

    def record(error: str | None) -> RequestRecord:
        text = "".join(pieces)
        if m.token_times:
            m.first_token_time, m.finished_time = m.token_times[0], m.token_times[-1]
        n_out = usage.get("completion_tokens")
        if n_out is None:  # no usage chunk: count the text's tokens, as vLLM does
            n_out = len(tokenizer.encode(text)) if tokenizer is not None else len(m.token_times)
        m.num_output_tokens = int(n_out)
        return RequestRecord(int(usage.get("prompt_tokens", spec.prompt_len)), int(n_out), m,
                             text, error, request_id)

    try:
        async with session.post(url, json=payload, headers={"X-Request-Id": request_id}) as resp:
            if resp.status != 200:
                return record(f"HTTP {resp.status}: {(await resp.text())[:300]}")
            async for line in resp.content:  # the stream, one SSE line at a time
                now = time.perf_counter()
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("error"):
                    return record(f"error in stream: {chunk['error']}")
                usage = chunk.get("usage") or usage
                choices = chunk.get("choices") or []
                piece = choices and (choices[0].get("delta", {}).get("content") if chat
                                     else choices[0].get("text"))
                if piece:
                    m.token_times.append(now)
                    pieces.append(piece)
            else:
                return record("the stream ended before data: [DONE]")
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        return record(f"{type(e).__name__}: {e}")
    if not m.token_times:
        return record("no chunk carried text: TTFT is undefined")
    return record(None)


def _tokenizer(tokenizer: Any) -> Any:
    if tokenizer is None:
        tokenizer = default_model_path()
    if isinstance(tokenizer, (str, Path)):
        loaded = load_tokenizer(tokenizer)
        if loaded is None:
            raise ValueError(f"no tokenizer files in {str(tokenizer)!r}")
        return loaded
    return tokenizer


def _vocab_size(tokenizer: Any) -> int:
    """Random prompt ids are drawn below this (id 0 excluded: eos in the shipped model)."""
    return len(tokenizer)
