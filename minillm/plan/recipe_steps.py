"""Steps 1-3 of the starting-config recipe (minillm.recipe): the calculators of chapters 03, 06
and 11 that choose a layout, max_num_seqs and the chunk before anything is simulated.

1. choose_layout: the smallest TP inside a node, then pipeline stages across nodes, at which the
   weights and MIN_FULL_SEQUENCES sequences of the longest request fit each GPU;
2. choose_max_num_seqs: the KV formula, the sequences of typical length the pool holds;
3. choose_batched_tokens: the largest chunk whose mixed step keeps the TPOT SLO.

Each appends a sentence of reasoning with its figures; quantization (minillm.quant.schemes)
prices the weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from minillm.calc import parallel, roofline
from minillm.calc.hardware import Hardware
from minillm.metrics import percentile
from minillm.plan.deployment import GPU_MEMORY_UTILIZATION
from minillm.quant.schemes import QuantScheme, get_scheme
from minillm.workloads.streams import RequestSpec

MAX_NUM_SEQS_CAP = 256  # vLLM's default max_num_seqs; the search may still try twice it
MIN_BATCHED_TOKENS = 512  # below it a prefill chunk is too small to use the GPU's FLOPs
MAX_BATCHED_TOKENS = 16384  # the largest budget step 3 and the search try
MIN_FULL_SEQUENCES = 4  # "fits" means a few longest requests at once, not one


def tp_options(config: Any, device: Hardware, gpus: int) -> list[int]:
    """Powers of two up to the GPUs given and one node's, that split the model's heads."""
    options, tp = [], 1
    while tp <= min(gpus, device.gpus_per_node):
        try:
            parallel.ParallelConfig(tp).check(config)
            options.append(tp)
        except ValueError:
            pass
        tp *= 2
    return options


def layout_name(layout: parallel.ParallelConfig) -> str:
    tp, pp = layout.tensor_parallel_size, layout.pipeline_parallel_size
    return f"TP {tp}" if pp == 1 else f"TP {tp} x PP {pp}"


def _layouts(config: Any, device: Hardware, gpus: int) -> list[parallel.ParallelConfig]:
    """The layouts step 1 tries, in order: TP alone inside a node, smallest first; then, when
    the GPUs span nodes, the widest such TP with 2, 3, ... pipeline stages across nodes."""
    tps = tp_options(config, device, gpus)
    layouts = [parallel.ParallelConfig(tp) for tp in tps]
    if tps:
        widest = tps[-1]
        layers = config.num_hidden_layers
        layouts += [parallel.ParallelConfig(widest, pp)
                    for pp in range(2, min(gpus // widest, layers) + 1)]
    return layouts


def choose_layout(config: Any, device: Hardware, gpus: int, longest: int,
                  reasoning: list[str], *, quantization: str | None = None
                  ) -> parallel.ParallelConfig:
    """Step 1: the first layout of _layouts at which the weights (in quantization's bytes)
    and MIN_FULL_SEQUENCES sequences of the longest request's length fit each GPU; ValueError
    naming what does not fit if none does."""
    scheme = get_scheme(quantization)
    layouts = _layouts(config, device, gpus)
    if not layouts:
        raise ValueError(f"no tensor_parallel_size up to {gpus} GPUs splits this model's heads")
    usable = device.memory * GPU_MEMORY_UTILIZATION
    previous = None
    for layout in layouts:
        full = _max_concurrency(config, device, layout, longest, scheme)
        weights = parallel.weight_bytes_per_gpu(config, layout, scheme.weight_bytes)
        if full >= MIN_FULL_SEQUENCES:
            reasoning.append(
                f"{layout_name(layout)}: the weights take {weights / 1e9:.1f} GB per GPU of the "
                f"{usable / 1e9:.1f} GB usable ({GPU_MEMORY_UTILIZATION:.0%} of "
                f"{device.memory / 1e9:.0f} GB on {device.name}), leaving room for {full} "
                f"sequences of the longest request ({longest} tokens); "
                + ("no need to split the model." if previous is None else
                   f"{layout_name(previous)} would hold fewer than {MIN_FULL_SEQUENCES}"
                   + (" (pipeline stages cross nodes: TP stays inside one)."
                      if layout.pipeline_parallel_size > 1 else ".")))
            return layout
        previous = layout
    last = layouts[-1]
    weights = parallel.weight_bytes_per_gpu(config, last, scheme.weight_bytes)
    if weights > usable:
        raise ValueError(
            f"the weights alone need {weights / 1e9:.1f} GB per GPU at {layout_name(last)} (the "
            f"widest layout {gpus} GPU(s) of {device.name} allow, TP inside a node of "
            f"{device.gpus_per_node}), more than its {usable / 1e9:.1f} GB usable; give more "
            f"GPUs, a bigger GPU or quantized weights")
    raise ValueError(
        f"the KV cache: at {layout_name(last)} the weights ({weights / 1e9:.1f} GB per GPU) leave "
        f"room for fewer than {MIN_FULL_SEQUENCES} sequences of the longest request "
        f"({longest} tokens) in {usable / 1e9:.1f} GB; give more GPUs or shorten the requests")


def _max_concurrency(config: Any, device: Hardware, layout: parallel.ParallelConfig,
                     seq_len: int, scheme: QuantScheme) -> int:
    return parallel.max_concurrency(config, device, layout, seq_len, GPU_MEMORY_UTILIZATION,
                                    scheme.weight_bytes, kv_dtype_bytes=2)


def choose_max_num_seqs(config: Any, device: Hardware, layout: parallel.ParallelConfig,
                        typical: int, reasoning: list[str], *,
                        quantization: str | None = None) -> int:
    """Step 2: the KV formula, (usable memory - weights) / KV bytes per typical sequence,
    capped at MAX_NUM_SEQS_CAP. Under pipeline parallelism max_num_seqs holds for each of the p
    virtual engines, which own 1/p of the blocks each (minillm.virtual_engines, as vLLM): the
    sequences that fit are shared among them."""
    scheme = get_scheme(quantization)
    free = (device.memory * GPU_MEMORY_UTILIZATION
            - parallel.weight_bytes_per_gpu(config, layout, scheme.weight_bytes))
    per_seq = parallel.kv_bytes_per_token_per_gpu(config, layout) * typical
    fit = _max_concurrency(config, device, layout, typical, scheme)
    p = layout.pipeline_parallel_size
    seqs = max(min(fit // p, MAX_NUM_SEQS_CAP), 1)
    shared = (f", {fit // p} for each of the {p} virtual engines (each owns 1/{p} of the blocks)"
              if p > 1 else "")
    reasoning.append(
        f"max_num_seqs {seqs}: the KV formula gives {free / 1e9:.1f} GB free per GPU / "
        f"{per_seq / 1e6:.1f} MB per sequence of typical length ({typical} tokens: p90 of "
        f"prompt + output) = {fit} sequences" + shared
        + (f", capped at {MAX_NUM_SEQS_CAP}." if fit // p > MAX_NUM_SEQS_CAP else "."))
    return seqs


def choose_batched_tokens(config: Any, device: Hardware, layout: parallel.ParallelConfig,
                          seqs: int, typical: int, workload: Sequence[RequestSpec],
                          slo: dict[str, float], reasoning: list[str],
                          overheads: roofline.StepOverheads | None = None, *,
                          quantization: str | None = None, interference: float = 0.0) -> int:
    """Step 3: the largest power-of-two budget (MIN_BATCHED_TOKENS..MAX_BATCHED_TOKENS) whose
    mixed step, one chunk of the budget beside seqs - 1 decodes at the typical context, stays
    under the TPOT SLO (without one: the p90 prompt in one chunk); steps priced in
    quantization's scheme, with interference between the chunk and the decodes as
    roofline.serial_phases prices it (0: the roofline of the whole step)."""
    step_kwargs = get_scheme(quantization).step_kwargs()
    overheads = roofline.StepOverheads.of(overheads)
    price = roofline.serial_phases(parallel.step_timer(layout), interference)
    prompt_p90 = math.ceil(percentile([s.prompt_len for s in workload], 90))

    def mixed_step(budget: int) -> float:
        decodes = [(1, typical)] * (seqs - 1)
        return price(config, device, [(budget, budget)] + decodes, **overheads.as_keywords(),
                     **step_kwargs).time

    tpot = slo.get("tpot")
    budget = MIN_BATCHED_TOKENS
    if tpot is None:
        while budget < min(prompt_p90, MAX_BATCHED_TOKENS):
            budget *= 2
        why = f"no TPOT SLO, so the p90 prompt ({prompt_p90} tokens) goes in one chunk"
    else:
        while budget < MAX_BATCHED_TOKENS and mixed_step(budget * 2) <= tpot:
            budget *= 2
        why = (f"a step of one {budget}-token chunk beside {seqs - 1} decodes takes "
               f"{mixed_step(budget) * 1e3:.1f} ms, "
               + ("under" if mixed_step(budget) <= tpot else "over")
               + f" the TPOT SLO of {tpot * 1e3:.1f} ms"
               + ("" if mixed_step(budget) <= tpot else
                  f", but {MIN_BATCHED_TOKENS} is the floor"))
    chunks = math.ceil(prompt_p90 / budget)
    reasoning.append(
        f"max_num_batched_tokens {budget} (chunked prefill): {why}; the p90 prompt "
        f"({prompt_p90} tokens) then needs {chunks} chunk(s), about "
        f"{chunks * mixed_step(budget) * 1e3:.0f} ms of TTFT before any queueing.")
    return budget
