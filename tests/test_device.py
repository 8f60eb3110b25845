"""minillm.device: the rules for what a device can do, on faked devices (no GPU needed)."""

from __future__ import annotations

import types

import pytest
import torch

from minillm import device
from minillm.device import capabilities, fake

T4 = fake((7, 5), 16, "Tesla T4")
A100 = fake((8, 0), 80, "A100")
L4 = fake((8, 9), 24, "L4")
H200 = fake((9, 0), 141, "H200")


@pytest.mark.parametrize("caps, dtype", [(T4, torch.float16), (A100, torch.bfloat16),
                                         (L4, torch.bfloat16), (H200, torch.bfloat16)])
def test_default_dtype_is_fp16_below_sm80_and_bf16_from_it(caps, dtype) -> None:
    assert caps.dtype == dtype and caps.dtype_bytes == 2 and caps.gpu


def test_a_cpu_computes_in_fp32_and_takes_every_kv_dtype(monkeypatch) -> None:
    monkeypatch.delenv(device.GPU_SHAPED_ENV, raising=False)
    cpu = capabilities("cpu")
    assert (cpu.dtype, cpu.dtype_bytes, cpu.gpu, cpu.sm) == (torch.float32, 4, False, "cpu")
    assert set(cpu.kv_cache_dtypes) == {"auto", "int8", "fp8"}
    assert cpu.kv_cache_dtype("fp8") == ("fp8", None)
    assert (cpu.attention_backend, cpu.cuda_graphs) == ("torch", False)


@pytest.mark.parametrize("caps, fp8", [(T4, False), (A100, False), (L4, True), (H200, True)])
def test_fp8_kv_only_from_sm89(caps, fp8) -> None:
    assert ("fp8" in caps.kv_cache_dtypes) is fp8
    assert {"auto", "int8"} <= set(caps.kv_cache_dtypes)


def test_fp8_falls_back_to_int8_with_a_note_naming_the_sm() -> None:
    dtype, note = T4.kv_cache_dtype("fp8")
    assert dtype == "int8" and "sm_75" in note and "8.9" in note and "Tesla T4" in note
    assert H200.kv_cache_dtype("fp8") == ("fp8", None)
    assert T4.kv_cache_dtype("int8") == ("int8", None)


@pytest.mark.parametrize("caps", [T4, H200])
def test_a_bad_kv_dtype_is_refused_naming_it(caps) -> None:
    with pytest.raises(ValueError, match="'fp4'"):
        caps.kv_cache_dtype("fp4")


def fake_cuda(monkeypatch, capability, memory_gb, name):
    props = types.SimpleNamespace(name=name, total_memory=int(memory_gb * 1e9))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev=None: props)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: capability)


@pytest.mark.parametrize("capability, memory_gb, name, dtype, fp8", [
    ((7, 5), 16, "Tesla T4", torch.float16, False),
    ((9, 0), 141, "NVIDIA H200", torch.bfloat16, True)])
def test_a_real_cuda_device_gets_triton_and_cuda_graphs(monkeypatch, capability, memory_gb, name,
                                                        dtype, fp8) -> None:
    monkeypatch.delenv(device.GPU_SHAPED_ENV, raising=False)
    fake_cuda(monkeypatch, capability, memory_gb, name)
    caps = capabilities("cuda")
    assert (caps.name, caps.capability, caps.memory_bytes) == (name, capability,
                                                               int(memory_gb * 1e9))
    assert (caps.attention_backend, caps.cuda_graphs, caps.shaped) == ("triton", True, False)
    assert caps.dtype == dtype and ("fp8" in caps.kv_cache_dtypes) is fp8
    assert name in caps.describe() and f"sm_{capability[0]}{capability[1]}" in caps.describe()


def test_fits_on_16_and_141_gb() -> None:
    weights = 30e9  # a 15B-parameter model in 16 bits
    assert not T4.fits(weights) and H200.fits(weights)
    assert T4.fits(14e9) and not T4.fits(15e9)  # 90% of 16 GB is 14.4 GB
    assert T4.fits(15e9, utilization=1.0)


def test_gpu_shape_refuses_a_bad_value(monkeypatch) -> None:
    monkeypatch.setenv(device.GPU_SHAPED_ENV, "fp8")
    with pytest.raises(ValueError, match="'fp8'"):
        device.gpu_shape()
    with pytest.raises(ValueError, match="'fp8'"):
        capabilities("cpu")
    monkeypatch.setenv(device.GPU_SHAPED_ENV, "")
    assert device.gpu_shape() is None


@pytest.mark.parametrize("shape, name, sm, dtype, fp8", [
    ("fp16", "T4-shaped", "sm_75", torch.float16, False),
    ("bf16", "H200-shaped", "sm_90", torch.bfloat16, True)])
def test_the_gpu_shaped_cpu_takes_the_gpus_rules(monkeypatch, shape, name, sm, dtype, fp8) -> None:
    monkeypatch.setenv(device.GPU_SHAPED_ENV, shape)
    caps = capabilities("cpu")
    assert (caps.name, caps.sm, caps.dtype, caps.shaped, caps.torch_device) == (
        name, sm, dtype, True, "cpu")
    assert ("fp8" in caps.kv_cache_dtypes) is fp8
    assert (caps.attention_backend, caps.cuda_graphs) == ("torch", False)  # CPU tensors still
    assert "GPU-shaped" in caps.describe()


def test_the_gpu_shaped_run_can_build_the_interpreted_triton_kernels(monkeypatch) -> None:
    monkeypatch.setenv(device.GPU_SHAPED_ENV, "fp16")
    monkeypatch.setenv(device.GPU_SHAPED_ATTENTION_ENV, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    caps = capabilities("cpu")
    assert (caps.attention_backend, caps.cuda_graphs, caps.interpreted_triton) == (
        "triton", False, True)
    assert "attention triton (interpreted)" in caps.describe()
    monkeypatch.delenv("TRITON_INTERPRET")  # the kernels would be built for CUDA: refused
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        capabilities("cpu")
    monkeypatch.setenv(device.GPU_SHAPED_ATTENTION_ENV, "flash")
    with pytest.raises(ValueError, match="'flash'"):
        capabilities("cpu")
    monkeypatch.delenv(device.GPU_SHAPED_ENV)  # without a shape the variable changes nothing
    assert capabilities("cpu").attention_backend == "torch"


def test_llm_t4_shaped_with_triton_attends_through_the_kernels_as_torch_does(monkeypatch) -> None:
    """What a T4 runs: fp16 weights, Triton attention; the interpreter stands in for the GPU.
    Greedy fp16 text from the kernels and from torch's attention agree on a short prompt."""
    from minillm import SamplingParams
    from minillm.attention.triton_backend import TritonAttention
    from minillm.llm import LLM

    assert device.os.environ.get("TRITON_INTERPRET") == "1"  # conftest, before triton loads
    monkeypatch.setenv(device.GPU_SHAPED_ENV, "fp16")
    monkeypatch.setenv(device.GPU_SHAPED_ATTENTION_ENV, "triton")
    params = SamplingParams(max_tokens=6, temperature=0.0)
    kernels = LLM(device="cpu", max_num_seqs=2)
    assert isinstance(kernels.engine.runner.backend, TritonAttention)
    reference = LLM(device="cpu", max_num_seqs=2, attention_backend="torch")
    prompt = "ROMEO:\nBut soft, what light"
    assert kernels.generate([prompt], params)[0].token_ids == (
        reference.generate([prompt], params)[0].token_ids)


def test_llm_t4_shaped_builds_in_fp16_and_refuses_fp8_before_loading(monkeypatch) -> None:
    from minillm import llm as llm_module
    from minillm.llm import LLM

    monkeypatch.setenv(device.GPU_SHAPED_ENV, "fp16")
    assert LLM(device="cpu").model.lm_head.weight.dtype == torch.float16

    def no_load(*args, **kwargs):
        raise AssertionError("weights loaded before the K/V dtype was checked")

    with monkeypatch.context() as m:
        m.setattr(llm_module.LlamaForCausalLM, "from_pretrained", no_load)
        with pytest.raises(ValueError, match="'int8'"):
            LLM(device="cpu", kv_cache_dtype="fp8")
    torch_llm = LLM(device="cpu", kv_cache_dtype="fp8", attention_backend="torch")
    assert torch_llm.config.kv_cache_dtype == "fp8"


def test_llm_h200_shaped_builds_in_bf16_and_takes_fp8(monkeypatch) -> None:
    from minillm.llm import LLM

    monkeypatch.setenv(device.GPU_SHAPED_ENV, "bf16")
    llm = LLM(device="cpu", kv_cache_dtype="fp8")
    assert llm.model.lm_head.weight.dtype == torch.bfloat16
    assert llm.config.kv_cache_dtype == "fp8"
