"""minillm: a compact, real LLM inference engine that the textbook's chapters measure live.

Imports point one way, up these layers (tests/test_import_layers.py): calculators, engine
core, workloads, simulator and fleet, serving and measurement, deployment planning, this public
API, then what readers run (widgets, labs, bench, train, the CLI). See the README's module map.

Module map (one concept each):

    config.py        EngineConfig: block size, budgets, scheduling policy, pool size
    model_config.py  ModelConfig: a Llama-family shape read from a Hugging Face config.json
    model.py         the decoder (RMSNorm, RoPE, GQA attention, SwiGLU) and checkpoint loading
    models.py        named shapes of public models (llama-3-8b, qwen3-0.6b, ...) for the
                     calculators; LlamaForCausalLM.random (model.py) fills one with weights
    tokenizer.py     the checkpoint's tokenizer and incremental detokenization
    request.py       Request (tokens, progress, block table) and RequestOutput
    sampling.py      SamplingParams and the batched Sampler (greedy, temperature, top-k, top-p)
    kv_cache.py      the paged KV pool, BlockManager (ref counts) and the prefix cache
                     (hash chain of blocks, vLLM's; or radix_cache.py's tree, SGLang's)
    scheduler.py     continuous / static batching, chunked prefill, preemption (recompute or
                     swap), why waiting requests were not admitted
    waiting_queue.py the admission order: arrival (fcfs), priority with ageing, longest cached
                     prefix (lpm)
    swap.py          preemption by swap: the host pool's blocks and the copies out and back
    preemption.py    what a preemption costs on a GPU, recompute vs swap, and the crossover
    batch.py         one step flattened into tensors: input ids, positions, slots, block tables
    attention/       paged attention backends: torch_ref (reference) and, on GPU, Triton;
                     tiles.py picks each kernel's tiles by compute capability
    merged_weights.py  merged qkv / gate_up Linears that keep the checkpoint's names
    fused_ops.py     Triton kernels for the decoder's small ops (add+RMSNorm, q/k rotary,
                     silu-and-mul), used on CUDA; model.py holds their PyTorch references
    model_runner.py  ModelRunner, the device side: weights, K/V pool, swaps, graphs, batch tensors
    engine.py        the step loop: schedule, run the step (the runner), sample, stop checks, trace
    cuda_graph.py    decode steps replayed as CUDA graphs, one per batch-size bucket (GPU)
    llm.py           LLM: generate, stream, stats, trace
    metrics.py       RequestMetrics (TTFT, TPOT, ITL, E2E) and summaries with percentiles
    trace.py         StepRecord: what each step ran, for the widgets
    sizing.py        KV-cache and weight bytes, the KV wall (max_concurrency), $ per 1M tokens
    hardware.py      Hardware: datasheet peaks of common GPUs, their host links (HARDWARE)
                     and GPU-to-GPU links (LINKS: NVLink, PCIe, InfiniBand, Ethernet)
    parallel.py      tensor and pipeline parallelism: weights and KV per GPU, all-reduce,
                     a TP x PP step's cost, bubbles: ParallelConfig, decode_tpot
    collectives.py   what crossing a link costs: ring all-reduce, sends, pipeline bubbles
    roofline.py      ridge points, the step cost model, measure_machine()
    workload.py      request streams: Poisson (open loop), closed loop, shared prefixes; lengths;
                     Arrivals, the simulated runs' one driver of either loop
    prefix_workload.py  shared-prefix and multi-turn workloads with explicit token ids, and
                     the ceiling an ideal prefix cache reaches on them
    serving.py       replay a workload in real time (in-process, no HTTP)
    server_process.py  minillm serve in a process of its own: ServerProcess (start-up timed)
    serving_result.py  a serving run's report: per-request records, vLLM's figures and JSON
    serve/           minillm serve (OpenAI-compatible HTTP server) and the benchmark client
    simulator.py     simulate(): a workload through the simulated engine, priced by the roofline
    simulated_engine.py  Simulator: the real scheduler and block manager on a virtual clock
    simulated_pool.py  the simulated GPU's KV pool: blocks left after the weights, per layout
    fleet.py         N simulated replicas behind a router on one virtual clock: simulate_fleet()
    disaggregation.py  prefill and decode pools, the K/V shipped over a link between them:
                     simulate_disaggregated(), compare_disaggregation() with colocated serving
    kv_handover.py   the decode replica that takes in prompt K/V computed elsewhere
    deployment.py    a multi-GPU deployment (TP x PP x replicas, scheduler knobs) and its
                     modelled run: run_deployment() -> goodput, SLO attainment, $/1M tokens
    recipe.py        recommend(): the starting-config recipe as code (TP, max_num_seqs, the
                     chunk size, then a goodput search in the simulator) and its reasoning
    recipe_steps.py  the recipe's steps 1-3: choose_layout, choose_max_num_seqs, the chunk
    capstone.py      chapter 11's capstone: worked briefs, each student's seeded brief
                     (student_scenario), evaluate() and the recipe's bar
    router.py        routers: round robin, prefix-aware with a load bound, or your own callable
    autoscale.py     what a fleet scales on: GPU busy time, queue depth, SLO attainment; the
                     replica count each rule settles on, and /metrics parsing
    dashboard.py     a run as an operator reads it: p99s, goodput, preemptions/min, KV usage
    failure_modes.py the guide's failure-modes table reproduced in the simulator: reproduce_all()
    diagnosis.py     seeded mystery deployments for the diagnosis lab: mystery_deployment()
    quant/           weight-only int8 (per-channel scales; a Triton GEMM on CUDA): quantization=;
                     the int8 / fp8 KV cache with per-head scales: kv_cache_dtype=
    spec/            speculative decoding: prompt lookup or a draft model proposes, one target
                     forward checks (rejection sampling: lossless); its cost model
    quality.py       perplexity through the engine on the held-out play (assets/the_tempest.txt)
    calibration.py   fit the simulator's step overheads to this machine and report its error
    real_run.py      a workload served on the real engine in real time (wall or CPU clock)
    labs/            check(): graded exercises of the chapters; python -m minillm.labs chNN
    machine.py       describe() / settle_threads(): the hardware a chapter measured on
    device.py        capabilities(): what the device can do (dtype, K/V dtypes, kernels, fit);
                     the GPU-shaped run (a T4's or an H200's rules on the CPU)
    train/           the training script of the shipped tiny model (python -m minillm.train)
    cli.py           the `minillm` console script: minillm serve ..., minillm bench ...
    bench/           python -m minillm.bench engine|serve|simulate|prefix|preempt|spec|quant|
                     host|kernels|gpu|tiles|chapters: side-by-side ratios; gpu_checks.py: the GPU
                     tests and a chapter for `bench gpu`
"""

from minillm import models, parallel, roofline
from minillm.config import EngineConfig
from minillm.disaggregation import simulate_disaggregated
from minillm.fleet import simulate_fleet
from minillm.llm import LLM, default_draft_path, default_model_path
from minillm.metrics import RequestMetrics, summarize
from minillm.model_config import ModelConfig
from minillm.parallel import ParallelConfig
from minillm.recipe import Recommendation, recommend
from minillm.request import RequestOutput
from minillm.sampling import SamplingParams
from minillm.simulator import simulate
from minillm.sizing import cost_per_million_tokens, kv_cache_bytes, max_concurrency
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
