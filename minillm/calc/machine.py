"""This machine, as a chapter reports it: what the measured numbers were measured on.

Every chapter starts with ``print(machine.describe())`` so a reader (or a course's grader)
knows which hardware produced the figures below it, and calls ``machine.settle_threads()``
before it times anything.
"""

from __future__ import annotations

import os
import platform

import torch


def device() -> str:
    """ "cuda" where a CUDA GPU is visible (the chapters then measure on it), else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo on Linux; platform's best guess elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def hardware_name() -> str:
    """The GPU's name on CUDA, the CPU's otherwise."""
    return torch.cuda.get_device_name() if device() == "cuda" else cpu_name()


def settle_threads() -> int:
    """Use one torch thread on a CPU with two cores or fewer, and return the thread count.

    On 2 cores shared with other work, 2 torch threads stall whenever another process holds a
    core (a 16-sequence decode step went from ~12 ms to ~900 ms); one thread does not.
    """
    if device() == "cpu" and (os.cpu_count() or 1) <= 2:
        torch.set_num_threads(1)
    return torch.get_num_threads()


def describe() -> str:
    """One line naming the hardware and software that measured numbers come from."""
    return (f"measured on this machine: {hardware_name()} ({device()}); {os.cpu_count()} CPU "
            f"cores, {torch.get_num_threads()} torch threads; torch {torch.__version__}, "
            f"Python {platform.python_version()}")
