"""recommend(): the starting-config recipe picks TP 1 when one GPU holds the model, TP >= 2
when it does not, max_num_seqs from the KV formula, a config whose own simulation meets the
SLO, and refuses naming the binding constraint (the weights, or the SLO metric) when none can."""

import dataclasses
import math

import pytest

from minillm import simulate
from minillm.calc import parallel
from minillm.calc.hardware import HARDWARE
from minillm.calc.roofline import StepOverheads
from minillm.metrics import percentile
from minillm.plan.recipe import (
    MAX_NUM_SEQS_CAP,
    MIN_BATCHED_TOKENS,
    attainment,
    choose_batched_tokens,
    recommend,
    replica_share,
)
from minillm.workloads import streams as workload

pytestmark = pytest.mark.ch11

LOOSE = {"ttft": 2.0, "tpot": 0.1}
SIM_REQUESTS = 150  # a noisy but cheap sample: each recommend() call is a few seconds


@pytest.fixture(scope="module")
def chat():
    """Chat-like traffic: prompts of 100-1,500 tokens, answers of 50-400, 6 req/s."""
    return workload.poisson(300, 6.0, (100, 1500), (50, 400), seed=1)


@pytest.fixture(scope="module")
def small_8b(chat):
    return recommend("llama-3-8b", "H100-SXM", chat, LOOSE, gpus=1, sim_requests=SIM_REQUESTS)


def test_an_8b_on_one_h100_needs_no_tensor_parallelism(small_8b):
    assert small_8b.tensor_parallel_size == 1 and small_8b.replicas == 1
    assert small_8b.attainment >= 0.9
    assert small_8b.max_num_batched_tokens >= MIN_BATCHED_TOKENS


def test_the_recommended_config_keeps_up_with_the_traffic(small_8b, chat):
    """Goodput can never beat the rate at which the simulated requests arrived, and a config
    that keeps up serves them at that rate in steady state: within 10% of it, times the share
    that met the SLO."""
    share = list(chat)[:SIM_REQUESTS]
    arrival_rate = SIM_REQUESTS / (share[-1].arrival_time - share[0].arrival_time)
    assert 0.9 * small_8b.attainment * arrival_rate <= small_8b.goodput <= arrival_rate


def test_reasoning_quotes_the_kv_formula(small_8b, chat):
    """Step 2's line carries the KV wall at the typical length, as parallel computes it."""
    typical = math.ceil(percentile([s.prompt_len + s.output_len for s in chat], 90))
    wall = parallel.max_concurrency("llama-3-8b", "H100-SXM", parallel.ParallelConfig(1),
                                    typical, 0.9)
    kv_line = small_8b.reasoning[1]
    assert "KV formula" in kv_line and f"= {wall} sequences" in kv_line
    assert f"{typical} tokens" in kv_line
    assert wall > MAX_NUM_SEQS_CAP and "capped" in kv_line
    assert small_8b.explain().startswith("1. TP 1")


def test_the_recommended_config_simulated_again_meets_the_slo(small_8b, chat):
    share = replica_share(chat, small_8b.replicas)[:SIM_REQUESTS]
    result = simulate("llama-3-8b", "H100-SXM", share, record_block_tables=False,
                      **small_8b.engine_kwargs())
    assert attainment(result, LOOSE)["all"] >= 0.9
    assert result.summary(LOOSE).goodput == pytest.approx(small_8b.summary.goodput)
    # The attainment the recipe reports, counted by hand from the run's requests.
    met = [o.metrics.ttft <= LOOSE["ttft"] and o.metrics.tpot <= LOOSE["tpot"]
           for o in result.outputs]
    assert len(met) == SIM_REQUESTS and small_8b.attainment == pytest.approx(sum(met) / len(met))


def test_a_70b_on_eight_h100s_is_split(chat):
    """141 GB of bf16 weights cannot sit on one 80 GB GPU."""
    rec = recommend("llama-3-70b", "H100-SXM", chat, LOOSE, gpus=8, sim_requests=SIM_REQUESTS)
    assert rec.tensor_parallel_size >= 2
    assert rec.replicas == 8 // rec.tensor_parallel_size
    assert rec.attainment >= 0.9
    assert "TP 1 would hold fewer than" in rec.reasoning[0]


def test_a_405b_on_two_nodes_pipelines_across_them():
    """811 GB of bf16 weights: TP 8 inside a node leaves 101 GB per GPU, over 80 GB; two
    stages across two nodes halve it."""
    specs = workload.poisson(60, 0.5, (200, 1000), (50, 200), seed=0)
    rec = recommend("llama-3.1-405b", "H100-SXM", specs, {"ttft": 5.0, "tpot": 0.2}, gpus=16,
                    sim_requests=60)
    assert (rec.tensor_parallel_size, rec.pipeline_parallel_size) == (8, 2)
    assert rec.gpus_used == 16 and "PP 2" in rec.reasoning[0]
    assert rec.engine_kwargs()["pipeline_parallel_size"] == 2


def test_a_priced_gpu_gets_dollars_per_million_tokens():
    priced = dataclasses.replace(HARDWARE["H100-SXM"], dollars_per_hour=3.0)
    specs = workload.poisson(80, 4.0, (100, 500), (50, 200), seed=0)
    rec = recommend("llama-3-8b", priced, specs, LOOSE, gpus=2, sim_requests=40)
    # By hand: every GPU in use is paid for, each replica makes the tokens its share of the
    # requests asks for, at the rate they arrive (steady state: no drain, no warm-up).
    share = list(specs)[::rec.replicas][:40]
    rate = (len(share) - 1) / (share[-1].arrival_time - share[0].arrival_time)
    mean_output = sum(s.output_len for s in share) / len(share)
    tokens_per_hour = rate * mean_output * rec.replicas * 3600
    dollars_per_hour = 3.0 * rec.gpus_used
    assert rec.dollars_per_million_tokens == pytest.approx(dollars_per_hour / tokens_per_hour * 1e6)
    assert f"${rec.dollars_per_million_tokens:.3f} per 1M tokens" in rec.reasoning[-1]
    # Twice the price: the same deployment (the recipe picks by the SLO), twice the cost.
    dearer = recommend("llama-3-8b", dataclasses.replace(priced, dollars_per_hour=6.0), specs,
                       LOOSE, gpus=2, sim_requests=40)
    assert dearer.deployment == rec.deployment
    assert dearer.dollars_per_million_tokens == pytest.approx(2 * rec.dollars_per_million_tokens)
    unpriced = recommend("llama-3-8b", "H100-SXM", specs, LOOSE, gpus=2, sim_requests=40)
    assert unpriced.dollars_per_million_tokens is None
    assert "per 1M tokens" not in unpriced.reasoning[-1]


def test_a_405b_on_one_gpu_is_refused_naming_the_weights(chat):
    with pytest.raises(ValueError, match=r"weights alone need 811\.\d GB per GPU at TP 1"):
        recommend("llama-3.1-405b", "H100-SXM", chat, LOOSE, gpus=1)


def test_an_impossible_tpot_is_refused_naming_tpot(chat):
    with pytest.raises(ValueError, match="TPOT is the binding constraint"):
        recommend("llama-3-8b", "H100-SXM", chat, {"ttft": 2.0, "tpot": 1e-4}, gpus=1,
                  sim_requests=100)


def test_an_overload_is_refused_naming_ttft():
    """40 req/s of 3k-6k-token prompts is ~180k prompt tokens/s, ~2.9 PFLOP/s of prefill at
    16 GFLOP a token: three times an H100's peak, so the queue and TTFT grow whatever the
    knobs."""
    rag = workload.poisson(150, 40.0, (3000, 6000), (20, 50), seed=0)
    with pytest.raises(ValueError, match=r"TTFT is the binding constraint.*p90 TTFT \d+"):
        recommend("llama-3-8b", "H100-SXM", rag, {"ttft": 0.3, "tpot": 0.1}, gpus=1,
                  sim_requests=150)


def test_the_chunk_keeps_a_mixed_step_under_the_tpot_slo():
    """Step 3: the budget's mixed step is under TPOT, and doubling it would not be."""
    specs = workload.poisson(50, 1.0, 1000, 200, seed=0)
    tpot, seqs, typical = 0.03, 64, 1200
    budget = choose_batched_tokens("llama-3-8b", "H100-SXM", parallel.ParallelConfig(1), seqs,
                                   typical, specs, {"tpot": tpot}, [])

    def mixed(b):
        return parallel.parallel_step_time("llama-3-8b", "H100-SXM",
                                           [(b, b)] + [(1, typical)] * (seqs - 1),
                                           parallel.ParallelConfig(1)).time
    assert MIN_BATCHED_TOKENS <= budget and mixed(budget) <= tpot < mixed(2 * budget)


def test_step_overheads_shrink_the_chunk():
    """10 ms a step (a slow framework) leaves less of the TPOT SLO for the chunk."""
    specs = workload.poisson(50, 1.0, 1000, 200, seed=0)
    layout, slo = parallel.ParallelConfig(1), {"tpot": 0.03}
    peak = choose_batched_tokens("llama-3-8b", "H100-SXM", layout, 64, 1200, specs, slo, [])
    slowed = choose_batched_tokens("llama-3-8b", "H100-SXM", layout, 64, 1200, specs, slo, [],
                                   StepOverheads(overhead=0.01, overhead_per_seq=1e-4))
    assert MIN_BATCHED_TOKENS <= slowed < peak


def test_replica_share_takes_every_nth_request_at_a_fraction_of_the_rate():
    specs = workload.poisson(10, 4.0, 10, 5, seed=0)
    share = replica_share(specs, 3)
    assert list(share) == list(specs)[::3] and share.rate == pytest.approx(4.0 / 3)


@pytest.mark.parametrize("kwargs,message", [
    ({"gpus": 0}, "gpus must be a positive int"),
    ({"slo": {}}, "slo must be a non-empty dict"),
    ({"slo": {"latency": 1.0}}, "unknown SLO metric 'latency'"),
    ({"slo": {"tpot": -1}}, r"slo\['tpot'\] must be a positive number"),
    ({"workload": []}, "workload must be a non-empty sequence of RequestSpec"),
    ({"attainment_target": 1.5}, "attainment_target must be in"),
    ({"overheads": {"launch": 1e-3}}, "unknown overhead 'launch'"),
    ({"overheads": {"overhead": -1}}, r"overheads must be >= 0 seconds, got "
                                      r"overhead=-1,"),
])
def test_bad_inputs_are_named(kwargs, message):
    args = {"model": "llama-3-8b", "hw": "H100-SXM",
            "workload": workload.poisson(5, 1.0, 10, 5), "slo": LOOSE, "gpus": 1} | kwargs
    with pytest.raises(ValueError, match=message):
        recommend(**args)


# ---- max_num_seqs: raise until the SLO breaks, then back off one step ------------------------

def _fake_runs(breaks_above: int, peak=lambda n: n):
    """run(n) for climb_max_num_seqs: the SLO holds up to breaks_above seats, and the batch
    fills peak(n) of the n seats; every call is logged."""
    from types import SimpleNamespace

    from minillm.trace import StepRecord

    calls = []

    def run(n):
        calls.append(n)
        step = StepRecord(step=0, start=0.0, end=1.0, scheduled=[None] * peak(n),
                          num_free_blocks=0, block_tables={})
        return SimpleNamespace(attainment=1.0 if n <= breaks_above else 0.5,
                               deployment=SimpleNamespace(max_num_seqs=n),
                               result=SimpleNamespace(trace=[step]))
    return run, calls


def test_max_num_seqs_rises_by_quarters_until_the_slo_breaks_then_backs_off():
    from minillm.plan.recipe import climb_max_num_seqs

    run, calls = _fake_runs(breaks_above=170)
    chosen = climb_max_num_seqs(run, 100, 0.9)
    assert calls == [100, 125, 150, 175]  # steps of 100 // 4; 175 breaks the SLO
    assert chosen.deployment.max_num_seqs == 150  # one step back


def test_max_num_seqs_stops_at_twice_the_formula_and_when_the_cap_never_binds():
    from minillm.plan.recipe import climb_max_num_seqs

    run, calls = _fake_runs(breaks_above=10_000)
    assert climb_max_num_seqs(run, 40, 0.9).deployment.max_num_seqs == 80
    assert calls == [40, 50, 60, 70, 80]
    run, calls = _fake_runs(breaks_above=10_000, peak=lambda n: min(n, 55))
    assert climb_max_num_seqs(run, 40, 0.9).deployment.max_num_seqs == 60
    assert calls == [40, 50, 60]  # at 60 the batch peaked at 55: a higher cap changes nothing


def test_max_num_seqs_falls_by_the_same_steps_when_the_formula_breaks_the_slo():
    from minillm.plan.recipe import climb_max_num_seqs

    run, calls = _fake_runs(breaks_above=60)
    assert climb_max_num_seqs(run, 100, 0.9).deployment.max_num_seqs == 50
    assert calls == [100, 75, 50]


# ---- quantization as a recipe step ------------------------------------------------------------

def test_int8_weights_halve_the_tp_a_70b_needs(chat):
    """Step 1 for 4,096-token requests: 70 GB of int8 weights fit two H100s with room for the
    K/V of four; bf16's 141 GB need four GPUs. The whole recipe carries the scheme into its
    deployment and its reasoning."""
    from minillm.calc.models import as_config
    from minillm.plan.recipe import choose_layout

    config, longest = as_config("llama-3-70b"), 4096
    bf16 = choose_layout(config, HARDWARE["H100-SXM"], 8, longest, [])
    int8 = choose_layout(config, HARDWARE["H100-SXM"], 8, longest, [], quantization="int8")
    assert (bf16.tensor_parallel_size, int8.tensor_parallel_size) == (4, 2)
    rec = recommend("llama-3-70b", "H100-SXM", chat, LOOSE, gpus=8, sim_requests=SIM_REQUESTS,
                    quantization="int8")
    assert rec.deployment.quantization == "int8"
    assert rec.reasoning[0].startswith("Quantization 'int8': 1 bytes a weight")
    assert rec.reasoning[1].startswith("TP 2: the weights take 35.3 GB per GPU")


def test_fp8_is_refused_by_the_recipe_on_an_a100(chat):
    with pytest.raises(ValueError, match="needs FP8 tensor cores"):
        recommend("llama-3-8b", "A100-80GB", chat, LOOSE, gpus=1, quantization="fp8")
