"""minillm serve [MODEL]: serve a checkpoint over an OpenAI-compatible HTTP API.

Engine flags use vLLM's names, so a vLLM launch line carries over: --max-num-seqs,
--max-num-batched-tokens, --enable-prefix-caching, --block-size, --max-model-len, ...
--scheduling-policy takes vLLM's fcfs or priority (a request's `priority` field, lower first) or
SGLang's lpm; --prefix-caching picks vLLM's hash chain or SGLang's radix tree (radix-token:
matched token by token); --preemption-mode recompute or swap (to --swap-space GiB of host
memory) says what preemption does to the KV.

Safety: the server binds 127.0.0.1 and answers only to loopback Host names unless told
otherwise. --api-key (or MINILLM_API_KEY) makes every route but /health and /metrics require
`Authorization: Bearer KEY`; binding another address without a key is refused unless
--allow-unauthenticated says so. Browsers are kept out (JSON bodies only, no CORS unless
--allowed-origins), bodies are capped (--max-request-body-bytes) and a failed engine ends every
request with an error and exits with status 1, for a supervisor to restart it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from minillm.calc import machine
from minillm.llm import LLM, default_model_path
from minillm.serve.config import API_KEY_ENV, ServerConfig, is_loopback
from minillm.serve.core_client import EngineCoreClient
from minillm.serve.engine_loop import EngineLoop


def json_object(text: str) -> dict:
    """A command-line JSON object, or an error that shows what was given."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object {{...}}, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", type=Path, default=default_model_path(),
                        help="a local Hugging Face checkpoint folder (default: the shipped model)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None,
                        help="the name clients put in `model` (default: the folder's name)")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-gpu-blocks-override", type=int, default=None,
                        help="KV pool size in blocks (default: sized from memory)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                        default=False)
    parser.add_argument("--prefix-caching", choices=["hash", "radix", "radix-token"],
                        default="hash",
                        help="how the prefix cache finds blocks: vLLM's chain of block hashes, "
                             "SGLang's radix tree, or the tree matched token by token (a partly "
                             "shared block is copied); with --enable-prefix-caching")
    parser.add_argument("--scheduling-policy", choices=["fcfs", "priority", "lpm"],
                        default="fcfs",
                        help="admission order: arrival, each request's priority (lower first), "
                             "or SGLang's longest cached prefix first")
    parser.add_argument("--preemption-mode", choices=["recompute", "swap"], default="recompute",
                        help="a preempted request's KV: freed and recomputed, or swapped to host "
                             "memory and back")
    parser.add_argument("--swap-space", type=float, default=4.0,
                        help="GiB of host memory for swapped KV (with --preemption-mode swap)")
    parser.add_argument("--quantization", choices=["int8"], default=None,
                        help="weight-only int8 with per-channel scales, quantized at load")
    parser.add_argument("--kv-cache-dtype", choices=["auto", "int8", "fp8"], default="auto",
                        help="how the KV cache stores K and V: the model's dtype, or one byte "
                             "per value with per-head scales (int8, fp8 e4m3)")
    parser.add_argument("--speculative-config", type=json_object, default=None,
                        help="speculative decoding as JSON (vLLM's form), e.g. "
                             "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'")
    parser.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                        default=True)
    parser.add_argument("--enforce-eager", action="store_true",
                        help="never replay CUDA graphs")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                        default=False,
                        help="schedule and launch each step before reading the last one's "
                             "tokens, so the host's work overlaps the device's")
    parser.add_argument("--engine-core-process", action=argparse.BooleanOptionalAction,
                        default=os.name == "posix",  # the core's launch needs POSIX (Linux, macOS)
                        help="run the engine core (scheduling, forward, sampling) in a process "
                             "of its own, so HTTP, JSON and detokenizing never share its "
                             "interpreter lock (vLLM V1's design); --no-engine-core-process "
                             "runs it on a thread of the server's process (the default on "
                             "Windows)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16 or float16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-logprobs", type=int, default=20,
                        help="the most log-probabilities a request may ask for per token")
    parser.add_argument("--log-level", default="info",
                        choices=["critical", "error", "warning", "info", "debug"])
    add_security_arguments(parser)


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("who may use the server, and how much")
    group.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                       help=f"require 'Authorization: Bearer KEY' on every route but /health "
                            f"and /metrics (default: ${API_KEY_ENV})")
    group.add_argument("--allow-unauthenticated", action="store_true",
                       help="serve a non-loopback address without an API key (anyone who can "
                            "reach it can use it)")
    group.add_argument("--allowed-hosts", nargs="+", default=None, metavar="HOST",
                       help="Host header names to answer to (default: the bound address and "
                            "the loopback names; '*' for any)")
    group.add_argument("--allowed-origins", nargs="+", default=[], metavar="ORIGIN",
                       help="browser origins allowed to call the API (CORS; default: none)")
    group.add_argument("--max-request-body-bytes", type=int, default=ServerConfig.max_body_bytes,
                       help="the largest request body accepted (413 above it)")
    group.add_argument("--enable-api-docs", action="store_true",
                       help="serve /docs, /redoc and /openapi.json (behind the key if any)")


def server_config(args: argparse.Namespace) -> ServerConfig:
    """The ServerConfig of the flags; ValueError when the bind would be open to a network."""
    if not is_loopback(args.host) and args.api_key is None and not args.allow_unauthenticated:
        raise ValueError(f"--host {args.host} serves other machines, and there is no API key: "
                         f"pass --api-key (or set {API_KEY_ENV}), or --allow-unauthenticated "
                         "if an open server is really meant")
    return ServerConfig(api_key=args.api_key, allowed_hosts=args.allowed_hosts,
                        allowed_origins=tuple(args.allowed_origins),
                        max_body_bytes=args.max_request_body_bytes,
                        enable_docs=args.enable_api_docs)


def make_engine(args: argparse.Namespace) -> LLM | EngineCoreClient:
    """The flags' engine: an EngineCoreClient (the core loads the model in its own process), or
    an LLM for a thread of this one. OSError or ValueError name what is wrong."""
    kwargs = dict(device=args.device, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
                  max_num_batched_tokens=args.max_num_batched_tokens,
                  max_model_len=args.max_model_len, block_size=args.block_size,
                  num_kv_blocks=args.num_gpu_blocks_override,
                  gpu_memory_utilization=args.gpu_memory_utilization,
                  enable_prefix_caching=args.enable_prefix_caching,
                  prefix_caching=args.prefix_caching, scheduling_policy=args.scheduling_policy,
                  preemption_mode=args.preemption_mode, swap_space=args.swap_space,
                  quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype,
                  speculative_config=args.speculative_config,
                  enable_chunked_prefill=args.enable_chunked_prefill,
                  enable_cuda_graphs=not args.enforce_eager,
                  async_scheduling=args.async_scheduling, seed=args.seed,
                  max_logprobs=args.max_logprobs,
                  max_trace_steps=10_000)  # a server runs for days: keep the recent steps
    if args.engine_core_process:
        return EngineCoreClient(args.model, log_level=args.log_level, **kwargs)
    return LLM(args.model, **kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minillm serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    from minillm.serve.app import build_app
    from minillm.serve.running import GracefulServer

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s:     %(message)s")
    # On a CPU of two cores the engine shares them with the HTTP loop and the clients: a second
    # torch thread then stalls the step (8 req/s of 64-in/64-out here: TPOT p50 14-21 ms with
    # two threads, 11-13 ms with one). Elsewhere this changes nothing.
    machine.settle_threads()
    start = time.perf_counter()
    try:
        config = server_config(args)
        engine = make_engine(args)
        ready = time.perf_counter() - start
    except (OSError, ValueError) as e:
        print(f"minillm serve: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C while the model loads (a core's process goes with it)
        print("minillm serve: interrupted while starting", file=sys.stderr)
        return 130
    name = args.served_model_name or engine.model_name
    app = build_app(engine, name, config, args.host)
    engine = app.state.server.engine  # the EngineClient serving the flags' engine
    c = engine.config
    # The model's load alone (ServerProcess reads it); a core's process adds its interpreter.
    if isinstance(engine, EngineLoop):
        where, load, started = "on a thread of this process", ready, ""
    else:
        where, load = "in its own process", engine.load_seconds
        started = f" (the core's process ready {ready:.2f} s after launch)"
    print(f"minillm serve: {name} on {engine.device} ({engine.torch_threads} torch "
          f"threads; the engine core {where}), {c.num_kv_blocks} KV blocks of "
          f"{c.block_size} tokens, max_num_seqs {c.max_num_seqs}; model loaded in {load:.2f} s"
          f"{started}; http://{args.host}:{args.port}/v1"
          f"{'' if config.api_key else ' (no API key)'}", flush=True)
    server = GracefulServer(app, args.host, args.port, args.log_level, config)
    # A dead engine: stop serving (uvicorn's flag, read by its main loop) and exit 1 below.
    engine.on_death = lambda: setattr(server, "should_exit", True)
    # SIGINT/SIGTERM: uvicorn stops accepting; in-flight requests may finish for
    # shutdown_grace seconds, then each ends with an error event or a 503 (GracefulServer).
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it shut down for: done, quietly
        pass
    finally:  # the app's shutdown stops it; if the app never started, this does
        engine.stop(0)
    if engine.error is not None:
        print(f"minillm serve: the engine failed ({engine.error!r}); exiting with status 1 "
              "so that a supervisor restarts the server", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
