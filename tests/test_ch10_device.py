"""Chapter 10's quantization cells hold on a GPU's engine: run them as the notebook has them,
GPU-shaped (MINILLM_GPU_SHAPED: fp16 as a T4, bf16 as an H200), on a shorter held-out text.

The baseline must be the engine LLM() builds (bf16/fp16 there, not fp32), the byte ratios follow
its dtype's bytes, and a T4, which has no fp8 K/V, measures int8 in its place and says why."""

import json
from pathlib import Path

import pytest

from minillm import quality as quality_module

CHAPTER = Path(__file__).resolve().parents[1] / "chapters" / "10_faster_decode.ipynb"
SETUP, MEASURE, ASSERTS = "3dfe3c2e", "ca366ba4", "320803ae"
SHORT_TEXT = 2600  # characters (~870 tokens: 3 teacher-forced passages of 256), not 30,000


def cell_sources() -> dict[str, str]:
    nb = json.loads(CHAPTER.read_text())
    return {c["id"]: "".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"}


@pytest.mark.parametrize("shape, base_name, dtype_bytes", [("fp16", "fp16", 2),
                                                           ("bf16", "bf16", 2)])
def test_quantization_cells_hold_gpu_shaped(monkeypatch, capsys, shape, base_name, dtype_bytes):
    monkeypatch.setenv("MINILLM_GPU_SHAPED", shape)
    src = cell_sources()
    ns: dict = {"__name__": "ch10"}
    exec(compile(src[SETUP], "setup", "exec"), ns)
    # Only the text is shorter: the cells' code, knobs and asserts run as the chapter has them.
    ns["held_out_text"] = lambda: quality_module.held_out_text()[:SHORT_TEXT]
    exec(compile(src[MEASURE], MEASURE, "exec"), ns)
    exec(compile(src[ASSERTS], ASSERTS, "exec"), ns)
    out = capsys.readouterr().out
    assert ns["BASE"] == base_name and ns["DTYPE_BYTES"] == dtype_bytes
    assert base_name in ns["quality"] and "fp32" not in ns["quality"]
    if shape == "fp16":  # a T4 (sm_75): int8 stands in for fp8 K/V, and the cell says so
        assert ns["kv8"] == "int8" and "fp8 K/V needs compute capability 8.9" in out
        assert "fp8 KV" not in ns["quality"]
    else:  # an H200 (sm_90) runs fp8 K/V
        assert ns["kv8"] == "fp8" and "fp8 KV" in ns["quality"]
