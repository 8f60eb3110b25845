"""The GPU branches of the chapters, run on the CPU.

A chapter that sizes its experiment for a GPU (`gpu = device == "cuda"`) takes a branch no CPU
run executes. These tests execute that branch's cells with `device` set to "cuda", the engine
built on the CPU and the model shrunk to a few layers, so what the branch asks of the engine
(prompt lengths, step budgets) is checked here without a GPU and in seconds.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from minillm import LLM
from minillm.calc import models, roofline

CHAPTERS = Path(__file__).resolve().parents[1] / "chapters"


def cell_sources(notebook: str) -> dict[str, str]:
    nb = json.loads((CHAPTERS / notebook).read_text())
    return {c["id"]: "".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"}


class _TinyModels:
    """models.get, with any model shrunk to two narrow layers (same vocabulary and context)."""

    def get(self, name: str):
        cfg = models.get(name)
        return dataclasses.replace(cfg, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=32)


@pytest.fixture
def ch01_on_a_gpu():
    """Chapter 01's imports, then the namespace its GPU branch runs in (engine on the CPU)."""
    cells = cell_sources("01_prefill_vs_decode.ipynb")
    ns: dict = {}
    exec(cells["03100351"], ns)  # the imports and machine.device()
    ns.update(device="cuda", models=_TinyModels(),
              LLM=lambda *a, **k: LLM(*a, device="cpu", **k),
              this_machine=lambda: roofline.get_hardware("H100-SXM"))
    return cells, ns


def test_ch01_gpu_prefills_each_prompt_in_one_step(ch01_on_a_gpu):
    # Section 2 fits TTFT against the prompt length: a prompt split into chunks adds steps, so
    # its TTFT is several steps and the fit is no longer one prefill's cost.
    cells, ns = ch01_on_a_gpu
    exec(cells["0a7add08"], ns)
    exec(cells["4ff1aaa8"], ns)
    assert ns["gpu"] and max(ns["prompt_lens"]) == 4096
    prefill_steps: dict[str, int] = {}
    for step in ns["smol"].trace:
        for e in step.scheduled:
            if e.phase == "prefill":
                prefill_steps[e.request_id] = prefill_steps.get(e.request_id, 0) + 1
    assert len(prefill_steps) == 1 + 3 * len(ns["prompt_lens"])  # the warm-up, then 3 a length
    assert set(prefill_steps.values()) == {1}, "every prompt is prefilled in one step"
