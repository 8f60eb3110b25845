"""The capstone of chapter 11: deploy a model on a GPU budget for a workload under SLOs.

A Scenario is the brief an operator is handed: a model, a GPU type with its rental price, how
many GPUs, the traffic (prompt and output length histograms, an arrival rate) and the latency
SLOs. The reader answers with a Deployment (minillm.deployment) and its reasoning; evaluate()
prices any deployment the way recommend() prices its own, so the reader's goodput and the
recipe's are measured by one ruler.

SCENARIOS are the worked briefs the chapter shows (chat-70b is its running example).
student_scenario(name) is the brief a student is graded on (exercise 11.2): drawn from a hash
of the name, as chapter 09's mystery deployments are (minillm.diagnosis.student_seeds), so a
classmate's deployment and figures answer a different brief. This module holds no answer and no
written reasoning: reference() is the library's recommend() on a brief, the recipe's plan that
the grader measures a student against; the reference solution and its reasoning live in
minillm/labs/solutions/ch11.py, which a course's handout drops (strip-solutions).

The prices are assumptions, stated as such: on-demand rates vary by provider and month, so a
reader should put in their own (dataclasses.replace(scenario, hardware=...)).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from dataclasses import dataclass

from minillm.calc.hardware import HARDWARE, Hardware
from minillm.calc.models import as_config
from minillm.plan.deployment import Deployment, DeploymentRun, run_deployment
from minillm.plan.recipe import Recommendation, recommend
from minillm.workloads.streams import Mixture, Uniform, Workload, poisson

# Assumed on-demand prices in $/GPU-hour, round figures of late-2020s cloud listings.
PRICES = {"H100-SXM": 3.0, "H200": 3.8, "A100-80GB": 1.8, "L4": 0.8}


def priced(name: str, dollars_per_hour: float | None = None) -> Hardware:
    """The GPU name at PRICES' assumed rate, or at dollars_per_hour (a provider's quote)."""
    price = PRICES[name] if dollars_per_hour is None else dollars_per_hour
    return dataclasses.replace(HARDWARE[name], dollars_per_hour=price)


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


# ---- each student's own brief (exercise 11.2) ------------------------------------------------

@dataclass(frozen=True)
class Family:
    """A kind of brief a student may draw. options: (model, GPU type, GPU budget) triples, each
    one a passing deployment exists for; prompt_bins, output_bins: the histogram's (share, lo,
    hi) bins before the student's scaling; per_gpu_rate: requests/s per H100 at those lengths,
    which the draw scales by LOAD, the GPU's speed against an H100 (its scarcer of FLOPs and
    bandwidth), the budget and the lengths; it is set so that the recipe's deployment meets
    the SLO with room (modelled: all of 60 names swept at their rate, 59 at 1.2 times it);
    ttft, tpot: the ranges the SLO bounds are drawn from (seconds)."""

    kind: str
    options: tuple[tuple[str, str, int], ...]
    prompt_bins: tuple[tuple[float, int, int], ...]
    output_bins: tuple[tuple[float, int, int], ...]
    per_gpu_rate: float
    ttft: tuple[float, float]
    tpot: tuple[float, float]
    num_requests: int = 600
    sim_requests: int = 300


# The three briefs of SCENARIOS, widened: a student may have to replicate an 8B, split a 70B or
# pipeline a 405B, on GPUs of their own draw. Every option was checked to leave a passing
# deployment across the ranges below (tests/test_ch11_capstone_scenarios.py samples them).
FAMILIES = (
    Family("chat", (("llama-3-70b", "H100-SXM", 8), ("llama-3-70b", "H200", 8),
                    ("llama-3-70b", "H200", 4), ("llama-3-70b", "A100-80GB", 8)),
           prompt_bins=((0.5, 200, 800), (0.3, 800, 2000), (0.2, 2000, 4000)),
           output_bins=((0.6, 50, 200), (0.3, 200, 500), (0.1, 500, 1000)),
           per_gpu_rate=3.0, ttft=(0.8, 1.5), tpot=(0.04, 0.07)),
    Family("rag", (("llama-3-8b", "A100-80GB", 4), ("llama-3.1-8b", "H100-SXM", 2),
                   ("qwen2.5-7b", "A100-80GB", 4), ("mistral-7b", "L4", 8)),
           prompt_bins=((0.4, 1000, 3000), (0.4, 3000, 6000), (0.2, 6000, 7000)),
           output_bins=((0.8, 30, 150), (0.2, 150, 400)),
           per_gpu_rate=12.5, ttft=(1.2, 2.0), tpot=(0.04, 0.07)),
    Family("long", (("llama-3.1-405b", "H100-SXM", 16), ("llama-3.1-405b", "H200", 8)),
           prompt_bins=((0.6, 500, 2000), (0.4, 2000, 6000)),
           output_bins=((0.7, 100, 400), (0.3, 400, 800)),
           per_gpu_rate=0.2, ttft=(2.5, 4.0), tpot=(0.08, 0.12),
           num_requests=300, sim_requests=150),
)
LOAD = (0.5, 0.85)  # the drawn rate as a share of the family's per-GPU rate, scaled
LENGTH_SCALE = (0.75, 1.25)  # each histogram's bins stretched by a factor in this range


def _seed(student: object) -> int:
    if not isinstance(student, str) or not student.strip():
        raise ValueError(f"student must be a non-empty name (the one on your course's roll, "
                         f"e.g. student_scenario('Ada Lovelace')), got {student!r}")
    text = "minillm-capstone-" + " ".join(student.lower().split())  # case, spaces: one name
    return int(hashlib.sha256(text.encode()).hexdigest(), 16)


def _scaled(rng: random.Random, bins: tuple[tuple[float, int, int], ...], cap: int
            ) -> tuple[Mixture, float]:
    """The histogram with its shares jittered and its bins stretched (at most cap tokens)."""
    scale = rng.uniform(*LENGTH_SCALE)
    drawn = [(round(share * rng.uniform(0.8, 1.2), 2), max(round(lo * scale), 1),
              min(round(hi * scale), cap)) for share, lo, hi in bins]
    return histogram(*drawn), scale


def student_scenario(student: str) -> Scenario:
    """The brief a student is graded on in exercise 11.2: a family of FAMILIES, a model, a GPU
    type at a price quote within 20% of PRICES, a GPU budget, length histograms, a rate and SLO
    bounds, all drawn from a hash of the name (case and spacing aside), so the same name always
    gets the same brief and a classmate's answer was worked on another. ValueError for a name
    that is not a non-empty string."""
    rng = random.Random(_seed(student))
    family = rng.choice(FAMILIES)
    model, gpu, gpus = rng.choice(family.options)
    hardware = priced(gpu, round(PRICES[gpu] * rng.uniform(0.8, 1.2), 2))
    limit = as_config(model).max_position_embeddings
    output_len, output_scale = _scaled(rng, family.output_bins, limit)
    prompt_cap = limit - max(d.hi for _, d in output_len.components)  # prompt + output fit
    prompt_len, prompt_scale = _scaled(rng, family.prompt_bins, prompt_cap)
    reference_gpu = HARDWARE["H100-SXM"]  # prefill wants FLOPs, decode bandwidth: the scarcer
    speed = min(hardware.flops / reference_gpu.flops, hardware.bandwidth / reference_gpu.bandwidth)
    rate = (rng.uniform(*LOAD) * family.per_gpu_rate * gpus * speed
            / ((prompt_scale + output_scale) / 2))
    slo = {"ttft": round(rng.uniform(*family.ttft), 1),
           "tpot": round(rng.uniform(*family.tpot) * 200) / 200}  # to 5 ms
    name = f"{family.kind} brief of {' '.join(student.split())}"
    return Scenario(name, model, hardware, gpus, prompt_len, output_len, float(f"{rate:.3g}"), slo,
                    num_requests=family.num_requests, seed=rng.getrandbits(32),
                    sim_requests=family.sim_requests)


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
    """What the recipe (recommend()) arrives at for scenario: the bar the grader of exercise
    11.2 measures a student's deployment against, worked at grade time (no answer is stored).
    Kept per scenario in this process: a few seconds each."""
    key = repr(scenario)  # a Scenario holds a dict, so it cannot be a key itself
    if key not in _REFERENCES:
        _REFERENCES[key] = recommend(scenario.model, scenario.hardware, scenario.workload(),
                                     scenario.slo, scenario.gpus,
                                     sim_requests=scenario.sim_requests)
    return _REFERENCES[key]
