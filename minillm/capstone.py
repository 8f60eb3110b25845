"""The capstone of chapter 11: deploy a model on a GPU budget for a workload under SLOs.

A Scenario is the brief an operator is handed: a model, a GPU type with its rental price, how
many GPUs, the traffic (prompt and output length histograms, an arrival rate) and the latency
SLOs. The reader answers with a Deployment (minillm.deployment) and its reasoning; evaluate()
prices any deployment the way recommend() prices its own, so the reader's goodput and the
recipe's are measured by one ruler, and reference() is what the recipe recommends.

The prices are assumptions, stated as such: on-demand rates vary by provider and month, so a
reader should put in their own (dataclasses.replace(scenario, hardware=...)).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from minillm.deployment import Deployment, DeploymentRun, run_deployment
from minillm.hardware import HARDWARE, Hardware
from minillm.recipe import Recommendation, recommend
from minillm.workload import Mixture, Uniform, Workload, poisson

# Assumed on-demand prices in $/GPU-hour, round figures of late-2020s cloud listings.
PRICES = {"H100-SXM": 3.0, "A100-80GB": 1.8, "L4": 0.8}


def priced(name: str) -> Hardware:
    return dataclasses.replace(HARDWARE[name], dollars_per_hour=PRICES[name])


def histogram(*bins: tuple[float, int, int]) -> Mixture:
    """Lengths drawn from a histogram: (share, lo, hi) bins, uniform inside each bin."""
    return Mixture([(share, Uniform(lo, hi)) for share, lo, hi in bins])


@dataclass(frozen=True)
class Scenario:
    """The capstone's brief. rate: requests/s arriving (Poisson); slo: seconds per metric, met
    by at least 90% of requests (DistServe's attainment); the run is num_requests requests,
    of which each simulation takes sim_requests of one replica's share."""

    name: str
    model: str
    hardware: Hardware
    gpus: int
    prompt_len: Mixture
    output_len: Mixture
    rate: float
    slo: dict[str, float]
    num_requests: int = 600
    seed: int = 11
    sim_requests: int = 300

    def workload(self) -> Workload:
        return poisson(self.num_requests, self.rate, self.prompt_len, self.output_len,
                       seed=self.seed)

    def describe(self) -> str:
        def bins(lengths: Mixture) -> str:
            total = sum(w for w, _ in lengths.components)
            return ", ".join(f"{w / total:.0%} {d.lo:,}-{d.hi:,}" for w, d in lengths.components)

        bounds = ", ".join(f"{name.upper()} {bound * 1e3:g} ms" for name, bound in self.slo.items())
        return (f"{self.name}: {self.model} on up to {self.gpus} {self.hardware.name} "
                f"(${self.hardware.dollars_per_hour:.2f}/GPU-hour, assumed), {self.rate:g} "
                f"requests/s (Poisson); prompt tokens {bins(self.prompt_len)}; output tokens "
                f"{bins(self.output_len)}; SLO: {bounds} for 90% of requests")


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    # The chapter's capstone: a chat assistant on a 70B that does not fit one GPU.
    Scenario("chat-70b", "llama-3-70b", priced("H100-SXM"), gpus=8,
             prompt_len=histogram((0.5, 200, 800), (0.3, 800, 2000), (0.2, 2000, 4000)),
             output_len=histogram((0.6, 50, 200), (0.3, 200, 500), (0.1, 500, 1000)),
             rate=30.0, slo={"ttft": 1.0, "tpot": 0.05}),
    # Retrieval-augmented answers: long prompts, short outputs, a tight TTFT.
    Scenario("rag-8b", "llama-3-8b", priced("A100-80GB"), gpus=4,
             prompt_len=histogram((0.4, 1000, 3000), (0.4, 3000, 6000), (0.2, 6000, 7600)),
             output_len=histogram((0.8, 30, 150), (0.2, 150, 400)),
             rate=6.0, slo={"ttft": 1.5, "tpot": 0.05}),
    # A 405B-class model across two 8-GPU nodes, at a modest rate.
    Scenario("long-405b", "llama-3.1-405b", priced("H100-SXM"), gpus=16,
             prompt_len=histogram((0.6, 500, 2000), (0.4, 2000, 6000)),
             output_len=histogram((0.7, 100, 400), (0.3, 400, 800)),
             rate=2.0, slo={"ttft": 3.0, "tpot": 0.1}, num_requests=300, sim_requests=150),
)}


def evaluate(scenario: Scenario, deployment: Deployment) -> DeploymentRun:
    """deployment's modelled run on scenario, priced as recommend() prices its own.
    ValueError if it needs more GPUs than the scenario has, or does not fit them."""
    if deployment.gpus > scenario.gpus:
        raise ValueError(
            f"the deployment needs {deployment.gpus} GPUs (TP {deployment.tensor_parallel_size}"
            f" x PP {deployment.pipeline_parallel_size} x {deployment.replicas} replicas); "
            f"{scenario.name} gives {scenario.gpus}")
    return run_deployment(scenario.model, scenario.hardware, scenario.workload(), scenario.slo,
                          deployment, sim_requests=scenario.sim_requests)


_REFERENCES: dict[str, Recommendation] = {}


def reference(scenario: Scenario) -> Recommendation:
    """What the recipe recommends for scenario (kept per scenario: a few seconds each)."""
    key = repr(scenario)  # a Scenario holds a dict, so it cannot be a key itself
    if key not in _REFERENCES:
        _REFERENCES[key] = recommend(scenario.model, scenario.hardware, scenario.workload(),
                                     scenario.slo, scenario.gpus,
                                     sim_requests=scenario.sim_requests)
    return _REFERENCES[key]
