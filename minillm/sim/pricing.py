"""How a simulation prices its steps: one value for the options simulate, simulate_fleet and
simulate_disaggregated take by name.

The bytes per weight and per K/V number size the pool and the bytes each step, swap and
transfer moves; the overheads are what a step costs beyond its roofline (minillm.calibration
fits them); the cost model is roofline.step_time (on several GPUs, parallel_step_time) unless
one's own is given; interference prices a step that mixes prefill and decode as if its phases
ran apart (roofline.serial_phases). The entry points keep these as flat keywords, as vLLM's
LLM(...) does, and check them into one Pricing at the door, as EngineConfig is for the
scheduler's: from there on a simulated engine is built from (EngineConfig, Pricing, layout).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from minillm.calc import parallel, roofline

# A step's cost model: (model, hw, entries, dtype_bytes, *StepOverheads.as_tuple()) ->
# roofline.StepCost, as roofline.step_time; called with the keyword kv_dtype_bytes too, but only
# when the KV cache's dtype differs from the weights'.
StepTimer = Callable[..., roofline.StepCost]


@dataclass(frozen=True)
class Pricing:
    """dtype_bytes: bytes per weight, and per K/V number unless kv_dtype_bytes (e.g. 1 for an
    fp8 cache). overheads: a roofline.StepOverheads, or a dict of its fields. step_time: the
    cost model, called as roofline.step_time is (None: the roofline's on the layout's GPUs).
    interference: 0 prices a mixed step as max(compute, memory) of the whole step; up to 1,
    its two phases as two steps, added (roofline.serial_phases)."""

    dtype_bytes: int = 2
    kv_dtype_bytes: float | None = None
    overheads: roofline.StepOverheads = roofline.StepOverheads()
    step_time: StepTimer | None = None
    interference: float = 0.0

    def __post_init__(self) -> None:
        # A dict of StepOverheads' fields (or None) becomes one; any other name is refused.
        object.__setattr__(self, "overheads", roofline.StepOverheads.of(self.overheads))

    @property
    def kv_bytes(self) -> float:
        """Bytes per K/V number: kv_dtype_bytes, or the weights' when it is None."""
        return self.dtype_bytes if self.kv_dtype_bytes is None else self.kv_dtype_bytes

    def step_kwargs(self) -> dict[str, Any]:
        """The cost model's keywords beyond the positional ones: kv_dtype_bytes only where it
        differs from dtype_bytes, so that cost models without the keyword still run."""
        if self.kv_dtype_bytes in (None, self.dtype_bytes):
            return {}
        return {"kv_dtype_bytes": self.kv_dtype_bytes}

    def timer(self, layout: parallel.ParallelConfig) -> StepTimer:
        """The cost model a simulated engine on layout's GPUs prices its steps with."""
        step_time = self.step_time
        if step_time is None:  # the roofline's, all-reduces included on several GPUs
            step_time = (parallel.step_timer(layout) if layout.world_size > 1
                         else roofline.step_time)
        if self.interference != 0:
            step_time = roofline.serial_phases(step_time, self.interference)
        return step_time
