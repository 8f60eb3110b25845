"""minillm serve: an OpenAI-compatible HTTP server over the engine, and a benchmark client.

    engine_client.py  EngineClient: what the server asks of an engine, filled two ways:
    engine_loop.py  ... the engine on a thread of the server's process (start_server(llm))
    core_client.py  ... the engine core in a process of its own (minillm serve's default)
    engine_core.py  the engine core's process: its loop and the messages over its pipe
    output_processor.py  the server's side of a core process: tokens to text, stop strings
    protocol.py     OpenAI request bodies -> SamplingParams; 4xx errors
    responses.py    response bodies and stream chunks: usage, log-probabilities
    config.py       ServerConfig: the API key, allowed hosts and origins, body and header limits
    guard.py        what a request must pass before any route: Host, Origin, key, JSON, body size
    prometheus.py   GET /metrics under vLLM's V1 names
    app.py          the FastAPI routes: completions, chat, models, tokenize, health, metrics
    errors.py       what a failed request returns: the engine's errors as OpenAI error bodies
    running.py      uvicorn with a graceful shutdown; start_server() on a background thread
    __main__.py     `minillm serve [MODEL] --port 8000 ...` (python -m minillm.serve)
    client.py       benchmark(): measure any OpenAI-compatible server as vLLM's benchmark does
    datasets.py     the prompt sets a benchmark sends: random, shakespeare, sharegpt
    conversations.py  run_conversations(): multi-turn chats played against a real LLM
"""

from typing import Any

# Names load on first use, so `minillm.serve.datasets` (the benchmark's prompt sets) imports
# without FastAPI or aiohttp, as on a GPU machine that has neither.
_HOME = {"RunningServer": "running", "build_app": "app", "start_server": "running",
         "ServerConfig": "config",
         "benchmark": "client", "abenchmark": "client", "load_dataset": "datasets"}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'minillm.serve' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"minillm.serve.{_HOME[name]}"), name)
