"""recommend(): the guide's starting-config recipe for a deployment, as code.

Given a model, a GPU type, a workload, latency SLOs and a number of GPUs, the recipe:

1. tensor parallelism only as far as needed: the smallest power of two (inside one node) at
   which the weights and the K/V of a few full-length sequences fit each GPU; if even a
   node's widest TP does not, pipeline stages across nodes (the guide: TP inside, PP across);
2. max_num_seqs from the KV formula: the sequences of typical length (p90 prompt + output)
   that the per-GPU pool holds, capped;
3. max_num_batched_tokens, the chunk size of chunked prefill: the largest budget whose mixed
   step (one full chunk plus a full batch of decodes) stays under the TPOT SLO, so a long
   prompt never stalls the decodes sharing its steps;
4. a small goodput search in the simulator around that start: max_num_seqs raised in steps
   of a quarter of the KV formula's value until the SLO breaks, then backed off one step (or
   lowered by the same steps until it holds); the budget halved and doubled around that; then
   each wider TP inside a node with its own steps 2-3; keeping the best goodput that meets the
   SLO.

Steps 1-3 are recipe_steps.py's calculators, step 4 is recipe_search.py's search; recommend()
runs them in order and reports the result, with its reasoning, as a Recommendation.

quantization (vLLM's --quantization: None, "int8", "int4", "fp8"; minillm.quant.schemes) prices
every step with the scheme's weight bytes (K/V stay bf16): smaller weights leave more of each
GPU to the KV cache, so step 1 may need less TP and step 2 fits more sequences. Autoscaling, the
recipe's last step, is minillm.autoscale.slo_replicas: the replicas the SLO-attainment rule
settles on for a demand, from a rate sweep of the chosen engine.

The GPUs left over become replicas (data parallelism: gpus // (TP x PP) engines). Model
(stated so it can be argued with): a router spreads requests evenly, so one replica serving
every replicas-th request stands for all of them and the fleet's goodput is replicas times its
own; every step is priced by the roofline (minillm.parallel), which is optimistic: real engines
reach a fraction of peak, so calibrate the overheads (minillm.calibration) before trusting the
absolute numbers. "Meets the SLO" means at least attainment_target of the requests (0.9, as
DistServe counts) meet every bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from minillm.calc.hardware import Hardware, get_hardware
from minillm.calc.models import ModelLike, as_config
from minillm.calc.roofline import StepOverheads
from minillm.metrics import Summary
from minillm.plan.deployment import (
    Deployment,
    DeploymentRun,
    attainment,
    replica_share,
    typical_length,
)
from minillm.plan.recipe_search import climb_max_num_seqs, refusal, search
from minillm.plan.recipe_steps import (
    MAX_BATCHED_TOKENS,
    MAX_NUM_SEQS_CAP,
    MIN_BATCHED_TOKENS,
    MIN_FULL_SEQUENCES,
    choose_batched_tokens,
    choose_layout,
    choose_max_num_seqs,
    layout_name,
)
from minillm.quant.schemes import get_scheme
from minillm.workloads.streams import RequestSpec

# The steps' names (and step 4's climb) are re-exported: the chapters and labs know them as
# minillm.recipe's.
__all__ = ["MAX_BATCHED_TOKENS", "MAX_NUM_SEQS_CAP", "MIN_BATCHED_TOKENS", "MIN_FULL_SEQUENCES",
           "Recommendation", "attainment", "choose_batched_tokens", "choose_layout",
           "choose_max_num_seqs", "climb_max_num_seqs", "recommend", "replica_share"]


@dataclass(frozen=True)
class Recommendation:
    """A deployment: tensor_parallel_size x pipeline_parallel_size GPUs per engine, replicas
    engines (data parallelism), their scheduler settings. summary: one replica's modelled run
    (seconds, requests/s); goodput: the fleet's requests/s that meet the SLO; attainment: the
    share of requests that met it; dollars_per_million_tokens: output tokens, None when the
    hardware has no price; reasoning: one line per step of the recipe, with its numbers."""

    model: str
    hardware: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    replicas: int
    max_num_seqs: int
    max_num_batched_tokens: int
    summary: Summary
    goodput: float
    attainment: float
    dollars_per_million_tokens: float | None
    reasoning: list[str] = field(default_factory=list)
    enable_chunked_prefill: bool = True
    quantization: str | None = None

    @property
    def gpus_used(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.replicas

    @property
    def deployment(self) -> Deployment:
        return Deployment(self.tensor_parallel_size, self.pipeline_parallel_size, self.replicas,
                          self.max_num_seqs, self.max_num_batched_tokens,
                          self.enable_chunked_prefill, self.quantization)

    def engine_kwargs(self) -> dict[str, Any]:
        """The settings as simulate()'s (and vLLM's) keyword arguments, for one replica."""
        return self.deployment.engine_kwargs()

    def explain(self) -> str:
        """The reasoning, one numbered line per step."""
        return "\n".join(f"{i}. {line}" for i, line in enumerate(self.reasoning, 1))


def recommend(model: ModelLike, hw: Hardware | str, workload: Sequence[RequestSpec],
              slo: dict[str, float], gpus: int, *, attainment_target: float = 0.9,
              sim_requests: int = 300,
              overheads: StepOverheads | Mapping[str, float] | None = None,
              quantization: str | None = None) -> Recommendation:
    """The recipe's deployment of model on gpus GPUs of hw for workload under slo (seconds,
    as metrics.meets_slo: {"ttft": 1.0, "tpot": 0.05}); simulations use at most sim_requests
    requests of one replica's share. overheads: the steps' roofline.StepOverheads, or a dict
    of its field names (CalibrationReport.overheads() fits them), used by step 3 and the
    search alike; None prices steps at the roofline's peaks. quantization:
    vLLM's name of the weights' scheme (minillm.quant.schemes.SCHEMES; None is bf16). ValueError
    naming the binding constraint when no configuration can: the weights (step 1) or the SLO
    metric furthest from met (step 4); and for a scheme the GPU cannot run (fp8 without FP8
    tensor cores)."""
    config, device = as_config(model), get_hardware(hw)
    _check_inputs(workload, slo, gpus, attainment_target, sim_requests)
    step_overheads = StepOverheads.of(overheads)
    scheme = get_scheme(quantization)
    scheme.check(device)
    totals = [s.prompt_len + s.output_len for s in workload]
    longest, typical = max(totals), typical_length(workload)
    reasoning: list[str] = []
    if scheme.name != "bf16":
        reasoning.append(
            f"Quantization {scheme.name!r}: {scheme.weight_bytes:g} bytes a weight against "
            f"bf16's 2, K/V kept in bf16"
            + (f", weight matmuls at {scheme.matmul_speedup:g}x the bf16 peak"
               if scheme.matmul_speedup != 1 else "")
            + (" (modelled: minillm's engine runs int8 only)." if not scheme.implemented
               else "."))
    layout = choose_layout(config, device, gpus, longest, reasoning, quantization=scheme.name)
    seqs = choose_max_num_seqs(config, device, layout, typical, reasoning,
                               quantization=scheme.name)
    budget = choose_batched_tokens(config, device, layout, seqs, typical, workload, slo,
                                   reasoning, step_overheads, quantization=scheme.name)
    best, tried = search(config, device, workload, slo, gpus, (layout, seqs, budget),
                          attainment_target, sim_requests, step_overheads, quantization)
    if best.attainment < attainment_target:
        raise ValueError(refusal(tried, slo, attainment_target))
    return _report(model, device, gpus, best, tried, reasoning)


def _report(model: ModelLike, device: Hardware, gpus: int, best: DeploymentRun,
            tried: list[DeploymentRun], reasoning: list[str]) -> Recommendation:
    """The Recommendation of the search's best, with its last lines of reasoning: the search
    and, on a priced GPU, the cost (at the output tokens/s the fleet sustains in steady
    state)."""
    chosen, start, summary = best.deployment, tried[0], best.summary
    replicas, used = chosen.replicas, chosen.gpus
    idle = f" ({gpus - used} of the {gpus} GPUs left idle)" if used < gpus else ""
    climbed = sorted({t.deployment.max_num_seqs for t in tried
                      if t.deployment.layout == start.deployment.layout
                      and t.deployment.max_num_batched_tokens
                      == start.deployment.max_num_batched_tokens})
    reasoning.append(
        f"Search: {len(tried)} simulated configs ({len(best.result.outputs)} requests of one "
        f"replica's share each); max_num_seqs tried {climbed} (raised by a quarter of the KV "
        f"formula's value until the SLO breaks, then one step back; a raise stops once the "
        f"batch never fills the cap); the recipe's start had goodput {start.goodput:.2f} req/s "
        f"with {start.attainment:.0%} meeting the SLO; best: {layout_name(chosen.layout)}, "
        f"max_num_seqs {chosen.max_num_seqs}, max_num_batched_tokens "
        f"{chosen.max_num_batched_tokens}: goodput "
        f"{best.goodput:.2f} req/s in steady state over {replicas} replica(s){idle}, "
        f"{best.attainment:.0%} of requests meet the SLO (TTFT p99 "
        f"{summary.ttft.p99 * 1e3:.0f} ms, TPOT p99 {summary.tpot.p99 * 1e3:.1f} ms).")
    dollars = best.dollars_per_million_tokens
    if dollars is not None:
        reasoning.append(f"Cost: {used} GPUs at ${device.dollars_per_hour:.2f}/h for "
                         f"{best.output_throughput:.0f} output tokens/s in steady state: "
                         f"${dollars:.3f} per 1M tokens.")
    return Recommendation(model if isinstance(model, str) else "custom model", device.name,
                          chosen.tensor_parallel_size, chosen.pipeline_parallel_size, replicas,
                          chosen.max_num_seqs, chosen.max_num_batched_tokens, summary,
                          best.goodput, best.attainment, dollars, reasoning,
                          quantization=chosen.quantization)


def _check_inputs(workload: Sequence[RequestSpec], slo: dict[str, float], gpus: int,
                  attainment_target: float, sim_requests: int) -> None:
    if not workload or not all(isinstance(s, RequestSpec) for s in workload):
        raise ValueError("workload must be a non-empty sequence of RequestSpec "
                         "(minillm.workload.poisson(...) makes one)")
    if not isinstance(slo, dict) or not slo:
        raise ValueError(f"slo must be a non-empty dict of bounds in seconds, e.g. "
                         f"{{'ttft': 1.0, 'tpot': 0.05}}, got {slo!r}")
    for name, bound in slo.items():
        if name not in ("ttft", "tpot", "itl", "e2e", "e2el"):
            raise ValueError(f"unknown SLO metric {name!r}; use ttft, tpot, itl or e2e")
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0:
            raise ValueError(f"slo[{name!r}] must be a positive number of seconds, got {bound!r}")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be a positive int, got {gpus!r}")
    if not 0 < attainment_target <= 1:
        raise ValueError(f"attainment_target must be in (0, 1], got {attainment_target!r}")
    if not isinstance(sim_requests, int) or sim_requests < 1:
        raise ValueError(f"sim_requests must be a positive int, got {sim_requests!r}")
