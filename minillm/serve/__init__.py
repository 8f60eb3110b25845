"""minillm serve: an OpenAI-compatible HTTP server over the engine, and a benchmark client.

    engine_loop.py  the engine on a thread of its own; each request's outputs as an async stream
    protocol.py     OpenAI request bodies -> SamplingParams; responses, stream chunks, 400 errors
    prometheus.py   GET /metrics under vLLM's V1 names
    app.py          the FastAPI routes; start_server() runs one on a background thread
    __main__.py     `minillm serve [MODEL] --port 8000 ...` (python -m minillm.serve)
    client.py       benchmark(): measure any OpenAI-compatible server as vLLM's benchmark does
    datasets.py     the prompt sets a benchmark sends: random, shakespeare, sharegpt
"""

from minillm.serve.app import RunningServer, build_app, start_server
from minillm.serve.client import abenchmark, benchmark
from minillm.serve.datasets import load_dataset

__all__ = ["RunningServer", "abenchmark", "benchmark", "build_app", "load_dataset",
           "start_server"]
