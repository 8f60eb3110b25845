"""simulate(..., tensor_parallel_size=, pipeline_parallel_size=): the engine's scheduler on a
TP x PP layout, its pool sized per GPU and its steps priced by minillm.parallel."""

import pytest

from minillm.calc import parallel
from minillm.calc.parallel import ParallelConfig
from minillm.calc.roofline import StepOverheads
from minillm.sim.simulator import simulate
from minillm.workloads import streams as workload

pytestmark = pytest.mark.ch11


SLOW = StepOverheads(overhead=2e-4, overhead_per_seq=1e-5)  # a framework's per-step costs


def _requests(n: int = 120, rate: float = 8.0) -> workload.Workload:
    return workload.poisson(n, rate, workload.Uniform(64, 512), workload.Uniform(16, 96), seed=3)


def _token_times(result):
    return [o.metrics.token_times for o in result.outputs]


def test_one_gpu_layout_is_todays_simulation():
    wl = _requests()
    today = simulate("llama-3-8b", "H100-SXM", wl, overheads=SLOW)
    explicit = simulate("llama-3-8b", "H100-SXM", wl, overheads=SLOW,
                        tensor_parallel_size=1, pipeline_parallel_size=1)
    assert _token_times(explicit) == _token_times(today)
    assert explicit.config == today.config and explicit.layout == ParallelConfig()
    # The parallel cost model at 1 x 1 prices every step exactly as the roofline does.
    priced = simulate("llama-3-8b", "H100-SXM", wl, overheads=SLOW,
                      step_time=parallel.step_timer(ParallelConfig()))
    assert _token_times(priced) == _token_times(today)


def test_70b_on_tp_2_4_8_the_pool_grows_and_tpot_falls():
    wl = _requests()
    results = {tp: simulate("llama-3-70b", "H100-SXM", wl, tensor_parallel_size=tp,
                            record_block_tables=False) for tp in (2, 4, 8)}
    for tp, result in results.items():
        assert result.layout == ParallelConfig(tp)
        assert result.config.num_kv_blocks == parallel.num_kv_blocks(
            "llama-3-70b", "H100-SXM", ParallelConfig(tp), 16, 2, 0.9)
    blocks = [results[tp].config.num_kv_blocks for tp in (2, 4, 8)]
    tpot = [results[tp].summary().tpot.mean for tp in (2, 4, 8)]
    assert blocks[0] < blocks[1] < blocks[2]
    assert tpot[0] > tpot[1] > tpot[2]


def test_pipeline_stages_add_latency_at_light_load():
    """A request's steps still pass the stages one after another (and a send between them):
    under light load TP 4 x PP 2 gives no better TPOT than TP 4 alone, only more KV room.
    (Under load its p batches in flight fill the pipeline: tests/test_virtual_engines.py.)"""
    wl = _requests(60)
    tp4 = simulate("llama-3-70b", "H100-SXM", wl, tensor_parallel_size=4,
                   record_block_tables=False)
    tp4pp2 = simulate("llama-3-70b", "H100-SXM", wl, tensor_parallel_size=4,
                      pipeline_parallel_size=2, record_block_tables=False)
    assert tp4pp2.config.num_kv_blocks > tp4.config.num_kv_blocks  # half the layers a GPU
    assert tp4pp2.summary().tpot.mean >= tp4.summary().tpot.mean


def test_bad_layouts_in_simulate_are_clear_errors():
    wl = _requests(4)
    with pytest.raises(ValueError, match="power of two"):
        simulate("llama-3-8b", "H100-SXM", wl, tensor_parallel_size=3)
    with pytest.raises(ValueError, match="num_attention_heads=14"):
        simulate("qwen2.5-0.5b", "H100-SXM", wl, tensor_parallel_size=4)
    with pytest.raises(ValueError, match="raise tensor_parallel_size"):
        simulate("llama-3.1-405b", "H100-SXM", wl, tensor_parallel_size=4)
    with pytest.raises(ValueError, match="not modelled on several GPUs"):
        simulate("llama-3-8b", "H100-SXM", wl, tensor_parallel_size=2, acceptance_rate=0.7,
                 speculative_config={"method": "ngram", "num_speculative_tokens": 3})
