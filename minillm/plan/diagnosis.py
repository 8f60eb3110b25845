"""Mystery deployments for the diagnosis lab: what an operator sees of a sick (or healthy) server.

mystery_deployment(seed) picks one cause from CAUSES, draws a model, a GPU, a workload and the
engine's knobs within ranges where that cause clearly shows (or, for "healthy", where nothing
is wrong), serves the workload in the simulator (modelled, as minillm.failure_modes) and hands
out a Deployment: the request metrics, the step trace, the prompts' token ids, the counters
of stats() that an operator has, the GPU's peak numbers and the latency SLO the service is
meant to meet. It does not hand out the EngineConfig: the knob that names the cause is what
the reader has to find; Deployment.dashboard() reads it as chapter 09's failure-modes table
does (minillm.dashboard.Dashboard). mystery_deployments(student, n) derives the seeds from
a name, so each student gets their own set, every cause among them.

The cause is kept on the Deployment in a private field for the grader (minillm.labs.ch09) and
score(); a reader who looks it up has diagnosed nothing.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from minillm.calc import models, roofline
from minillm.metrics import RequestMetrics, Summary, summarize
from minillm.model_config import ModelConfig
from minillm.plan.dashboard import Dashboard, dashboard_of
from minillm.sim.simulator import simulate
from minillm.trace import StepRecord
from minillm.workloads.prefixes import shared_prefix
from minillm.workloads.streams import Mixture, RequestSpec, Workload, closed_loop, poisson

CAUSES = ("static_batching", "long_prefill_blocking", "kv_pressure", "memory_bound_small_batch",
          "batch_too_large", "no_prefix_caching", "healthy")
MODELS = ("llama-3-8b", "llama-3.1-8b", "mistral-7b", "qwen2.5-7b")
GPUS = ("H100-SXM", "H200")
SLO = {"tpot": 0.010}  # seconds: every mystery service promises its users this TPOT
# stats() counters a deployment shows; the prefix-cache counters would say whether the cache
# is on, which is one of the answers.
VISIBLE_STATS = ("num_blocks", "num_preemptions")


@dataclass(frozen=True)
class Deployment:
    """One mystery deployment, as its operator sees it after serving a burst of traffic.

    name: a label. model_name: the model served (a minillm.models name); model: its ModelConfig
    (shapes, for roofline arithmetic). hardware: the GPU (peak flops in FLOP/s, bandwidth in
    bytes/s, memory in bytes). slo: the latency bounds the service promises (seconds, as
    minillm.metrics.meets_slo reads them). metrics: one RequestMetrics per request, in the
    workload's order (seconds on the run's clock).
    trace: the engine's StepRecords (batch composition, tokens per step, preempted ids; block
    tables are not recorded). prompts: each request's prompt token ids, in the same order.
    stats(): the engine counters an operator has (VISIBLE_STATS).
    """

    name: str
    model_name: str
    model: ModelConfig
    hardware: roofline.Hardware
    slo: dict[str, float]
    metrics: list[RequestMetrics] = field(repr=False)
    trace: list[StepRecord] = field(repr=False)
    _specs: tuple[RequestSpec, ...] = field(repr=False)
    _stats: dict[str, int] = field(repr=False)
    _cause: str = field(repr=False, compare=False)

    def stats(self) -> dict[str, int]:
        """The counters of LLM.stats() an operator would chart: KV pool size, preemptions."""
        return dict(self._stats)

    def summary(self) -> Summary:
        """TTFT, TPOT, ITL and E2E distributions, throughput and goodput under self.slo."""
        return summarize(self.metrics, self.slo)

    def dashboard(self) -> Dashboard:
        """The deployment as its dashboards show it (minillm.dashboard.Dashboard, modelled):
        p99s, goodput under self.slo, preemptions per minute, KV usage, requests running and
        waiting, GPU-Util and the DCGM counters. The prefix-cache hit rate reads nan: its
        counters are not among VISIBLE_STATS."""
        return dashboard_of(self.metrics, self.trace, self._stats, self.model, self.hardware,
                            self.slo)

    @cached_property
    def prompts(self) -> list[list[int]]:
        """Each request's prompt token ids (drawn on first use: a second or so for big runs)."""
        return [spec.token_ids(self.model.vocab_size) for spec in self._specs]

    @property
    def prompt_tokens(self) -> int:
        """All prompt tokens the requests sent."""
        return sum(spec.prompt_len for spec in self._specs)


# ---- one scenario per cause: (workload, engine knobs), drawn from rng --------------------------

Scenario = tuple[Workload, dict[str, Any]]


def _chat(rng: random.Random, n: int, rate: float) -> Workload:
    return poisson(n, rate, (rng.randint(64, 256), rng.randint(512, 1024)),
                   (rng.randint(32, 64), rng.randint(128, 256)), seed=rng.getrandbits(32))


def _static_batching(rng: random.Random, model: ModelConfig) -> Scenario:
    tail = Mixture([(0.8, (16, 64)), (0.2, (256, 512))])  # a few long answers hold each batch
    wl = poisson(160, rng.uniform(30, 60), (128, 512), tail, seed=rng.getrandbits(32))
    return wl, dict(scheduling="static", max_num_seqs=rng.choice([16, 24, 32, 48]))


def _long_prefill_blocking(rng: random.Random, model: ModelConfig) -> Scenario:
    specs = list(_chat(rng, 160, rng.uniform(8, 14)))
    long_len, every = rng.randint(6000, 8000), rng.randint(6, 10)
    for i in range(rng.randrange(every), len(specs), every):
        specs[i] = RequestSpec(specs[i].arrival_time, long_len, rng.randint(8, 32),
                               seed=rng.getrandbits(32))
    return Workload(specs), dict(enable_chunked_prefill=False, max_num_batched_tokens=8192,
                                 enable_prefix_caching=True)


def _kv_pressure(rng: random.Random, model: ModelConfig) -> Scenario:
    wl = poisson(160, rng.uniform(40, 200), (256, 1024), (256, 768), seed=rng.getrandbits(32))
    return wl, dict(num_kv_blocks=rng.randint(1600, 2400), max_num_seqs=256,
                    enable_prefix_caching=True)


def _memory_bound_small_batch(rng: random.Random, model: ModelConfig) -> Scenario:
    wl = _chat(rng, 120, rng.uniform(20, 40))
    return wl, dict(max_num_seqs=rng.choice([2, 4, 6, 8]), enable_prefix_caching=True)


def _batch_too_large(rng: random.Random, model: ModelConfig) -> Scenario:
    wl = closed_loop(320, rng.choice([192, 224, 256]), (1024, 1536), (256, 512),
                     seed=rng.getrandbits(32))
    return wl, dict(max_num_seqs=256, enable_prefix_caching=True)


def _system_prompts(rng: random.Random, model: ModelConfig) -> Workload:
    return shared_prefix(160, rng.randint(2, 6), rng.randint(1024, 3072), (32, 128), (32, 128),
                         rng.uniform(8, 20), vocab_size=model.vocab_size,
                         seed=rng.getrandbits(32))


def _no_prefix_caching(rng: random.Random, model: ModelConfig) -> Scenario:
    return _system_prompts(rng, model), dict(enable_prefix_caching=False)


def _healthy(rng: random.Random, model: ModelConfig) -> Scenario:
    wl = _system_prompts(rng, model) if rng.random() < 0.5 else _chat(rng, 160, rng.uniform(8, 20))
    return wl, dict(max_num_seqs=rng.choice([64, 128, 256]), enable_prefix_caching=True)


SCENARIOS: dict[str, Callable[[random.Random, ModelConfig], Scenario]] = {
    "static_batching": _static_batching, "long_prefill_blocking": _long_prefill_blocking,
    "kv_pressure": _kv_pressure, "memory_bound_small_batch": _memory_bound_small_batch,
    "batch_too_large": _batch_too_large, "no_prefix_caching": _no_prefix_caching,
    "healthy": _healthy}


def mystery_deployment(seed: int, cause: str | None = None) -> Deployment:
    """The deployment of seed: a cause drawn from CAUSES (or the one given), served. Modelled."""
    if cause is not None and cause not in CAUSES:
        raise ValueError(f"unknown cause {cause!r}; the causes are {', '.join(CAUSES)}")
    rng = random.Random(f"minillm-diagnosis-{seed}")
    drawn = rng.choice(CAUSES)  # drawn either way, so a seed's other draws never depend on it
    cause = cause or drawn
    model_name = rng.choice(MODELS)
    model, gpu = models.get(model_name), roofline.get_hardware(rng.choice(GPUS))
    wl, knobs = SCENARIOS[cause](rng, model)
    run = simulate(model, gpu, wl, record_block_tables=False, **knobs)
    label = hashlib.sha256(f"{seed}-{cause}".encode()).hexdigest()[:6]
    return Deployment(f"deployment-{label}", model_name, model, gpu, dict(SLO),
                      [o.metrics for o in run.outputs], run.trace, tuple(wl),
                      {k: run.stats[k] for k in VISIBLE_STATS}, cause)


def student_seeds(student: str, n: int) -> list[tuple[int, str]]:
    """(seed, cause) for a student's n deployments: seeds from a hash of the name, and the
    causes dealt in shuffled rounds of all of CAUSES, so any 7 in a row hold every cause."""
    if not isinstance(student, str) or not student.strip():
        raise ValueError(f"student must be a non-empty name, got {student!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive number of deployments, got {n!r}")
    digest = int(hashlib.sha256(student.strip().lower().encode()).hexdigest(), 16)
    rng = random.Random(digest)
    causes: list[str] = []
    while len(causes) < n:
        causes += rng.sample(CAUSES, len(CAUSES))
    return [(rng.getrandbits(48), cause) for cause in causes[:n]]


def mystery_deployments(student: str, n: int = 7) -> list[Deployment]:
    """A student's own n mystery deployments (the same name always gives the same ones)."""
    return [mystery_deployment(seed, cause) for seed, cause in student_seeds(student, n)]


def score(diagnose: Callable[[Deployment], str], deployments: Sequence[Deployment]
          ) -> list[tuple[str, str, str]]:
    """(deployment name, your answer, the cause) for each deployment: for practice on your own
    deployments once you have committed to your answers."""
    return [(d.name, diagnose(d), d._cause) for d in deployments]


def share_of_prompt_shared(d: Deployment, probe: int = 64) -> float:
    """The share of requests whose first probe prompt tokens also open another request's prompt:
    a cheap sign of shared system prompts (minillm.prefix_workload.shared_token_fraction gives
    the exact share of tokens, at more cost)."""
    heads: dict[tuple[int, ...], int] = {}
    for prompt in d.prompts:
        head = tuple(prompt[:probe])
        heads[head] = heads.get(head, 0) + 1
    return sum(c for c in heads.values() if c > 1) / len(d.prompts) if d.prompts else math.nan
