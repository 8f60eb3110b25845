"""run_deployment reads goodput and cost in the run's steady state, prices the weights of a
quantization scheme, and activation_peak_bytes prices what the memory headroom must hold."""

import math

import pytest

from minillm.calc import parallel
from minillm.calc.hardware import HARDWARE
from minillm.calc.models import as_config
from minillm.plan.capstone import SCENARIOS
from minillm.plan.deployment import (
    GPU_MEMORY_UTILIZATION,
    Deployment,
    activation_peak_bytes,
    run_deployment,
)
from minillm.workloads import streams as workload

pytestmark = pytest.mark.ch11


@pytest.fixture(scope="module")
def chat_70b_run():
    """The chapter's capstone brief under the recipe's plan on base (TP 4 x 2, 134 seats)."""
    scenario = SCENARIOS["chat-70b"]
    plan = Deployment(4, replicas=2, max_num_seqs=134, max_num_batched_tokens=512)
    return scenario, run_deployment(scenario.model, scenario.hardware, scenario.workload(),
                                    scenario.slo, plan, sim_requests=scenario.sim_requests)


def test_goodput_is_the_steady_state_rate_not_diluted_by_the_drain(chat_70b_run):
    scenario, run = chat_70b_run
    # Goodput cannot beat the offered rate times the share on time, and in steady state it
    # reaches it: on base the drain counted, 17.8 req/s against 30 x 97% = 29.
    assert run.goodput <= scenario.rate * run.attainment * 1.1
    assert run.goodput >= 0.85 * scenario.rate * run.attainment
    assert run.finite_run_goodput < 0.7 * run.goodput  # the old count, drain included


def test_cost_is_priced_at_the_tokens_the_fleet_sustains(chat_70b_run):
    scenario, run = chat_70b_run
    specs = scenario.workload()
    tokens_per_s = scenario.rate * sum(s.output_len for s in specs) / len(specs)
    independent = (scenario.hardware.dollars_per_hour * run.deployment.gpus / 3600
                   / tokens_per_s * 1e6)
    assert independent == pytest.approx(0.86, abs=0.02)
    assert run.dollars_per_million_tokens == pytest.approx(independent, rel=0.1)  # base: $1.38


def _run(quantization, model="llama-3-8b", hw="H100-SXM"):
    specs = workload.poisson(40, 4.0, (1500, 2500), (20, 40), seed=2)
    return run_deployment(model, hw, specs, {"ttft": 5.0}, Deployment(
        max_num_seqs=32, quantization=quantization), sim_requests=40)


def test_int8_weights_leave_more_of_the_gpu_to_the_kv_cache():
    bf16, int8 = _run(None), _run("int8")
    weights_saved = parallel.weight_bytes_per_gpu(as_config("llama-3-8b"),
                                                  parallel.ParallelConfig(1), 1.0)
    block = bf16.result.config.block_size * 2 * 32 * 8 * 128 * 2  # K and V of one block, bf16
    gained = int8.result.config.num_kv_blocks - bf16.result.config.num_kv_blocks
    assert gained == pytest.approx(weights_saved / block, rel=0.01)


def test_fp8_prefills_faster_than_int8_on_fp8_tensor_cores():
    # Both read 1 byte a weight; only fp8 runs the (compute-bound) prefill matmuls at 2x.
    int8, fp8 = _run("int8"), _run("fp8")
    assert fp8.summary.ttft.p50 < 0.8 * int8.summary.ttft.p50


def test_fp8_is_refused_on_a_gpu_without_fp8_tensor_cores():
    with pytest.raises(ValueError, match="FP8 tensor cores.*A100-80GB has none"):
        _run("fp8", hw="A100-80GB")


def test_an_unknown_scheme_is_named():
    with pytest.raises(ValueError, match="'awq4' is not one of"):
        Deployment(quantization="awq4")


def test_activation_peak_counts_the_mlp_and_shrinks_with_tp():
    config = as_config("llama-3-70b")
    one, four = parallel.ParallelConfig(1), parallel.ParallelConfig(4)
    tokens = 8192
    mlp = tokens * 3 * config.intermediate_size * 2
    residual = 2 * tokens * config.hidden_size * 2
    assert activation_peak_bytes(config, one, tokens, 256) == residual + mlp
    assert activation_peak_bytes(config, four, tokens, 256) == residual + mlp / 4


def test_the_largest_step_fits_the_ten_percent_headroom_many_times_over():
    # vLLM deducts this peak inside gpu_memory_utilization; the 10% outside holds the CUDA
    # graphs, buffers and fragmentation. Even 16k tokens on the 70B at TP 4 is a few % of it.
    headroom = HARDWARE["H100-SXM"].memory * (1 - GPU_MEMORY_UTILIZATION)
    peak = activation_peak_bytes("llama-3-70b", parallel.ParallelConfig(4), 16384, 256)
    assert peak < headroom / 4
    assert math.isclose(headroom, 8e9, rel_tol=0.01)


def test_bad_step_sizes_are_named():
    with pytest.raises(ValueError, match="tokens must be a positive int, got 0"):
        activation_peak_bytes("llama-3-8b", parallel.ParallelConfig(1), 0, 1)
