"""LLM: the front door that chapters use. Loads a model, sizes the KV pool, runs the engine."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from minillm.config import EngineConfig
from minillm.device import DeviceCaps, capabilities, dtype_for
from minillm.engine import Engine
from minillm.model import LlamaForCausalLM
from minillm.model_config import ModelConfig

# The pool's sizing is the device side's (minillm.model_runner); re-exported, as chapter 03 and
# the tests read it here.
from minillm.model_runner import MemoryReport as MemoryReport
from minillm.model_runner import describe_pool as describe_pool
from minillm.model_runner import kv_pool_bytes as kv_pool_bytes
from minillm.model_runner import num_kv_blocks_for_memory as num_kv_blocks_for_memory
from minillm.quant.int8 import quantize_model
from minillm.quant.kv_pool import kv_pool_block_bytes
from minillm.request import Request, RequestOutput
from minillm.sampling import SamplingParams
from minillm.tokenizer import load_tokenizer
from minillm.trace import StepRecord

Prompt = str | list[int]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_model_path() -> Path:
    """The folder of the tiny Shakespeare model that ships inside the package."""
    return Path(__file__).parent / "assets" / "tiny-shakespeare"


def default_draft_path() -> Path:
    """The folder of the shipped draft model for speculative decoding: ~0.8M parameters, the
    tiny model's tokenizer (speculative_config={"model": default_draft_path(), ...})."""
    return Path(__file__).parent / "assets" / "tiny-shakespeare-draft"


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """The device's default (minillm.device: float32 on a CPU, bfloat16 from sm_80, float16 on
    a T4); an explicit dtype is the reader's choice and is kept."""
    if dtype is None:
        if device.type == "cuda":
            return dtype_for(torch.cuda.get_device_capability(device))
        return capabilities(device).dtype  # a GPU's during the GPU-shaped run
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype must be one of {sorted(DTYPES)} or a torch dtype, got {dtype!r}")


def check_kv_cache_dtype(config: EngineConfig, caps: DeviceCaps) -> None:
    """Refuse, before any weight loads, a K/V dtype the device's attention kernels lack (fp8
    below sm_89), naming the stand-in; torch's reference attention stores fp8 anywhere."""
    if config.kv_cache_dtype in caps.kv_cache_dtypes or config.attention_backend == "torch":
        return
    stand_in, why = caps.kv_cache_dtype(config.kv_cache_dtype)
    raise ValueError(f"kv_cache_dtype={config.kv_cache_dtype!r} cannot run on {caps.name}: {why}. "
                     f"Pass kv_cache_dtype={stand_in!r}, or attention_backend='torch'")


def run_largest_step(model: LlamaForCausalLM, config: EngineConfig, max_model_len: int
                     ) -> StepRecord:
    """One engine step of max_num_batched_tokens prompt tokens split over max_num_seqs requests,
    each sampled: the most activations and the most logits a step of this config can have.
    It runs on a throwaway pool just big enough, without CUDA graphs."""
    num_seqs = min(config.max_num_seqs, config.max_num_batched_tokens)
    tokens = min(config.max_num_batched_tokens, num_seqs * (max_model_len - 1))
    lengths = [tokens // num_seqs + (i < tokens % num_seqs) for i in range(num_seqs)]
    blocks = sum(-(-(n + 1) // config.block_size) for n in lengths)
    warm_config = dataclasses.replace(
        config, num_kv_blocks=blocks, max_model_len=max_model_len, scheduling="continuous",
        enable_cuda_graphs=False, enable_prefix_caching=False, prefix_caching="hash",
        scheduling_policy="fcfs", trace_block_tables=False)
    engine = Engine(model, None, warm_config)
    vocab = model.config.vocab_size
    # top_k and top_p take the sampler's heaviest path (a sort over the vocabulary).
    params = SamplingParams(max_tokens=1, temperature=1.0, top_k=50, top_p=0.9, ignore_eos=True)
    for i, n in enumerate(lengths):
        engine.add_request([(i + t) % vocab for t in range(n)], params)
    engine.step()
    return engine.trace[-1]


def profile_memory(model: LlamaForCausalLM, config: EngineConfig, max_model_len: int
                   ) -> MemoryReport:
    """Measure the largest step's peak on the GPU, as vLLM's profile run does."""
    device = model.lm_head.weight.device
    torch.cuda.empty_cache()  # a weight cast leaves freed blocks cached: not memory in use
    torch.cuda.reset_peak_memory_stats(device)
    allocated = torch.cuda.memory_allocated(device)
    run_largest_step(model, config, max_model_len)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    gc.collect()  # the throwaway engine and its pool go before free memory is read
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return MemoryReport(total=total, free=free, allocated=allocated, peak=peak)


class LLM:
    """Generate text with a Llama-family model on a paged KV cache.

    model: a checkpoint folder (default: the shipped tiny model), or a ModelConfig for random
    weights of that shape. The keyword arguments are EngineConfig's, plus device, dtype.
    """

    def __init__(self, model: str | Path | ModelConfig | None = None, *,
                 device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
                 **engine_args: object):
        config = EngineConfig(**engine_args)  # type: ignore[arg-type]
        dev = resolve_device(device)
        torch_dtype = resolve_dtype(dtype, dev)
        check_kv_cache_dtype(config, capabilities(dev))
        if isinstance(model, ModelConfig):
            net, tokenizer = LlamaForCausalLM.random(model, torch_dtype, dev, config.seed), None
            self.model_name = "random-weights"
        else:
            path = Path(model) if model is not None else default_model_path()
            if not path.is_dir():
                raise OSError(f"model folder {str(path)!r} does not exist (minillm never "
                              "downloads weights: pass a local Hugging Face checkpoint folder)")
            net = LlamaForCausalLM.from_pretrained(path, torch_dtype, dev)
            tokenizer = load_tokenizer(path)
            self.model_name = path.resolve().name  # what a server calls it by default
        if config.quantization == "int8":  # before the pool is sized: it fits what is left
            quantize_model(net)
        mc = net.config
        max_len = config.max_model_len or mc.max_position_embeddings
        if mc.sliding_window is not None and max_len > mc.sliding_window:
            raise ValueError(f"max_model_len={max_len} exceeds the model's sliding window "
                             f"({mc.sliding_window}), which minillm does not implement")
        net.model.rotary.cover(max_len)
        config = dataclasses.replace(config, max_model_len=max_len)
        blocks = config.num_kv_blocks or self._size_pool(config, net, max_len)
        config = dataclasses.replace(config, num_kv_blocks=blocks)
        self.engine = Engine(net, tokenizer, config,
                             draft_model=load_draft(config, torch_dtype, dev, max_len))
        self.config, self.tokenizer, self.model = config, tokenizer, net

    @staticmethod
    def _size_pool(config: EngineConfig, net: LlamaForCausalLM, max_len: int) -> int:
        """num_kv_blocks_for_memory; on a GPU after profiling the largest step, said aloud."""
        if net.lm_head.weight.device.type != "cuda":
            return num_kv_blocks_for_memory(config, net, max_len)
        report = profile_memory(net, config, max_len)
        blocks = num_kv_blocks_for_memory(config, net, max_len, report)
        block_bytes = kv_pool_block_bytes(net, config)
        print(describe_pool(blocks, block_bytes, config.block_size, report))
        return blocks

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, priority: Sequence[int] | None = None
                 ) -> list[RequestOutput]:
        """Run prompts to completion, batched by the scheduler; outputs in prompt order.

        priority: one int per prompt, lower first, under scheduling_policy="priority"."""
        prompt_list = normalize_prompts(prompts)
        param_list = per_prompt(params, prompt_list, "SamplingParams", SamplingParams())
        priorities = per_prompt(priority, prompt_list, "priorities", 0)
        # Validate every request before queueing any, so a bad prompt leaves the engine as it was.
        reqs = [self.engine.make_request(p, sp, priority=pr)
                for p, sp, pr in zip(prompt_list, param_list, priorities)]
        return self._run(reqs, use_tqdm)

    def _run(self, reqs: list[Request], use_tqdm: bool) -> list[RequestOutput]:
        for req in reqs:
            self.engine.enqueue(req)
        pending = {req.request_id for req in reqs}
        bar = tqdm(total=len(reqs), desc="generate", unit="req", disable=not use_tqdm)
        try:
            while pending:
                for out in self.engine.step():
                    if out.finished and out.request_id in pending:
                        pending.discard(out.request_id)
                        bar.update(1)
        finally:
            bar.close()
            for request_id in pending:  # after an error: free what this call still holds
                if request_id in self.engine.requests:
                    self.engine.abort_request(request_id)
        return [RequestOutput.of(req) for req in reqs]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None,
               priority: int = 0) -> Iterator[str]:
        """Yield the text as it is generated; the pieces join to generate's text.

        Text that could be the start of a stop string is held back until it is known not to be.
        """
        params = params or SamplingParams()
        req = self.engine.make_request(prompt, params, priority=priority)
        self.engine.enqueue(req)
        holdback = max((len(s) for s in params.stop_strings), default=1) - 1
        sent = 0
        try:
            while not req.is_finished:
                self.engine.step()
                visible = len(req.text) if req.is_finished else len(req.text) - holdback
                if visible > sent:
                    yield req.text[sent:visible]
                    sent = visible
        finally:
            if not req.is_finished:
                self.engine.abort_request(req.request_id)

    def stats(self) -> dict[str, int]:
        """Pool and scheduler counters: num_blocks, num_free_blocks, num_waiting, num_running;
        preemption's since the engine started: num_preemptions, num_recomputed_tokens (computed
        tokens that recompute threw away), num_swap_outs and num_swap_ins (requests),
        swap_out_bytes and swap_in_bytes (KV bytes copied), num_swapped (requests whose K/V
        are in the host pool now); and the prefix cache's:
        prefix_cache_queries and prefix_cache_hits (full blocks looked up at admission, and
        found), prefix_cache_query_tokens and prefix_cache_hit_tokens (prompt tokens looked up,
        all but the last of each prompt, and those whose K/V were reused: whole blocks only),
        prefix_cache_evictions (cached blocks thrown away to make room)."""
        return self.engine.stats()

    @property
    def trace(self) -> list[StepRecord]:
        """One StepRecord per engine step so far."""
        return self.engine.trace


def load_draft(config: EngineConfig, dtype: torch.dtype, device: torch.device, max_len: int
               ) -> LlamaForCausalLM | None:
    """The draft model of speculative_config's "draft_model" method, in the target's dtype."""
    spec = config.speculative_config
    if spec is None or spec.method != "draft_model":
        return None
    assert spec.model is not None
    draft = LlamaForCausalLM.from_pretrained(Path(spec.model), dtype, device)
    draft.model.rotary.cover(max_len)
    return draft


def per_prompt(value: object, prompts: list[Prompt], what: str, default: object) -> list:
    """One value per prompt: the default, one value for all (not a sequence), or a sequence
    exactly as long as the prompts."""
    if value is None:
        return [default] * len(prompts)
    if not isinstance(value, (list, tuple)):
        return [value] * len(prompts)
    if len(value) != len(prompts):
        raise ValueError(f"got {len(value)} {what} for {len(prompts)} prompts")
    return list(value)


def normalize_prompts(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """A str, a list of token ids, or a list of either, as a list of prompts."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (list, tuple)) and prompts and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        return [list(prompts)]  # type: ignore[arg-type]
    if isinstance(prompts, (list, tuple)) and prompts:
        return list(prompts)
    raise ValueError(f"prompts must be a str, a list of token ids or a non-empty list of them, "
                     f"got {prompts!r:.80}")
