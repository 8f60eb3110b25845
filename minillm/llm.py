"""LLM: the front door that chapters use. Loads a model, sizes the KV pool, runs the engine."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from minillm.config import EngineConfig
from minillm.engine import Engine
from minillm.kv_cache import kv_cache_block_bytes
from minillm.model import LlamaForCausalLM
from minillm.model_config import ModelConfig
from minillm.request import Request, RequestOutput
from minillm.sampling import SamplingParams
from minillm.tokenizer import load_tokenizer
from minillm.trace import StepRecord

Prompt = str | list[int]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_model_path() -> Path:
    """The folder of the tiny Shakespeare model that ships inside the package."""
    return Path(__file__).parent / "assets" / "tiny-shakespeare"


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """float32 on CPU and bfloat16 on GPU unless asked otherwise."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype must be one of {sorted(DTYPES)} or a torch dtype, got {dtype!r}")


def num_kv_blocks_for_memory(config: EngineConfig, model: LlamaForCausalLM, max_model_len: int
                             ) -> int:
    """The pool size that fits in memory: on a GPU, what gpu_memory_utilization leaves after the
    weights; on a CPU, no more than every seat holding a full-length sequence."""
    mc, weight = model.config, model.lm_head.weight
    block_bytes = kv_cache_block_bytes(mc.num_hidden_layers, config.block_size,
                                       mc.num_key_value_heads, mc.head_dim, weight.element_size())
    if weight.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(weight.device)
        activations = 512 * 2**20  # headroom for one step's activations and logits
        budget = total * config.gpu_memory_utilization - (total - free) - activations
        return max(int(budget // block_bytes), 1)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    seats = config.max_num_seqs * -(-max_model_len // config.block_size)
    return max(min(int(ram * config.gpu_memory_utilization * 0.25 // block_bytes), seats), 1)


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
        mc = net.config
        max_len = config.max_model_len or mc.max_position_embeddings
        if mc.sliding_window is not None and max_len > mc.sliding_window:
            raise ValueError(f"max_model_len={max_len} exceeds the model's sliding window "
                             f"({mc.sliding_window}), which minillm does not implement")
        blocks = config.num_kv_blocks or num_kv_blocks_for_memory(config, net, max_len)
        config = dataclasses.replace(config, max_model_len=max_len, num_kv_blocks=blocks)
        self.engine = Engine(net, tokenizer, config)
        self.config, self.tokenizer, self.model = config, tokenizer, net

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run prompts to completion, batched by the scheduler; outputs in prompt order."""
        prompt_list = normalize_prompts(prompts)
        if params is None or isinstance(params, SamplingParams):
            param_list = [params or SamplingParams()] * len(prompt_list)
        else:
            param_list = list(params)
            if len(param_list) != len(prompt_list):
                raise ValueError(f"got {len(param_list)} SamplingParams for "
                                 f"{len(prompt_list)} prompts")
        # Validate every request before queueing any, so a bad prompt leaves the engine as it was.
        reqs = [self.engine.make_request(p, sp) for p, sp in zip(prompt_list, param_list)]
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

    def stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[str]:
        """Yield the text as it is generated; the pieces join to generate's text.

        Text that could be the start of a stop string is held back until it is known not to be.
        """
        params = params or SamplingParams()
        req = self.engine.make_request(prompt, params)
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
        """Pool and scheduler counters: num_blocks, num_free_blocks, num_preemptions,
        prefix_cache_queries and prefix_cache_hits (in blocks)."""
        return self.engine.stats()

    @property
    def trace(self) -> list[StepRecord]:
        """One StepRecord per engine step so far."""
        return self.engine.trace


def normalize_prompts(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """A str, a list of token ids, or a list of either, as a list of prompts."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]  # type: ignore[arg-type]
    if isinstance(prompts, (list, tuple)) and prompts:
        return list(prompts)
    raise ValueError(f"prompts must be a str, a list of token ids or a non-empty list of them, "
                     f"got {prompts!r:.80}")
