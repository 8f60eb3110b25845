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
    "11.3": """\
**Model answer.** Modelled, Llama-3-8B on 4 H100s, 300 Poisson requests with 64-token answers at
16 req/s, SLO TTFT < 1 s and TPOT < 8 ms, 2 prefill + 2 decode GPUs against 4 colocated replicas
(chunked prefill, 2,048-token budget). Prompt length: at 256-512, 1k-2k and 2k-4k tokens the two
tie (15.3 req/s each); at 3k-6k the colocated p99 TPOT is 7.8 ms, just inside, still a tie (15.2
vs 15.1); at 4k-8k it is 10.5 ms and disaggregation wins 15.2 to 11.9 (1.28x); at 8k-16k (8
req/s, max_model_len 16384 in all three kwargs) 7.6 to 4.7 (1.6x). At 8k-16k and 16 req/s the
two prefill GPUs cannot keep up (TTFT p50 5.9 s) and both collapse (0.85 vs 0.69): the edge
needs a prefill pool that keeps up. The edge appears when a decode step that carries a full
prefill chunk costs more than the TPOT SLO, and grows with the prompt. TPOT SLO: loosened from 8
to 10 ms the RAG case ties (15.21 vs 15.06); at 15 and 30 ms colocated is a hair ahead (15.27):
the edge lives only where the SLO sits between a decode-only step and a mixed one. Link: NVLink,
InfiniBand NDR and 100GbE keep the edge (15.2 req/s); 25 GbE (3.1 GB/s, below the 6.2 GB/s of
K/V each prefill replica produces at 16 req/s) collapses to 0.03 req/s as copies queue. Rule:
the link of each prefill replica must carry (rate / prefill replicas) x prompt tokens x KV bytes
per token (131,072 for Llama-3-8B in bf16) with headroom, and a copy adds its duration / (n - 1)
to TPOT. Splits: RAG on 1P+3D starves prefill (TTFT p50 4.3 s, goodput 1.4) while 3P+1D matches
2P+2D (15.2; one decode GPU still holds TPOT p99 at 7.3 ms for 64-token answers); chat on 1P+3D
ties colocated (20.5 vs 20.6) and on 3P+1D collapses (3.8; TPOT p99 25 ms on one decode GPU).
Each workload wants its own ratio, which is why the pools must be sized separately (DistServe
searches it) and why a shifting mix is disaggregation's risk.""",
    "11.4": """\
**Model answer.** Modelled, Llama-3.1-405B in bf16 (810 GB), 4k context; throughput is the
steady state with p micro-batches in flight (no bubble: optimistic), TPOT in it p x the slowest
stage. On 16 GPUs (two nodes) it does not fit one node (101 GB a GPU at TP 8). TP 16 across
nodes: 56 ms TPOT at batch 8 (40 ms of it all-reduces over InfiniBand), 108 sequences of 4k,
1,130 tokens/s at that wall. TP 8 x PP 2: 34.6 ms at batch 8, 221 sequences, 4,770 tokens/s at
the wall with TPOT 46 ms, so it meets a 50 ms TPOT SLO even there (about 4,500 tokens/s at 204
sequences). TP 4 x PP 4: 63 ms, 208 sequences, 2,870 tokens/s; TP 2 x PP 8: 124 ms. TP 8 x PP 2
wins both goals: TP on NVLink, one send a step on InfiniBand. On 32 GPUs (four nodes): for
latency, two replicas of TP 8 x PP 2 (data parallelism) keep 34.6 ms at batch 8 and double the
throughput (about 9,000 tokens/s under 50 ms TPOT, 9,500 at the walls); TP 8 x PP 4 has the same
batch-8 TPOT (34.6 ms: stages in turn, each half as big) but holds 804 sequences because each
GPU keeps a quarter of the weights, so it reaches about 10,500 tokens/s under 50 ms TPOT and
14,000 at its wall (TPOT 57 ms): the throughput pick. Anything with TP 16 or TP 32 crosses
InfiniBand on every layer and loses (TP 16 x PP 2: 56 ms, 3,040 tokens/s). The answer is most
sensitive to the all-reduce model (the ring at peak with 1 us hops is optimistic for NCCL's
small messages, which would push TP 8 up and favour narrower TP with more stages), to the no-
bubble pipeline (a real engine with few micro-batches loses (p - 1)/(m + p - 1)), and to the
roofline's peak step times; fp8 weights (405 GB) would change the layout entirely (TP 8 in one
node would fit).""",
}
