"""The one prepared GPU run: kernel and engine figures, written to --out DIR as JSON and Markdown.

Everything `bench kernels` measures, plus the engine on a Llama-3.2-1B-shaped model with
random weights in bf16 (a shape, not the checkpoint: nothing is downloaded):
- decode TPOT at batch 1 against the weight-bandwidth roofline: every decode step reads every
  weight once, so no step can beat weight bytes / copy bandwidth, both measured in this run;
- one decode step (forward and logits) replayed as a CUDA graph, against the same step eagerly
  and against the roofline: what is left between it and the TPOT is the engine's host work;
- generation throughput of the engine against transformers' generate on the same weights;
- every chapter's code cells on this GPU (`bench chapters`): which cells, and asserts, held.
Writes DIR/gpu-bench.json and DIR/gpu-bench.md (after every part, so a cut run keeps what it
measured). Takes a few minutes on an H100/H200; CUDA only.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from minillm.bench import chapters, kernels
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


def make_llm(max_num_seqs: int, max_model_len: int) -> LLM:
    """The engine on the 1B shape, with a KV pool of exactly max_num_seqs full sequences."""
    blocks = max_num_seqs * -(-max_model_len // 16)
    return LLM(LLAMA_3_2_1B, device="cuda", dtype="bfloat16", attention_backend="triton",
               block_size=16, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
               num_kv_blocks=blocks)


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
    return Figure(f"decode TPOT B=1, {MODEL_NAME}", tpot * 1e3, "ms",
                  "weight-bandwidth roofline", roofline * 1e3, roofline / tpot, target=0.60)


def graph_figures(llm: LLM, roofline: float) -> list[Figure]:
    """One batch-1 decode step (forward over the static padded buffers, then logits) replayed
    as a CUDA graph, against the same step run eagerly and against the roofline."""
    engine = llm.engine
    model = engine.model

    def step_time(capture: bool) -> float:
        runner = DecodeGraphRunner(model, engine.kv_cache, engine.backend, engine.config,
                                   capture=capture)
        return kernels.cuda_time(lambda: model.compute_logits(runner.forward_bucket(1)))

    eager, graph = step_time(capture=False), step_time(capture=True)
    name = "decode step B=1 (forward + logits): CUDA graph replay"
    return [
        Figure(name, graph * 1e3, "ms", "the same step eagerly", eager * 1e3, eager / graph),
        Figure(name, graph * 1e3, "ms", "weight-bandwidth roofline", roofline * 1e3,
               roofline / graph),
    ]


def transformers_model(model: LlamaForCausalLM) -> torch.nn.Module:
    """transformers' Llama with the same weights (the state dict names are the same)."""
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HFLlama

    c = model.config
    config = LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
        head_dim=c.head_dim, max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
        tie_word_embeddings=c.tie_word_embeddings)
    with torch.device("cuda"):
        hf = HFLlama(config)
    hf = hf.to(torch.bfloat16).eval()
    hf.load_state_dict(model.state_dict())
    return hf


def seconds(fn: Callable[[], object]) -> float:
    """Median wall time of fn() over two runs, after an untimed warm-up run."""
    times = []
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def transformers_seconds(model: LlamaForCausalLM, prompts: list[list[int]], new_tokens: int
                         ) -> float:
    """Seconds for transformers' greedy generate over the prompts as one batch."""
    hf = transformers_model(model)
    ids = torch.tensor(prompts, device="cuda")

    def generate() -> None:
        with torch.inference_mode():
            hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                        pad_token_id=0)

    return seconds(generate)


def throughput_figure(llm: LLM, batch: int = 16, prompt_len: int = 128,
                      new_tokens: int = 128) -> Figure:
    """Output tokens/s of the engine and of transformers' generate, same prompts and weights.
    The prompts are of one length, so generate pads nothing and both do the same work."""
    prompts = random_prompts(batch, prompt_len, seed=1)
    ours = seconds(lambda: llm.generate(prompts, greedy(new_tokens), use_tqdm=False))
    theirs = transformers_seconds(llm.model, prompts, new_tokens)
    torch.cuda.empty_cache()
    tokens = batch * new_tokens
    return Figure(f"generate B={batch}, {prompt_len} + {new_tokens} tokens: minillm", tokens / ours,
                  "tokens/s", "transformers generate", tokens / theirs, theirs / ours)


def write_report(out: Path, figures: list[Figure], notes: dict[str, object]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report = {"notes": notes, "figures": [f.as_dict() for f in figures]}
    (out / "gpu-bench.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["# minillm GPU benchmark", ""] + [f"- {k}: {v}" for k, v in notes.items()]
    (out / "gpu-bench.md").write_text("\n".join(lines + ["", kernels.format_table(figures), ""]))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kernels.add_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("."),
                        help="folder for gpu-bench.json and gpu-bench.md")


def main(args: argparse.Namespace) -> int:
    """Measure every part, writing the report after each; 1 if a part failed, else 0."""
    import triton

    device = torch.device("cuda")
    notes: dict[str, object] = {"device": torch.cuda.get_device_name(device),
                                "torch": torch.__version__, "triton": triton.__version__}
    base = kernels.measure_baselines(device)
    notes["copy bandwidth (GB/s, read + write)"] = round(base.copy_bandwidth / 1e9, 1)
    notes["dense bf16 matmul (TFLOP/s)"] = round(base.matmul_flops / 1e12, 1)
    figures: list[Figure] = []
    ok = measure(figures, notes, args.out, "kernels",
                 lambda: kernels.kernel_figures(args, base, device))
    ok &= engine_parts(figures, notes, args.out, base.copy_bandwidth)
    torch.cuda.empty_cache()  # the engine above is gone; the chapters allocate their own
    ok &= chapter_part(notes, args.out)
    write_report(args.out, figures, notes)
    print((args.out / "gpu-bench.md").read_text())
    return 0 if ok else 1


def engine_parts(figures: list[Figure], notes: dict[str, object], out: Path,
                 copy_bandwidth: float) -> bool:
    """TPOT, CUDA-graph and generate figures of the engine on the 1B shape."""
    llm = make_llm(max_num_seqs=16, max_model_len=1024)
    weight_bytes = decode_weight_bytes(llm.model)
    roofline = weight_bytes / copy_bandwidth
    notes["model"] = (f"{MODEL_NAME} with random bf16 weights, {weight_bytes / 1e9:.2f} GB of "
                      "weights read per decode step")
    notes["engine uses CUDA graphs"] = getattr(llm.engine, "graph_runner", None) is not None
    ok = measure(figures, notes, out, "TPOT", lambda: [tpot_figure(llm, roofline)])
    ok &= measure(figures, notes, out, "CUDA graph", lambda: graph_figures(llm, roofline))
    return ok & measure(figures, notes, out, "generate", lambda: [throughput_figure(llm)])


def chapter_part(notes: dict[str, object], out: Path) -> bool:
    """Every chapter's code cells on this GPU; the per-cell results go to out/chapters.json."""
    runs = chapters.run_all(chapters.chapter_paths(), out)
    notes["chapters (code cells passed)"] = "; ".join(
        f"{r.chapter} {r.passed}/{r.cells}"
        + ("" if r.ok else f" (failed cells: {[f.cell for f in r.failures]})") for r in runs)
    return all(r.ok for r in runs)


def measure(figures: list[Figure], notes: dict[str, object], out: Path, part: str,
            fn: Callable[[], list[Figure]]) -> bool:
    """Add one part's figures and rewrite the report. A part that fails is noted, with its
    traceback printed, and the run goes on: one failure must not cost the other figures."""
    try:
        new = fn()
    except Exception as error:
        traceback.print_exc()
        notes[f"{part} failed"] = f"{type(error).__name__}: {error}"
        new = []
    figures += new
    write_report(out, figures, notes)
    for f in new:
        print(f"{f.name}: {kernels.number(f.value)} {f.unit}, {f.ratio:.2f} x {f.baseline_name}",
              flush=True)
    return bool(new)
