"""The accelerators the models price: datasheet peaks of common GPUs and their host links.

A Hardware is what the roofline (minillm.roofline) needs of a device: peak FLOP/s, memory
bandwidth, memory, the link to host memory that a swap crosses, and the links to other GPUs
that tensor and pipeline parallelism cross (minillm.parallel): one inside a node of
gpus_per_node GPUs, one between nodes. HARDWARE holds NVIDIA's datasheet figures by name;
roofline.measure_machine() builds one from this machine's measured peaks instead.
minillm.roofline re-exports every name here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """A GPU-to-GPU link as the collectives see it. bandwidth: bytes/s one way per GPU (what one
    GPU can send while it receives as much); latency: seconds per step of a ring collective
    (one hop: a send, its wait and the launch share of it); in_switch_reduction: whether the
    switch behind the link sums all-reduces itself (NVLink SHARP on NVSwitch 3: NVLS)."""

    name: str
    bandwidth: float
    latency: float
    in_switch_reduction: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.bandwidth, (int, float)) and 0 < self.bandwidth < math.inf):
            raise ValueError(f"Link {self.name!r}: bandwidth must be a positive number of "
                             f"bytes/s, got {self.bandwidth!r}")
        if not (isinstance(self.latency, (int, float)) and 0 <= self.latency < math.inf):
            raise ValueError(f"Link {self.name!r}: latency must be >= 0 seconds, "
                             f"got {self.latency!r}")
        if not isinstance(self.in_switch_reduction, bool):
            raise ValueError(f"Link {self.name!r}: in_switch_reduction must be True or False, "
                             f"got {self.in_switch_reduction!r}")


# Published peaks, one way per GPU. NVLink: NVIDIA's H100 / A100 datasheets give 900 / 600 GB/s
# per GPU, both directions together, so 450 / 300 GB/s each way. PCIe x16 as in HOST_LINKS
# below (a PCIe card without NVLink talks to its peers through the PCIe switch).
# InfiniBand NDR: 400 Gb/s per port = 50 GB/s, with one NIC per GPU as DGX H100 has (eight
# ConnectX-7); Ethernet likewise by line rate. Latency per ring step: ~1 us inside NVLink, which
# puts a small 8-GPU all-reduce (2 * 7 steps) at ~14 us, the order nccl-tests report for small
# messages on DGX-class machines (10-20 us); a few us per PCIe hop; ~5 us across InfiniBand
# (RDMA's ~2 us wire latency plus the proxy); ~10 us on Ethernet (RoCE). These are
# approximations of measured small-message times, not datasheet figures. HGX H100 / H200's
# NVSwitch 3 reduces in the switch (NVLink SHARP); A100's NVSwitch 2 does not.
LINKS: dict[str, Link] = {link.name: link for link in (
    Link("NVLink 4", bandwidth=450e9, latency=1e-6,  # H100 / H200 SXM: 18 links x 25 GB/s
         in_switch_reduction=True),
    Link("NVLink 3", bandwidth=300e9, latency=1e-6),  # A100 SXM: 12 links x 25 GB/s
    Link("PCIe 3.0 x16", bandwidth=15.75e9, latency=3e-6),
    Link("PCIe 4.0 x16", bandwidth=31.5e9, latency=3e-6),
    Link("PCIe 5.0 x16", bandwidth=63e9, latency=3e-6),
    Link("InfiniBand NDR", bandwidth=50e9, latency=5e-6),  # 400 Gb/s, one NIC per GPU
    Link("InfiniBand HDR", bandwidth=25e9, latency=5e-6),  # 200 Gb/s (DGX A100)
    Link("100GbE", bandwidth=12.5e9, latency=10e-6),
    Link("200GbE", bandwidth=25e9, latency=10e-6),
    Link("400GbE", bandwidth=50e9, latency=10e-6),
)}


@dataclass(frozen=True)
class Hardware:
    """One accelerator. flops: dense BF16 FLOP/s (tensor cores, no 2:1 sparsity); bandwidth:
    memory (HBM) bytes/s; memory: bytes, as the datasheet states them (decimal GB);
    dollars_per_hour: a rental price if you have one (None: unknown); host_link: bytes/s one
    way between the GPU and host memory (HOST_LINKS), which prices preemption by swap;
    gpus_per_node: GPUs that share intra_node_link (NVLink on SXM boards, PCIe otherwise);
    inter_node_link: what joins nodes (LINKS). The defaults describe a PCIe server on
    InfiniBand, so a Hardware built with the first fields alone still prices parallelism."""

    name: str
    flops: float
    bandwidth: float
    memory: float
    dollars_per_hour: float | None = None
    host_link: float = 64e9
    intra_node_link: Link = LINKS["PCIe 4.0 x16"]
    gpus_per_node: int = 8
    inter_node_link: Link = LINKS["InfiniBand NDR"]

    def __post_init__(self) -> None:
        for field in ("flops", "bandwidth", "memory", "host_link"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise ValueError(f"Hardware {self.name!r}: {field} must be a positive number, "
                                 f"got {value!r}")
        if self.dollars_per_hour is not None and not self.dollars_per_hour > 0:
            raise ValueError(f"Hardware {self.name!r}: dollars_per_hour must be positive or None, "
                             f"got {self.dollars_per_hour!r}")
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise ValueError(f"Hardware {self.name!r}: gpus_per_node must be a positive int, "
                             f"got {self.gpus_per_node!r}")
        for field in ("intra_node_link", "inter_node_link"):
            if not isinstance(getattr(self, field), Link):
                raise ValueError(f"Hardware {self.name!r}: {field} must be a Link (see LINKS), "
                                 f"got {getattr(self, field)!r}")


# Peak bytes/s one way of the links that join a GPU to host memory: PCIe x16 by generation
# (PCI-SIG's 8, 16, 32 GT/s per lane, less 128b/130b coding; a copy achieves ~80% of it), and
# Grace Hopper's NVLink-C2C (900 GB/s both ways: 450 each way).
HOST_LINKS: dict[str, float] = {
    "PCIe 3.0 x16": 15.75e9, "PCIe 4.0 x16": 31.5e9, "PCIe 5.0 x16": 63e9, "NVLink-C2C": 450e9,
}

# An 8-GPU SXM node (DGX / HGX): NVLink inside, one InfiniBand NIC per GPU between nodes.
_DGX_A100 = dict(intra_node_link=LINKS["NVLink 3"], gpus_per_node=8,
                 inter_node_link=LINKS["InfiniBand HDR"])
_DGX_H100 = dict(intra_node_link=LINKS["NVLink 4"], gpus_per_node=8,
                 inter_node_link=LINKS["InfiniBand NDR"])

# NVIDIA datasheet figures (SXM boards unless named). The marketing "1,979 TFLOPS" of an H100
# counts 2:1 structured sparsity; serving runs dense, so flops is half of it.
HARDWARE: dict[str, Hardware] = {hw.name: hw for hw in (
    Hardware("A100-40GB", flops=312e12, bandwidth=1.555e12, memory=40e9,
             host_link=HOST_LINKS["PCIe 4.0 x16"], **_DGX_A100),
    Hardware("A100-80GB", flops=312e12, bandwidth=2.039e12, memory=80e9,
             host_link=HOST_LINKS["PCIe 4.0 x16"], **_DGX_A100),
    Hardware("H100-SXM", flops=989e12, bandwidth=3.35e12, memory=80e9,
             host_link=HOST_LINKS["PCIe 5.0 x16"], **_DGX_H100),
    # NVLink bridges join H100 PCIe cards in pairs only; a group of 4 or 8 talks over PCIe.
    Hardware("H100-PCIe", flops=756e12, bandwidth=2.0e12, memory=80e9,
             host_link=HOST_LINKS["PCIe 5.0 x16"], intra_node_link=LINKS["PCIe 5.0 x16"]),
    Hardware("H200", flops=989e12, bandwidth=4.8e12, memory=141e9,
             host_link=HOST_LINKS["PCIe 5.0 x16"], **_DGX_H100),
    # Grace Hopper: an H100-class GPU with 144 GB of HBM3e, joined to its CPU by NVLink-C2C.
    # One GPU a node here (a GH200 server); NVL32 racks join them by NVLink instead.
    Hardware("GH200", flops=989e12, bandwidth=4.9e12, memory=144e9,
             host_link=HOST_LINKS["NVLink-C2C"], intra_node_link=LINKS["NVLink 4"],
             gpus_per_node=1),
    Hardware("L4", flops=121e12, bandwidth=300e9, memory=24e9,
             host_link=HOST_LINKS["PCIe 4.0 x16"], inter_node_link=LINKS["100GbE"]),
    Hardware("T4", flops=65e12, bandwidth=320e9, memory=16e9,  # FP16: T4 has no BF16
             host_link=HOST_LINKS["PCIe 3.0 x16"], intra_node_link=LINKS["PCIe 3.0 x16"],
             inter_node_link=LINKS["100GbE"]),
    Hardware("RTX-4090", flops=165.2e12, bandwidth=1.008e12, memory=24e9,  # fp32 accumulate
             host_link=HOST_LINKS["PCIe 4.0 x16"], inter_node_link=LINKS["100GbE"]),
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
