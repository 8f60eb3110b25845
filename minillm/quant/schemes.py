"""Weight quantization schemes as the cost model prices them: bytes a weight, bytes an activation
crossing a collective, and how much faster the weight matmuls run.

Only int8 (W8A16) is implemented in the engine (minillm.quant.int8); the others are modelled, so
a reader can price them before a GPU that runs them is at hand:

- bf16: the baseline, 2 bytes a weight.
- int8 (W8A16): 1 byte a weight, per-output-channel scales; the matmul dequantizes to bf16, so
  it reads half the bytes and computes at the bf16 peak. Weight-only: no outlier handling is
  needed, since the activations stay bf16 (LLM.int8()'s outliers are activation features, a
  problem of W8A8).
- int4 (W4A16): half a byte a weight plus one 2-byte scale per group of 128 weights (GPTQ / AWQ
  style group-wise scales), still a bf16 matmul.
- fp8 (W8A8, e4m3): weights and activations in FP8, so the weight matmuls run on FP8 tensor
  cores at twice the dense bf16 peak: it helps compute-bound prefill as well as decode. Only
  GPUs with FP8 tensor cores (Ada sm_89, Hopper sm_90 and later) run it.

Attention and the output head stay in bf16 in every scheme (as in vLLM's default FP8 path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minillm.calc.hardware import Hardware, get_hardware

# GPUs in minillm.hardware.HARDWARE with FP8 tensor cores (Ada Lovelace and Hopper).
FP8_TENSOR_CORE_GPUS = frozenset({"H100-SXM", "H100-PCIe", "H200", "GH200", "L4", "RTX-4090"})


@dataclass(frozen=True)
class QuantScheme:
    """name: vLLM's --quantization spelling where it has one; weight_bytes: bytes per weight,
    scales included; activation_bytes: bytes per activation element between layers and in the
    all-reduces; matmul_speedup: the weight matmuls' peak over the dense bf16 peak; implemented:
    whether LLM(quantization=name) runs it (else it is modelled only)."""

    name: str
    weight_bytes: float
    activation_bytes: float
    matmul_speedup: float
    implemented: bool
    needs_fp8_tensor_cores: bool = False

    def check(self, hw: Hardware | str) -> None:
        """ValueError if hw cannot run this scheme."""
        device = get_hardware(hw)
        if self.needs_fp8_tensor_cores and device.name not in FP8_TENSOR_CORE_GPUS:
            raise ValueError(
                f"quantization {self.name!r} needs FP8 tensor cores (Ada or Hopper: "
                f"{', '.join(sorted(FP8_TENSOR_CORE_GPUS))}); {device.name} has none: pick "
                "'int8' or 'int4' (weight-only) there")

    def step_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of parallel.parallel_step_time for this scheme (K/V stay bf16)."""
        return dict(dtype_bytes=self.weight_bytes, kv_dtype_bytes=2,
                    activation_bytes=self.activation_bytes, matmul_speedup=self.matmul_speedup)


SCHEMES: dict[str, QuantScheme] = {s.name: s for s in (
    QuantScheme("bf16", 2.0, 2.0, 1.0, implemented=True),
    QuantScheme("int8", 1.0, 2.0, 1.0, implemented=True),
    QuantScheme("int4", 0.5 + 2 / 128, 2.0, 1.0, implemented=False),
    QuantScheme("fp8", 1.0, 1.0, 2.0, implemented=False, needs_fp8_tensor_cores=True),
)}


def get_scheme(name: str | None) -> QuantScheme:
    """The scheme called name (None: bf16); ValueError naming the choices otherwise."""
    if name is None:
        return SCHEMES["bf16"]
    if name not in SCHEMES:
        raise ValueError(f"quantization {name!r} is not one of {sorted(SCHEMES)}")
    return SCHEMES[name]
