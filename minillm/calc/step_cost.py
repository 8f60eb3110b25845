"""What one priced step is: its FLOPs and bytes, the roofline's two times, the bound it hits.

StepCost is what minillm.calc.roofline.step_time returns; SerialStepCost is what a cost model
built by roofline.serial_phases returns for a step that mixes prefill and decode. roofline
computes both and re-exports them; only the records live here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class StepCost:
    """One step on the roofline. flops; bytes moved; compute_time = flops / peak FLOP/s and
    memory_time = bytes / bandwidth (seconds); overhead (seconds); time = max of the two + overhead.
    float(cost) is cost.time."""

    flops: float
    bytes: float
    compute_time: float
    memory_time: float
    overhead: float
    time: float

    @property
    def bound(self) -> Literal["compute", "memory"]:
        """Which roof the step hits."""
        return "compute" if self.compute_time >= self.memory_time else "memory"

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes

    def __float__(self) -> float:
        return self.time


@dataclass(frozen=True)
class SerialStepCost:
    """A mixed step priced by serial_phases: parts, the base cost model's costs of its prefill
    part and of its decode part (the fixed per-step overhead in the last); overlap, the base's
    cost of the whole step as one batch; interference as given. time = overlap.time +
    interference x (the parts' times summed - overlap.time). float(cost) is cost.time."""

    parts: tuple[StepCost, StepCost]
    overlap: StepCost
    interference: float
    time: float

    def __float__(self) -> float:
        return self.time
