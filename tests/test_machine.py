"""minillm.machine: the line every chapter prints about where its numbers were measured."""

from __future__ import annotations

import os

import torch

from minillm.calc import machine


def test_describe_names_device_cores_and_threads() -> None:
    line = machine.describe()
    assert line.startswith("measured on this machine: ")
    assert f"({machine.device()})" in line and f"{os.cpu_count()} CPU cores" in line
    assert f"{torch.get_num_threads()} torch threads" in line and torch.__version__ in line


def test_settle_threads_uses_one_thread_on_two_cores(monkeypatch) -> None:
    before = torch.get_num_threads()
    monkeypatch.setattr(machine.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(machine, "device", lambda: "cpu")
    try:
        torch.set_num_threads(2)
        assert machine.settle_threads() == 1
        monkeypatch.setattr(machine.os, "cpu_count", lambda: 8)
        torch.set_num_threads(2)
        assert machine.settle_threads() == 2  # more cores: left as it was
    finally:
        torch.set_num_threads(before)


def test_cpu_name_is_not_empty() -> None:
    assert machine.cpu_name().strip()
