"""The engine and the simulator run one step loop (minillm.step_loop): only the executor differs.

The simulator's schedules equal the engine's step for step (tests/test_simulator.py); here, the
bookkeeping is one code path, so a change to it reaches both."""

from __future__ import annotations

import dataclasses
import math

import pytest

from minillm import LLM, SamplingParams, default_model_path
from minillm.engine import Engine
from minillm.model_config import ModelConfig
from minillm.sim.kv_handover import DecodeReplica
from minillm.sim.simulated_engine import Simulator
from minillm.sim.simulator import simulate
from minillm.step_loop import StepLoop
from minillm.workloads import streams as workload

SHIPPED = ModelConfig.from_pretrained(default_model_path())
BOOKKEEPING = ("run_step", "_advance", "_take_tokens", "_append_token", "_fail", "_record")


@pytest.mark.parametrize("loop", [Engine, Simulator, DecodeReplica])
def test_the_engine_and_every_simulated_engine_keep_the_shared_bookkeeping(loop: type) -> None:
    assert issubclass(loop, StepLoop)
    overridden = [name for name in BOOKKEEPING
                  if getattr(loop, name) is not getattr(StepLoop, name)]
    assert not overridden, f"{loop.__name__} re-implements the step loop's {overridden}"
    for hook in ("now", "move_blocks", "execute", "stats"):  # and gives the executor's side
        assert getattr(loop, hook) is not getattr(StepLoop, hook)


def test_a_change_to_the_step_loop_reaches_the_engine_and_the_simulator(monkeypatch) -> None:
    """Patch the shared rule that appends a token so that every request stops at 2 tokens: the
    engine's outputs and the simulator's both change, and both still free every block."""
    work = workload.poisson(5, math.inf, (8, 24), (6, 10), seed=3)
    kwargs = dict(max_num_seqs=3, max_num_batched_tokens=64, num_kv_blocks=32, block_size=8)

    def run_both() -> tuple[list[int], list[int], LLM]:
        llm = LLM(device="cpu", dtype="float32", **kwargs)
        params = [SamplingParams(max_tokens=s.output_len, temperature=0.0, ignore_eos=True)
                  for s in work]
        outs = llm.generate([s.token_ids(SHIPPED.vocab_size) for s in work], params,
                            use_tqdm=False)
        sim = simulate(SHIPPED, "H100-SXM", work, **kwargs)
        return ([len(o.token_ids) for o in outs], [len(o.token_ids) for o in sim.outputs], llm)

    engine_lens, sim_lens, _ = run_both()
    assert engine_lens == sim_lens == [s.output_len for s in work]  # all > 2

    original = StepLoop._append_token

    def stop_at_two(self, req, token, logprobs, now):  # a change to the shared code path
        req.params = dataclasses.replace(req.params, max_tokens=min(req.params.max_tokens, 2))
        original(self, req, token, logprobs, now)

    monkeypatch.setattr(StepLoop, "_append_token", stop_at_two)
    engine_lens, sim_lens, llm = run_both()
    assert engine_lens == sim_lens == [2] * len(work)
    assert llm.stats()["num_free_blocks"] == kwargs["num_kv_blocks"]
