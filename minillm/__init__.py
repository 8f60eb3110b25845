"""minillm: a compact, real LLM inference engine that the textbook's chapters measure live.

The tree is the layering. Imports point one way, up these layers (tests/test_import_layers.py
parses every import and checks it):

    calc/         the calculators: datasheets, model shapes, sizing, the roofline, links and
                  parallelism, preemption prices; no engine code
    (top level)   the engine core, flat, as the chapters show it: a request's way from
                  LLM.generate to tokens (below)
    attention/ quant/ spec/  paged attention backends, quantization, speculative decoding:
                  the core's three pluggable parts
    workloads/    request streams and Arrivals, the one driver that releases them
    sim/          the simulator and the fleet: the core's scheduler on a virtual clock
    serve/        serving: the HTTP server, the benchmark client, replays and real runs
    plan/         deployment planning: the recipe, disaggregation, dashboards, failure modes,
                  diagnosis, the capstone, calibration
    this file     the public API
    labs/ bench/ train/ cli.py  what readers run: graded exercises, benchmarks, training

The engine core, one concept per module:

    config.py        EngineConfig: block size, budgets, scheduling policy, pool size
    model_config.py  ModelConfig: a Llama-family shape read from a Hugging Face config.json
    model.py         the decoder (RMSNorm, RoPE, GQA attention, SwiGLU) and checkpoint loading;
                     layers/ holds its merged Linears and fused Triton ops
    tokenizer.py     the checkpoint's tokenizer and incremental detokenization
    request.py       Request (tokens, progress, block table), RequestOutput, a step's plan
    sampling.py      SamplingParams and the batched Sampler (greedy, temperature, top-k, top-p)
    kv_cache.py      the paged KV pool and BlockManager (ref counts); prefix_cache/ holds the
                     reuse designs (hash chain of blocks, vLLM's; radix tree, SGLang's)
    waiting_queue.py the admission order: arrival (fcfs), priority with ageing, longest prefix
    scheduler.py     continuous / static batching, chunked prefill, preemption (recompute or
                     swap), why waiting requests were not admitted
    swap.py          preemption by swap: the host pool's blocks and the copies out and back
    batch.py         one step flattened into tensors: input ids, positions, slots, block tables
    model_runner.py  ModelRunner, the device side: weights, K/V pool, swaps, graphs, batch tensors
    cuda_graph.py    decode steps replayed as CUDA graphs, one per batch-size bucket (GPU)
    engine.py        the step loop: schedule, run the step (the runner), sample, stop checks, trace
    llm.py           LLM: generate, stream, stats, trace
    metrics.py       RequestMetrics (TTFT, TPOT, ITL, E2E) and summaries with percentiles
    trace.py         StepRecord: what each step ran, for the widgets
    device.py        capabilities(): what the device can do (dtype, K/V dtypes, kernels, fit);
                     the GPU-shaped run (a T4's or an H200's rules on the CPU)
    quality.py       perplexity through the engine on the held-out play (assets/the_tempest.txt)

Each folder's __init__ lists its modules. A module that moved into a folder keeps its short
name: `minillm.roofline` is `minillm.calc.roofline` (MOVED below), so chapters and labs read
`from minillm.roofline import step_time` and the file is calc/roofline.py.
"""

import importlib
import importlib.abc
import importlib.util
import sys

from minillm.calc import models, parallel, roofline
from minillm.calc.parallel import ParallelConfig
from minillm.calc.roofline import StepOverheads
from minillm.calc.sizing import cost_per_million_tokens, kv_cache_bytes, max_concurrency
from minillm.config import EngineConfig
from minillm.llm import LLM, default_draft_path, default_model_path
from minillm.metrics import RequestMetrics, summarize
from minillm.model_config import ModelConfig
from minillm.plan.disaggregation import simulate_disaggregated
from minillm.plan.recipe import Recommendation, recommend
from minillm.request import RequestOutput
from minillm.sampling import SamplingParams
from minillm.sim.fleet import simulate_fleet
from minillm.sim.simulator import simulate
from minillm.trace import ScheduledEntry, StepRecord

__all__ = [
    "LLM",
    "EngineConfig",
    "ModelConfig",
    "ParallelConfig",
    "Recommendation",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
    "ScheduledEntry",
    "StepOverheads",
    "StepRecord",
    "cost_per_million_tokens",
    "default_draft_path",
    "default_model_path",
    "kv_cache_bytes",
    "max_concurrency",
    "models",
    "parallel",
    "recommend",
    "roofline",
    "simulate",
    "simulate_disaggregated",
    "simulate_fleet",
    "summarize",
]


# The short names of modules that live in folders: minillm.<short> imports minillm.<home>, one
# module under two names (the short one is what chapters, labs and readers' code import).
MOVED = {
    **{name: f"calc.{name}" for name in (
        "hardware", "models", "sizing", "roofline", "collectives", "parallel", "preemption",
        "machine")},
    "workload": "workloads.streams", "prefix_workload": "workloads.prefixes",
    **{name: f"sim.{name}" for name in (
        "simulated_pool", "simulated_engine", "simulator", "virtual_engines", "router", "fleet",
        "kv_handover")},
    **{name: f"serve.{name}" for name in (
        "serving", "serving_result", "server_process", "real_run")},
    **{name: f"plan.{name}" for name in (
        "deployment", "recipe_steps", "recipe", "disaggregation", "autoscale", "dashboard",
        "failure_modes", "diagnosis", "capstone", "calibration")},
    "merged_weights": "layers.merged_weights", "fused_ops": "layers.fused_ops",
    "radix_cache": "prefix_cache.radix",
}


class _ShortNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds minillm.<short> for each name in MOVED and loads it as the module at its home."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, short = fullname.rpartition(".")
        if package != __name__ or short not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(f"{__name__}.{MOVED[spec.name.rpartition('.')[2]]}")
        spec.loader_state = module.__spec__  # the import system overwrites it; put it back
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state  # already run under its home's name


if not any(isinstance(finder, _ShortNames) for finder in sys.meta_path):
    sys.meta_path.append(_ShortNames())


def __getattr__(name: str):
    """minillm.<short> as an attribute (minillm.simulator) imports it under its short name."""
    if name in MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
