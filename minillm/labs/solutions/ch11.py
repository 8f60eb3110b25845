"""Reference solutions of chapter 11's graded exercises, and the open-ended ones' model answers.

11.1 is minillm.collectives.all_reduce_time with the link's two numbers as arguments. 11.2 is a
capstone answer worked the recipe's way: the deployment recommend() arrives at for chat-70b,
priced by minillm.capstone.evaluate, with reasoning that quotes the figures behind each step.
"""

from __future__ import annotations

import math
from typing import Any


def all_reduce_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """11.1: a reduce-scatter then an all-gather around a ring of n GPUs, each n - 1 steps that
    move one shard (nbytes / n) per GPU and pay one hop's latency."""
    if n == 1:
        return 0.0
    steps = 2 * (n - 1)
    return steps * (nbytes / n) / bandwidth + steps * latency


def capstone() -> dict[str, Any]:
    """11.2: the chat-70b deployment, its modelled goodput and cost, and why."""
    from minillm import parallel
    from minillm.capstone import SCENARIOS, evaluate
    from minillm.deployment import Deployment
    from minillm.metrics import percentile

    scenario = SCENARIOS["chat-70b"]
    usable = scenario.hardware.memory * 0.9
    weights = {tp: parallel.weight_bytes_per_gpu(scenario.model, parallel.ParallelConfig(tp))
               for tp in (2, 4)}
    totals = [s.prompt_len + s.output_len for s in scenario.workload()]
    typical = math.ceil(percentile(totals, 90))
    layout = parallel.ParallelConfig(4)
    seqs = parallel.max_concurrency(scenario.model, scenario.hardware, layout, typical, 0.9)
    kv_per_seq = parallel.kv_bytes_per_token_per_gpu(scenario.model, layout) * typical

    def mixed_step(chunk: int) -> float:  # one prefill chunk beside a full batch of decodes
        return parallel.parallel_step_time(scenario.model, scenario.hardware,
                                           [(chunk, chunk)] + [(1, typical)] * (seqs - 1),
                                           layout).time

    budget = 512  # the largest power of two whose mixed step keeps the TPOT bound
    while mixed_step(2 * budget) <= scenario.slo["tpot"]:
        budget *= 2
    prompt_p90 = math.ceil(percentile([s.prompt_len for s in scenario.workload()], 90))
    deployment = Deployment(tensor_parallel_size=4, replicas=2, max_num_seqs=seqs,
                            max_num_batched_tokens=budget)
    run = evaluate(scenario, deployment)
    reasoning = (
        f"Layout: Llama-3-70B's weights are {2 * weights[2] / 1e9:.0f} GB in bf16. At TP 2 they "
        f"take {weights[2] / 1e9:.1f} GB of the {usable / 1e9:.0f} GB usable per GPU, leaving "
        f"almost nothing for the KV cache; at TP 4 they take {weights[4] / 1e9:.1f} GB, which "
        "leaves half of each GPU for K/V. TP 8 would make steps a little faster but halve the "
        "engines, so TP 4 inside one NVLink node, and the other 4 GPUs as a second replica "
        "(data parallelism): two engines prefill two prompts at once. "
        f"KV: a sequence of typical length ({typical} tokens, p90 of prompt + output) needs "
        f"{kv_per_seq / 1e6:.0f} MB of K/V per GPU at TP 4, so max_num_seqs = {seqs} sequences "
        "fit beside the weights. "
        f"Chunk: with {seqs - 1} decodes in a step, a {budget}-token prefill chunk makes the "
        f"mixed step {mixed_step(budget) * 1e3:.0f} ms, under the TPOT bound of 50 ms, and "
        f"twice that chunk {mixed_step(2 * budget) * 1e3:.0f} ms, over it (vLLM's default 8192: "
        f"{mixed_step(8192) * 1e3:.0f} ms, stalling every decode); the p90 prompt "
        f"({prompt_p90} tokens) needs {math.ceil(prompt_p90 / budget)} chunks, "
        f"{math.ceil(prompt_p90 / budget) * mixed_step(budget) * 1e3:.0f} ms of the 1 s TTFT. "
        f"Result (modelled): goodput {run.goodput:.2f} req/s with {run.attainment:.0%} of "
        f"requests meeting the SLO, at ${run.dollars_per_million_tokens:.2f} per 1M output "
        "tokens on 8 GPUs at $3/h.")
    return {**deployment.engine_kwargs(), "replicas": deployment.replicas,
            "goodput": run.goodput,
            "dollars_per_million_tokens": run.dollars_per_million_tokens,
            "reasoning": reasoning}


SOLUTIONS = {"11.1": all_reduce_time, "11.2": capstone}

MODEL_ANSWERS: dict[str, str] = {
    "11.3": "TODO",
    "11.4": "TODO",
}
