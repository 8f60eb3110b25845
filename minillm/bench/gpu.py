"""The one prepared GPU run: kernel and engine figures, tests and a chapter, written to --out DIR.

Everything `bench kernels` measures, plus the engine on a Llama-3.2-1B-shaped model with
random weights in bf16 (a shape, not the checkpoint: nothing is downloaded):
- decode TPOT at batch 1 against the weight-bandwidth roofline, with and without CUDA graphs,
  and with graphs one step ahead (async_scheduling: the host's work hidden behind the device's):
  every decode step reads every weight once, so no step can beat weight bytes / copy bandwidth,
  both measured in this run;
- one decode step (forward and logits) replayed as a CUDA graph, against the same step eagerly
  and against the roofline: what is left between it and the TPOT is the engine's host work;
- throughput of the engine against transformers' generate on a nano-vllm-like workload (many
  sequences, prompts and outputs of 100-1024 random tokens), scaled to fit the run;
- the GPU-marked tests, and one chapter under nbval (minillm.bench.gpu_checks).
Writes DIR/gpu-bench.json and DIR/gpu-bench.md after every part (minillm.bench.gpu_report),
so a cut run keeps what it measured, with each part's seconds. The figures take 2-4 minutes on
an H100 (an estimate: it has not run on one yet); the tests and the chapter get what is left of
--budget (8 minutes), so the whole run fits a short loan. CUDA only. It imports nothing of the
server (FastAPI, uvicorn, aiohttp, openai), which a lent GPU machine does not have.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from minillm.bench import gpu_checks, kernels
from minillm.bench.engine import BenchRequest, generate_padded
from minillm.bench.gpu_report import Run, write_report
from minillm.bench.kernels import Figure
from minillm.cuda_graph import DecodeGraphRunner
from minillm.llm import LLM
from minillm.model import LlamaForCausalLM
from minillm.model_config import ModelConfig
from minillm.sampling import SamplingParams

LLAMA_3_2_1B = ModelConfig(
    vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
    num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
    rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True)
MODEL_NAME = "Llama-3.2-1B shape"
DEVICE = "cuda"  # the tests run the parts' code on the CPU by changing it


def make_llm(max_num_seqs: int, max_model_len: int, cuda_graphs: bool = True,
             **engine_args: object) -> LLM:
    """The engine on the 1B shape, with a KV pool of exactly max_num_seqs full sequences.
    Its trace keeps no block tables and only the last steps, as a long run should."""
    blocks = max_num_seqs * -(-max_model_len // 16)
    return LLM(LLAMA_3_2_1B, device=DEVICE, dtype="bfloat16", attention_backend="triton",
               block_size=16, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
               num_kv_blocks=blocks, enable_cuda_graphs=cuda_graphs, trace_block_tables=False,
               max_trace_steps=256, **engine_args)


def free() -> None:
    """Return the GPU memory of engines and models no longer referenced (the caller has
    dropped its references) to the device, so the next part starts from an empty pool."""
    gc.collect()
    torch.cuda.empty_cache()


def random_prompts(num: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(LLAMA_3_2_1B.vocab_size) for _ in range(length)] for _ in range(num)]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)


def decode_weight_bytes(model: LlamaForCausalLM) -> int:
    """Bytes of weight one decode step reads: every parameter once (tied ones once), except an
    untied embedding table, of which a step reads only its tokens' rows."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if not model.config.tie_word_embeddings:
        embed = model.model.embed_tokens.weight
        total -= embed.numel() * embed.element_size()
    return total


def tpot_figure(llm: LLM, roofline: float, new_tokens: int = 256) -> Figure:
    """Median TPOT of one request of 128 prompt tokens at batch 1, against the roofline (s)."""
    prompt = random_prompts(1, 128)
    llm.generate(prompt, greedy(8), use_tqdm=False)  # warm-up
    outs = [llm.generate(prompt, greedy(new_tokens), use_tqdm=False)[0] for _ in range(3)]
    tpot = statistics.median(o.metrics.tpot or 0.0 for o in outs)
    # Whether the engine captured graphs, not whether it was asked to: CPU or torch attention
    # run eagerly whatever the setting.
    graphs = "with" if getattr(llm.engine.runner, "graph_runner", None) is not None else "without"
    ahead = ", async scheduling" if llm.config.async_scheduling else ""
    return Figure(f"decode TPOT B=1, {MODEL_NAME}, {graphs} CUDA graphs{ahead}", tpot * 1e3,
                  "ms", "weight-bandwidth roofline", roofline * 1e3, roofline / tpot,
                  target=0.60 if graphs == "with" else None)


def graph_figures(llm: LLM, roofline: float) -> list[Figure]:
    """One batch-1 decode step (forward over the static padded buffers, then logits) replayed
    as a CUDA graph, against the same step run eagerly and against the roofline."""
    engine = llm.engine
    model = engine.model

    def step_time(capture: bool) -> float:
        runner = DecodeGraphRunner(model, engine.runner.kv_cache, engine.runner.backend,
                                   engine.config, capture=capture)
        return kernels.cuda_time(lambda: model.compute_logits(runner.forward_bucket(1)))

    eager, graph = step_time(capture=False), step_time(capture=True)
    name = "decode step B=1 (forward + logits): CUDA graph replay"
    return [
        Figure(name, graph * 1e3, "ms", "the same step eagerly", eager * 1e3, eager / graph),
        Figure(name, graph * 1e3, "ms", "weight-bandwidth roofline", roofline * 1e3,
               roofline / graph),
    ]


def nano_vllm_workload(num_seqs: int, vocab_size: int, seed: int = 0,
                       lengths: tuple[int, int] = (100, 1024)) -> list[BenchRequest]:
    """nano-vllm's benchmark: random prompts and outputs, each of a uniform 100-1024 tokens."""
    rng = random.Random(seed)
    return [BenchRequest([rng.randrange(vocab_size) for _ in range(rng.randint(*lengths))],
                         rng.randint(*lengths)) for _ in range(num_seqs)]


def transformers_model(config: ModelConfig) -> torch.nn.Module:
    """transformers' Llama of the same shape in bf16, with its own random weights: every
    output length is fixed (ignore_eos, min_new_tokens), so the work does not depend on them."""
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HFLlama

    c = config
    hf_config = LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
        head_dim=c.head_dim, max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
        tie_word_embeddings=c.tie_word_embeddings)
    with torch.device(DEVICE):
        hf = HFLlama(hf_config)
    return hf.to(torch.bfloat16).eval()


def wall_time(fn: Callable[[], object]) -> float:
    """Seconds of one fn() call, the GPU's queue drained before and after."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def minillm_seconds(reqs: list[BenchRequest], warmup: list[BenchRequest]) -> float:
    """Seconds for the engine to serve every request, all queued at once as nano-vllm's
    benchmark does, after a warm-up on a few short ones."""
    llm = make_llm(max_num_seqs=len(reqs), max_model_len=2048, max_num_batched_tokens=8192)

    def serve(batch: list[BenchRequest]) -> None:
        llm.generate([r.prompt_token_ids for r in batch], [greedy(r.max_tokens) for r in batch],
                     use_tqdm=False)

    serve(warmup)
    return wall_time(lambda: serve(reqs))


def transformers_seconds(reqs: list[BenchRequest], warmup: list[BenchRequest], batch: int
                         ) -> float:
    """Seconds for transformers' generate over padded batches in arrival order, each run to
    its longest request's output, after a warm-up on a few short ones."""
    hf = transformers_model(LLAMA_3_2_1B)
    generate_padded(hf, warmup, pad=0)
    return wall_time(lambda: [generate_padded(hf, reqs[i:i + batch], pad=0)
                              for i in range(0, len(reqs), batch)])


def engine_vs_transformers(num_seqs: int, hf_batch: int) -> list[Figure]:
    """Output tokens/s of the engine and of transformers' generate on the nano-vllm-like
    workload; throughput counts requested tokens only (generate's padding work is its cost)."""
    reqs = nano_vllm_workload(num_seqs, LLAMA_3_2_1B.vocab_size)
    warmup = nano_vllm_workload(4, LLAMA_3_2_1B.vocab_size, seed=1, lengths=(16, 64))
    tokens = sum(r.max_tokens for r in reqs)
    ours = minillm_seconds(reqs, warmup)
    free()
    theirs = transformers_seconds(reqs, warmup, hf_batch)
    free()
    name = (f"nano-vllm-like: {num_seqs} seqs, prompts and outputs 100-1024 tokens "
            f"({tokens} out): minillm")
    return [Figure(name, tokens / ours, "tokens/s",
                   f"transformers generate, padded batches of {hf_batch}", tokens / theirs,
                   theirs / ours, target=3.0)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kernels.add_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("."),
                        help="folder for gpu-bench.json, gpu-bench.md and the tests' logs")
    parser.add_argument("--num-seqs", type=int, default=128,
                        help="sequences of the nano-vllm-like workload (nano-vllm runs 256)")
    parser.add_argument("--hf-batch", type=int, default=64,
                        help="transformers generate's padded batch size on that workload")
    parser.add_argument("--chapter", default="04_paged_attention",
                        help="the chapter run under nbval")
    parser.add_argument("--budget", type=float, default=470.0,
                        help="seconds for the whole run: the tests and the chapter get the rest")


def engine_parts(run: Run, args: argparse.Namespace, copy_bandwidth: float) -> None:
    """TPOT without and with CUDA graphs (and one step ahead), the graph step, and the
    nano-vllm-like workload."""
    synchronous: list[Figure] = []

    def tpot(graphs: bool, async_scheduling: bool = False) -> list[Figure]:
        llm = make_llm(max_num_seqs=16, max_model_len=1024, cuda_graphs=graphs,
                       async_scheduling=async_scheduling)
        weight_bytes = decode_weight_bytes(llm.model)
        roofline = weight_bytes / copy_bandwidth
        run.notes["model"] = (f"{MODEL_NAME} with random bf16 weights, "
                              f"{weight_bytes / 1e9:.2f} GB of weights read per decode step")
        figures = [tpot_figure(llm, roofline)]
        if async_scheduling and synchronous:  # the same TPOT, one step ahead against not
            sync_ms, ahead_ms = synchronous[0].value, figures[0].value
            figures.append(Figure(figures[0].name, ahead_ms, "ms", "the synchronous loop",
                                  sync_ms, sync_ms / ahead_ms))
        elif graphs:
            run.notes["engine captured CUDA graphs"] = (
                getattr(llm.engine.runner, "graph_runner", None) is not None)
            synchronous[:] = figures
            figures += graph_figures(llm, roofline)
        return figures

    run.part("TPOT without CUDA graphs", lambda: tpot(graphs=False))
    free()
    run.part("TPOT with CUDA graphs", lambda: tpot(graphs=True))
    free()
    run.part("TPOT with CUDA graphs, one step ahead",
             lambda: tpot(graphs=True, async_scheduling=True))
    free()
    run.part("engine vs transformers",
             lambda: engine_vs_transformers(args.num_seqs, args.hf_batch))


def main(args: argparse.Namespace) -> int:
    """Measure every part, writing the report after each; 1 if a part failed, else 0."""
    import triton

    start = time.perf_counter()
    device = torch.device("cuda")
    run = Run(args.out, {"device": torch.cuda.get_device_name(device),
                         "torch": torch.__version__, "triton": triton.__version__})
    base = kernels.measure_baselines(device)
    run.notes["copy bandwidth (GB/s, read + write)"] = round(base.copy_bandwidth / 1e9, 1)
    run.notes["dense bf16 matmul (TFLOP/s)"] = round(base.matmul_flops / 1e12, 1)
    run.part("kernels", lambda: kernels.kernel_figures(args, base, device))
    engine_parts(run, args, base.copy_bandwidth)
    free()  # the engines above are gone; the tests and the chapter allocate their own

    def left(reserve: float) -> float:  # seconds of the budget left, less a reserve; >= 60
        return max(60.0, args.budget - (time.perf_counter() - start) - reserve)

    run.check("GPU tests", lambda: gpu_checks.gpu_tests(args.out, timeout=left(reserve=100)))
    run.check(f"chapter {args.chapter} under nbval",
              lambda: gpu_checks.chapter_under_nbval(args.chapter, args.out, timeout=left(0)))
    run.notes["seconds: whole run"] = round(time.perf_counter() - start, 1)
    write_report(args.out, run.figures, run.notes)
    print((args.out / "gpu-bench.md").read_text())
    return 0 if run.ok else 1
