"""Step 4 of the starting-config recipe (minillm.recipe): the goodput search in the simulator.

From steps 1-3's start (recipe_steps.py), one knob at a time: max_num_seqs climbed by the guide's
rule (climb_max_num_seqs: raised by a quarter of the KV formula's value until the SLO breaks,
then backed off one step), the budget halved and doubled around it, then each wider TP inside a
node with its own steps 2-3. Every candidate is one replica's run of its share of the workload
(minillm.plan.deployment.run_deployment); the best meets the SLO with the most goodput. When
none does, refusal() names the binding SLO metric of the closest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from minillm.calc import parallel
from minillm.calc.hardware import Hardware
from minillm.calc.roofline import StepOverheads
from minillm.metrics import percentile
from minillm.plan.deployment import Deployment, DeploymentRun, run_deployment, typical_length
from minillm.plan.recipe_steps import (
    MAX_BATCHED_TOKENS,
    MAX_NUM_SEQS_CAP,
    MIN_BATCHED_TOKENS,
    choose_batched_tokens,
    choose_max_num_seqs,
    layout_name,
    tp_options,
)
from minillm.sim.simulator import SimulationResult
from minillm.workloads.streams import RequestSpec

GOODPUT_TOLERANCE = 0.05  # a search step must beat the current best by this share to replace it:
# a steady-state window of a few hundred simulated requests measures goodput to a few per cent
# (Poisson sampling), and a tie keeps the recipe's own, smaller TP
SEQS_STEPS = 4  # max_num_seqs moves in steps of 1/SEQS_STEPS of the KV formula's value ...
SEQS_RAISES = 4  # ... at most this many steps up (to twice the formula's value)


def search(config: Any, device: Hardware, workload: Sequence[RequestSpec],
           slo: dict[str, float], gpus: int, start: tuple[parallel.ParallelConfig, int, int],
           target: float, sim_requests: int, overheads: StepOverheads,
           quantization: str | None = None) -> tuple[DeploymentRun, list[DeploymentRun]]:
    """Step 4: from start (layout, max_num_seqs, budget), max_num_seqs by climb_max_num_seqs,
    then the budget halved and doubled around it, then each wider TP with its own steps 2-3;
    one knob at a time. The best meets the SLO with the most goodput."""
    tried: dict[Deployment, DeploymentRun] = {}

    def run(layout: parallel.ParallelConfig, seqs: int, budget: int) -> DeploymentRun:
        chosen = Deployment(layout.tensor_parallel_size, layout.pipeline_parallel_size,
                            gpus // layout.world_size, seqs, budget, quantization=quantization)
        if chosen not in tried:
            tried[chosen] = run_deployment(config, device, workload, slo, chosen,
                                           sim_requests=sim_requests, overheads=overheads)
        return tried[chosen]

    def rank(t: DeploymentRun) -> tuple[bool, float, float]:
        return t.attainment >= target, t.goodput, t.attainment

    def keep_better(best: DeploymentRun, candidate: DeploymentRun) -> DeploymentRun:
        # Within GOODPUT_TOLERANCE it is a tie (a few hundred requests are a noisy sample),
        # and a tie keeps what came first: the recipe's own choice.
        met, goodput, share = rank(candidate)
        if (met, goodput * (1 - GOODPUT_TOLERANCE), share) > rank(best):
            return candidate
        return best

    layout, seqs, budget = start
    best = climb_max_num_seqs(lambda n: run(layout, n, budget), seqs, target)
    for other in (max(budget // 2, MIN_BATCHED_TOKENS), min(budget * 2, MAX_BATCHED_TOKENS)):
        best = keep_better(best, run(layout, best.deployment.max_num_seqs, other))
    typical = typical_length(workload)
    wider_tps = [] if layout.pipeline_parallel_size > 1 else [
        t for t in tp_options(config, device, gpus) if t > layout.tensor_parallel_size]
    for tp in wider_tps:
        # A wider TP with its own recipe: fewer replicas, each with more KV room and faster steps
        wider = parallel.ParallelConfig(tp)
        seqs_wide = choose_max_num_seqs(config, device, wider, typical, [],
                                        quantization=quantization)
        budget_wide = choose_batched_tokens(config, device, wider, seqs_wide, typical,
                                            workload, slo, [], overheads,
                                            quantization=quantization)
        best = keep_better(best, run(wider, seqs_wide, budget_wide))
    return best, list(tried.values())


def climb_max_num_seqs(run: Callable[[int], DeploymentRun], start: int, target: float
                       ) -> DeploymentRun:
    """The guide's rule for max_num_seqs: raise it until the SLO breaks, then back off one step.
    The step is a quarter of start (the KV formula's value, SEQS_STEPS), at most SEQS_RAISES
    raises (twice start, and 2 x MAX_NUM_SEQS_CAP at most); a raise stops early when the
    batch never reached the current cap (its peak running batch is below it: a higher cap
    cannot change the run). If start itself misses the SLO, lower it by the same steps until
    it holds (or 1). run(n) simulates max_num_seqs n; the run returned is the last that met
    attainment target (start's, if none did)."""
    step = max(start // SEQS_STEPS, 1)
    ceiling = min(start + SEQS_RAISES * step, 2 * MAX_NUM_SEQS_CAP)
    current = run(start)
    if current.attainment < target:
        seqs = start
        while seqs > 1:
            seqs = max(seqs - step, 1)
            lower = run(seqs)
            if lower.attainment >= target:
                return lower
        return current
    while current.deployment.max_num_seqs + step <= ceiling:
        peak = max((len(r.scheduled) for r in current.result.trace), default=0)
        if peak < current.deployment.max_num_seqs:
            break  # the cap never bound: raising it cannot change the run
        raised = run(current.deployment.max_num_seqs + step)
        if raised.attainment < target:
            break  # the SLO broke: back off one step, to current
        current = raised
    return current


def _per_request(result: SimulationResult, name: str) -> list[float]:
    """Each finished request's value of one SLO metric, as meets_slo reads it."""
    values = []
    for o in result.outputs:
        m = o.metrics
        value = (max(m.itl, default=0.0) if name == "itl"
                 else m.e2e if name == "e2el" else getattr(m, name))
        if value is not None:
            values.append(value)
    return values


def refusal(tried: list[DeploymentRun], slo: dict[str, float], target: float) -> str:
    """Why no configuration meets the SLO: the metric met by the fewest requests in the
    closest configuration, with the value that target of the requests reached."""
    closest = max(tried, key=lambda t: (t.attainment, t.goodput))
    binding = min(slo, key=lambda name: closest.shares[name])
    reached = percentile(_per_request(closest.result, binding), 100 * target)
    near = closest.deployment
    return (f"no configuration meets the SLO: {binding.upper()} is the binding constraint. "
            f"The closest of {len(tried)} simulated configs ({layout_name(near.layout)}, "
            f"max_num_seqs {near.max_num_seqs}, max_num_batched_tokens "
            f"{near.max_num_batched_tokens}) has p"
            f"{100 * target:g} {binding.upper()} {reached * 1e3:.2f} ms against the bound of "
            f"{slo[binding] * 1e3:.2f} ms ({closest.shares[binding]:.0%} of requests meet it, "
            f"{target:.0%} must); loosen {binding!r}, lower the request rate, or use faster GPUs")
