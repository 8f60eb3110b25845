"""Disaggregated prefill and decode in the simulator: two pools of replicas, the KV cache between.

DistServe (OSDI '24), Splitwise (ISCA '24) and Mooncake (FAST '25) run prompts on prefill GPUs
and generation on other, decode GPUs, so a long prefill never stalls a decode batch and each
pool gets the GPU count and scheduler settings its phase wants. The price is the KV cache,
shipped across a link once per request. Here each replica of either pool is a
minillm.simulator.Simulator (the engine's Scheduler and BlockManager, timed by the roofline),
and every replica runs on one virtual clock, as in minillm.fleet:

1. A request arrives and goes to a prefill replica (round robin), which runs its prompt with
   max_tokens=1, as vLLM's disaggregated proxy asks its prefill instance to.
2. Its prompt's K/V (prompt_len * kv_bytes_per_token bytes) crosses the link: latency +
   bytes / bandwidth. Transfers out of one prefill replica go one at a time (one NIC per GPU,
   as on a DGX), those of different replicas in parallel. The prefill replica frees its blocks
   when the first token is out (optimistic: a real one holds them until the copy is done).
3. When it lands, a decode replica (round robin) takes it: its blocks are allocated at once
   (the K/V occupy that pool from then on; if they do not fit, the request waits for blocks),
   and it is queued there, the prompt's K/V counted as computed, like an external prefix-cache
   hit in vLLM's KV connector. Only whole blocks are handed over, as the prefix cache does: the
   last, partial block's tokens (fewer than block_size, at least one) are recomputed in the
   decode replica's first step.
4. Where the client's first token comes from is first_token_from: "decode" (the default, as
   vLLM's proxy does it: benchmarks/disagg_benchmarks/disagg_prefill_proxy_server.py, main
   branch at commit 03b32f5): the proxy waits for the prefill instance's response, discards
   its token and streams every token from the decode instance, so TTFT = prefill (queueing
   included) + the transfer + the decode replica's queue and first step; the decode replica
   generates all output_len tokens. "prefill": a router that streams the prefill instance's
   token at once; TTFT ends on the prefill pool, the transfer lands between the first and
   second token (ITL, TPOT), and the decode replica generates the other output_len - 1.

Where the model is optimistic: the prefill replica's blocks are free before the copy ends; the
link carries nothing else. Where it is pessimistic: the copy starts after the whole prefill,
where DistServe and Mooncake stream it layer by layer during the prefill and hide most of it.
Routing is round robin in both pools, as simulate_fleet's default is for the colocated
baseline. The run loop that steps the two pools is minillm.sim.two_pools (TwoPools); this
module sizes and builds the pools, and minillm.plan.disaggregation_results holds what a run
and a comparison report (DisaggregatedResult, Comparison).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from minillm.calc import models, parallel, roofline, sizing
from minillm.calc.hardware import LINKS, Link
from minillm.model_config import ModelConfig
from minillm.plan import recipe
from minillm.plan.disaggregation_results import Comparison, DisaggregatedResult
from minillm.sim.fleet import simulate_fleet
from minillm.sim.kv_handover import DecodeReplica
from minillm.sim.pricing import Pricing, StepTimer
from minillm.sim.simulated_engine import Simulator, no_gc
from minillm.sim.simulated_pool import resolve_config
from minillm.sim.two_pools import KVTransfer, TwoPools
from minillm.workloads.streams import RequestSpec, Workload

__all__ = ["Comparison", "DisaggregatedResult", "KVTransfer", "TwoPools",  # the last two: sim
           "compare_disaggregation", "simulate_disaggregated", "tuned_colocated_kwargs"]

FIRST_TOKEN_FROM = ("decode", "prefill")


def resolve_link(link: str | Link) -> Link:
    """A Link, or a name in minillm.hardware.LINKS."""
    if isinstance(link, Link):
        return link
    if isinstance(link, str) and link in LINKS:
        return LINKS[link]
    raise ValueError(f"kv_link must be a minillm.hardware.Link or one of {sorted(LINKS)}, "
                     f"got {link!r}; build Link(name, bandwidth, latency) for another")


def _check_gpus(**counts: object) -> None:
    for name, n in counts.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be an integer >= 1 (one replica per GPU), got {n!r}")


def simulate_disaggregated(model: str | ModelConfig, hw: str | roofline.Hardware,
                           workload: Workload | Sequence[RequestSpec], *, prefill_gpus: int,
                           decode_gpus: int, kv_link: str | Link | None = None,
                           prefill_kwargs: dict[str, Any] | None = None,
                           decode_kwargs: dict[str, Any] | None = None, dtype_bytes: int = 2,
                           kv_dtype_bytes: float | None = None,
                           gpu_memory_utilization: float = 0.9,
                           step_time: StepTimer | None = None,
                           first_token_from: str = "decode",
                           interference: float = 0.0) -> DisaggregatedResult:
    """Serve workload on prefill_gpus GPUs of prefill replicas and decode_gpus GPUs of decode
    replicas of model on hw, the K/V of each prompt shipped over kv_link (a Link or a LINKS
    name; default: hw's inter_node_link, the pools being on different nodes).

    prefill_kwargs, decode_kwargs: each pool's EngineConfig keywords (max_num_seqs,
    max_num_batched_tokens, enable_chunked_prefill, ...) and its replicas' layout,
    tensor_parallel_size and pipeline_parallel_size (default 1: one GPU per replica; a pool's
    GPUs must be a multiple of t x p). Under TP or PP each GPU sends its shard of the K/V on
    its own link, so a transfer moves as many times the link's bandwidth as the smaller of the
    two replicas has GPUs. The decode pool's prefix cache is off (the K/V it receives are
    matched directly, see the module docstring). dtype_bytes, kv_dtype_bytes (also the bytes
    per K/V number on the link), gpu_memory_utilization and step_time are as in
    minillm.simulator.simulate. first_token_from: "decode" (vLLM's proxy: TTFT includes the
    transfer) or "prefill" (see the module docstring). interference: as in simulate_fleet;
    neither pool mixes phases, but a decode replica's first step of a request recomputes the
    tail of its prompt (up to block_size tokens) beside the running decodes. A closed-loop
    workload keeps workload.concurrency requests in flight, the next sent when one finishes.
    """
    _check_gpus(prefill_gpus=prefill_gpus, decode_gpus=decode_gpus)
    decode_kwargs = _check_options(first_token_from, decode_kwargs)
    mc, hardware = models.as_config(model), roofline.get_hardware(hw)
    link = resolve_link(hardware.inter_node_link if kv_link is None else kv_link)
    common = (mc, hardware, Pricing(dtype_bytes, kv_dtype_bytes, step_time=step_time,
                                    interference=interference), gpu_memory_utilization)
    prefill, prefill_layout = _pool("prefill", prefill_gpus, Simulator,
                                    dict(prefill_kwargs or {}), *common)
    decode, decode_layout = _pool("decode", decode_gpus, DecodeReplica, decode_kwargs, *common)
    for i, spec in enumerate(workload):
        prefill[0].check_fits(i, dataclasses.replace(spec, output_len=1))
        decode[0].check_fits(i, spec)
    lanes = min(prefill_layout.world_size, decode_layout.world_size)
    wire = Link(f"{lanes} x {link.name}", link.bandwidth * lanes, link.latency)
    per_token = sizing.kv_bytes_per_token(mc, common[2].kv_bytes)
    start = time.perf_counter()
    with no_gc():
        pools = TwoPools(prefill, decode, wire, per_token, first_token_from == "decode")
        outputs = pools.run(workload)
    return DisaggregatedResult(outputs, pools.transfers, prefill_gpus, decode_gpus, link,
                               prefill_layout, decode_layout, prefill[0].config,
                               decode[0].config,
                               [s.stats() for s in prefill], [s.stats() for s in decode], mc,
                               hardware, wall_time=time.perf_counter() - start,
                               first_token_from=first_token_from)


def _check_options(first_token_from: str, decode_kwargs: dict[str, Any] | None
                   ) -> dict[str, Any]:
    """Refuse what disaggregation cannot do, naming the fix; the decode pool's kwargs, copied."""
    if first_token_from not in FIRST_TOKEN_FROM:
        raise ValueError(f"first_token_from must be one of {FIRST_TOKEN_FROM}, got "
                         f"{first_token_from!r}: 'decode' streams every token from the decode "
                         "pool (vLLM's proxy), 'prefill' sends the first one from the prefill "
                         "pool")
    decode_kwargs = dict(decode_kwargs or {})
    if decode_kwargs.pop("enable_prefix_caching", False):
        raise ValueError("the decode pool runs without prefix caching (the K/V it receives are "
                         "matched directly); drop enable_prefix_caching from decode_kwargs")
    return decode_kwargs


def _pool(name: str, gpus: int, kind: type[Simulator], kwargs: dict[str, Any],
          model: ModelConfig, hw: roofline.Hardware, pricing: Pricing,
          gpu_memory_utilization: float) -> tuple[list[Any], parallel.ParallelConfig]:
    """gpus // (t x p) replicas of one pool and their TP x PP layout, taken out of kwargs."""
    layout = parallel.ParallelConfig(kwargs.pop("tensor_parallel_size", 1),
                                     kwargs.pop("pipeline_parallel_size", 1)).check(model)
    if gpus % layout.world_size:
        raise ValueError(f"{name}_gpus={gpus} is not a multiple of the {name} replicas' "
                         f"{layout.world_size} GPUs (tensor_parallel_size x "
                         f"pipeline_parallel_size); change one or the other")
    config = resolve_config(model, hw, pricing.dtype_bytes, gpu_memory_utilization, kwargs,
                            pricing.kv_dtype_bytes, None, layout)
    return [kind(model, hw, config, pricing, record_block_tables=False, layout=layout)
            for _ in range(gpus // layout.world_size)], layout


def compare_disaggregation(model: str | ModelConfig, hw: str | roofline.Hardware,
                           workload: Workload | Sequence[RequestSpec], slo: dict[str, float], *,
                           prefill_gpus: int, decode_gpus: int,
                           kv_link: str | Link | None = None,
                           prefill_kwargs: dict[str, Any] | None = None,
                           decode_kwargs: dict[str, Any] | None = None,
                           colocated_kwargs: dict[str, Any] | None = None,
                           tune_colocated: bool = True,
                           first_token_from: str = "decode", **common: Any) -> Comparison:
    """simulate_disaggregated against simulate_fleet on prefill_gpus + decode_gpus colocated
    replicas (round robin, chunked prefill; prefix caching off in both unless asked for; a
    tensor_parallel_size in colocated_kwargs makes fewer, wider replicas on the same GPUs).
    tune_colocated: the colocated replicas run the chunk and max_num_seqs the config recipe
    chooses for them (tuned_colocated_kwargs), as a fair baseline must; colocated_kwargs go on
    top, so a max_num_batched_tokens given there wins; False leaves EngineConfig's defaults
    (a 2,048-token chunk). first_token_from as in simulate_disaggregated; common:
    dtype_bytes, kv_dtype_bytes, gpu_memory_utilization, step_time, interference (the
    colocated chunk is then tuned under it too), for both."""
    _check_gpus(prefill_gpus=prefill_gpus, decode_gpus=decode_gpus)
    disaggregated = simulate_disaggregated(
        model, hw, workload, prefill_gpus=prefill_gpus, decode_gpus=decode_gpus,
        kv_link=kv_link, prefill_kwargs=prefill_kwargs, decode_kwargs=decode_kwargs,
        first_token_from=first_token_from, **common)
    gpus, tp = prefill_gpus + decode_gpus, (colocated_kwargs or {}).get("tensor_parallel_size", 1)
    if not isinstance(tp, int) or tp < 1 or gpus % tp:
        raise ValueError(f"the colocated replicas' tensor_parallel_size={tp!r} must divide the "
                         f"{gpus} GPUs (prefill_gpus + decode_gpus)")
    settings: dict[str, Any] = {"enable_prefix_caching": False}
    if tune_colocated:
        settings |= tuned_colocated_kwargs(model, hw, workload, slo, tp,
                                           common.get("interference", 0.0))
    settings |= colocated_kwargs or {}
    colocated = simulate_fleet(model, hw, workload, num_replicas=gpus // tp, **settings,
                               **common)
    return Comparison(disaggregated, colocated, dict(slo), settings)


def tuned_colocated_kwargs(model: str | ModelConfig, hw: str | roofline.Hardware,
                           workload: Sequence[RequestSpec], slo: dict[str, float],
                           tensor_parallel_size: int = 1, interference: float = 0.0
                           ) -> dict[str, int]:
    """max_num_seqs and max_num_batched_tokens of one colocated replica of tensor_parallel_size
    GPUs by the config recipe's steps 2 and 3 (minillm.recipe: the KV formula, then the
    largest chunk whose mixed step keeps the TPOT SLO): the baseline Sarathi-Serve says
    chunked prefill must be given. With interference != 0 and a TPOT SLO, that mixed step is
    priced as the run will price it (roofline.serial_phases), so a chunk is never chosen by
    a cost the run does not pay."""
    config, device = models.as_config(model), roofline.get_hardware(hw)
    layout = parallel.ParallelConfig(tensor_parallel_size).check(config)
    typical = recipe.typical_length(workload)
    seqs = recipe.choose_max_num_seqs(config, device, layout, typical, [])
    budget = recipe.choose_batched_tokens(config, device, layout, seqs, typical, workload, slo,
                                          [], interference=interference)
    return {"max_num_seqs": seqs, "max_num_batched_tokens": budget}
