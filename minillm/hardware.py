"""The accelerators the models price: datasheet peaks of common GPUs and their host links.

A Hardware is what the roofline (minillm.roofline) needs of a device: peak FLOP/s, memory
bandwidth, memory, and the link to host memory that a swap crosses. HARDWARE holds NVIDIA's
datasheet figures by name; roofline.measure_machine() builds one from this machine's measured
peaks instead. minillm.roofline re-exports every name here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    """One accelerator. flops: dense BF16 FLOP/s (tensor cores, no 2:1 sparsity); bandwidth:
    memory (HBM) bytes/s; memory: bytes, as the datasheet states them (decimal GB);
    dollars_per_hour: a rental price if you have one (None: unknown); host_link: bytes/s one
    way between the GPU and host memory (HOST_LINKS), which prices preemption by swap."""

    name: str
    flops: float
    bandwidth: float
    memory: float
    dollars_per_hour: float | None = None
    host_link: float = 64e9

    def __post_init__(self) -> None:
        for field in ("flops", "bandwidth", "memory", "host_link"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise ValueError(f"Hardware {self.name!r}: {field} must be a positive number, "
                                 f"got {value!r}")
        if self.dollars_per_hour is not None and not self.dollars_per_hour > 0:
            raise ValueError(f"Hardware {self.name!r}: dollars_per_hour must be positive or None, "
                             f"got {self.dollars_per_hour!r}")


# Peak bytes/s one way of the links that join a GPU to host memory: PCIe x16 by generation
# (PCI-SIG's 8, 16, 32 GT/s per lane, less 128b/130b coding; a copy achieves ~80% of it), and
# Grace Hopper's NVLink-C2C (900 GB/s both ways: 450 each way).
HOST_LINKS: dict[str, float] = {
    "PCIe 3.0 x16": 15.75e9, "PCIe 4.0 x16": 31.5e9, "PCIe 5.0 x16": 63e9, "NVLink-C2C": 450e9,
}

# NVIDIA datasheet figures (SXM boards unless named). The marketing "1,979 TFLOPS" of an H100
# counts 2:1 structured sparsity; serving runs dense, so flops is half of it.
HARDWARE: dict[str, Hardware] = {hw.name: hw for hw in (
    Hardware("A100-40GB", flops=312e12, bandwidth=1.555e12, memory=40e9,
             host_link=HOST_LINKS["PCIe 4.0 x16"]),
    Hardware("A100-80GB", flops=312e12, bandwidth=2.039e12, memory=80e9,
             host_link=HOST_LINKS["PCIe 4.0 x16"]),
    Hardware("H100-SXM", flops=989e12, bandwidth=3.35e12, memory=80e9,
             host_link=HOST_LINKS["PCIe 5.0 x16"]),
    Hardware("H100-PCIe", flops=756e12, bandwidth=2.0e12, memory=80e9,
             host_link=HOST_LINKS["PCIe 5.0 x16"]),
    Hardware("H200", flops=989e12, bandwidth=4.8e12, memory=141e9,
             host_link=HOST_LINKS["PCIe 5.0 x16"]),
    # Grace Hopper: an H100-class GPU with 144 GB of HBM3e, joined to its CPU by NVLink-C2C.
    Hardware("GH200", flops=989e12, bandwidth=4.9e12, memory=144e9,
             host_link=HOST_LINKS["NVLink-C2C"]),
    Hardware("L4", flops=121e12, bandwidth=300e9, memory=24e9,
             host_link=HOST_LINKS["PCIe 4.0 x16"]),
    Hardware("T4", flops=65e12, bandwidth=320e9, memory=16e9,  # FP16: T4 has no BF16
             host_link=HOST_LINKS["PCIe 3.0 x16"]),
    Hardware("RTX-4090", flops=165.2e12, bandwidth=1.008e12, memory=24e9,  # fp32 accumulate
             host_link=HOST_LINKS["PCIe 4.0 x16"]),
)}


def get_hardware(hw: Hardware | str) -> Hardware:
    """A Hardware by name (case-insensitive: "h100-sxm"), or the Hardware given."""
    if isinstance(hw, Hardware):
        return hw
    for name, entry in HARDWARE.items():
        if isinstance(hw, str) and name.lower() == hw.strip().lower():
            return entry
    raise ValueError(f"unknown hardware {hw!r}; known: {', '.join(HARDWARE)} "
                     "(or pass a Hardware, e.g. roofline.measure_machine())")
