"""The capstone's scenarios: recommend() meets each SLO in the simulator, evaluate() prices any
deployment with recommend()'s own ruler, and run_deployment scales one replica to the fleet."""

from __future__ import annotations

import dataclasses

import pytest

from minillm.plan.capstone import SCENARIOS, evaluate, reference
from minillm.plan.deployment import Deployment, replica_share, run_deployment

pytestmark = pytest.mark.ch11


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_recipe_meets_every_scenarios_slo(name: str) -> None:
    scenario = SCENARIOS[name]
    rec = reference(scenario)
    run = evaluate(scenario, rec.deployment)  # simulated again, on the same ruler
    assert run.attainment >= 0.9 and rec.attainment == run.attainment
    # The attainment, counted by hand from the simulated requests against the scenario's SLO.
    met = [all(getattr(o.metrics, name) <= bound for name, bound in scenario.slo.items())
           for o in run.result.outputs]
    assert run.attainment == pytest.approx(sum(met) / len(met))
    assert run.goodput == pytest.approx(rec.goodput)
    assert rec.gpus_used <= scenario.gpus
    assert run.dollars_per_million_tokens == pytest.approx(rec.dollars_per_million_tokens)


def test_each_scenario_asks_for_a_different_layout() -> None:
    """The 8B fits one GPU (replicas), the 70B needs TP, the 405B pipelines across nodes."""
    layouts = {name: (reference(s).tensor_parallel_size, reference(s).pipeline_parallel_size,
                      reference(s).replicas) for name, s in SCENARIOS.items()}
    assert layouts["rag-8b"] == (1, 1, 4)
    assert layouts["chat-70b"] == (4, 1, 2)
    assert layouts["long-405b"] == (8, 2, 1)


def test_the_chapter_scenario_rewards_the_recipe_over_the_defaults() -> None:
    scenario = SCENARIOS["chat-70b"]
    recipe = evaluate(scenario, reference(scenario).deployment)
    for naive in (Deployment(8), Deployment(4, replicas=2)):
        run = evaluate(scenario, naive)
        assert run.attainment < 0.9 and run.goodput < 0.8 * recipe.goodput


def test_run_deployment_scales_one_replica_to_the_fleet() -> None:
    """Four replicas behind an even router: one replica serves every fourth request, and the
    fleet's goodput is four times that replica's, at its cost per token."""
    scenario = SCENARIOS["rag-8b"]
    workload = scenario.workload()
    deployment = Deployment(1, replicas=4, max_num_seqs=64, max_num_batched_tokens=512)
    run = run_deployment(scenario.model, scenario.hardware, workload, scenario.slo, deployment,
                         sim_requests=100)
    served = sorted(o.metrics.arrival_time for o in run.result.outputs)
    assert served == [s.arrival_time for s in list(workload)[::4][:100]]
    # Goodput and cost are read however minillm.deployment reads one run (its steady state);
    # what the fleet adds is the scaling, checked against the replica's share served alone.
    # The same engine serving that share alone: the same run, a quarter of the fleet's goodput
    # at the same cost per token (a quarter of the GPUs making a quarter of the tokens).
    alone = run_deployment(scenario.model, scenario.hardware, replica_share(workload, 4),
                           scenario.slo, Deployment(1, max_num_seqs=64,
                                                    max_num_batched_tokens=512),
                           sim_requests=100)
    assert run.goodput == pytest.approx(4 * alone.goodput)
    assert run.dollars_per_million_tokens == pytest.approx(alone.dollars_per_million_tokens)


def test_an_unpriced_gpu_has_no_cost_and_budgets_are_enforced() -> None:
    scenario = SCENARIOS["rag-8b"]
    unpriced = dataclasses.replace(scenario.hardware, dollars_per_hour=None)
    run = run_deployment(scenario.model, unpriced, scenario.workload(), scenario.slo,
                         Deployment(), sim_requests=50)
    assert run.dollars_per_million_tokens is None
    with pytest.raises(ValueError, match="needs 8 GPUs .* rag-8b gives 4"):
        evaluate(scenario, Deployment(2, replicas=4))


@pytest.mark.parametrize("kwargs, match", [
    ({"tensor_parallel_size": 0}, "tensor_parallel_size must be a positive int, got 0"),
    ({"replicas": 1.5}, "replicas must be a positive int, got 1.5"),
    ({"enable_chunked_prefill": "yes"}, "enable_chunked_prefill must be True or False"),
])
def test_bad_deployments_are_named(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Deployment(**kwargs)


def test_scenarios_describe_themselves() -> None:
    text = SCENARIOS["chat-70b"].describe()
    for needed in ("llama-3-70b", "8 H100-SXM", "$3.00/GPU-hour, assumed", "30 requests/s",
                   "TTFT 1000 ms", "TPOT 50 ms", "50% 200-800"):
        assert needed in text, needed
