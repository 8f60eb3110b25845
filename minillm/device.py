"""What the device can do: the one place that decides the engine's dtype, which K/V dtypes and
kernels it may use, and what fits in its memory.

Chapters and the engine ask `capabilities()` instead of repeating the rules, so a T4, an H200
and a laptop each get the engine that suits them, and the rules are tested on faked devices
(`fake`) without a GPU:

- dtype: float32 on a CPU; on a GPU bfloat16 from compute capability 8.0 (Ampere) and float16
  below it (a T4 is sm_75: no bf16 tensor cores, so Triton has no bf16 dot there).
  float32 on every CPU, even one with AVX-512 bf16: on such a Xeon minillm's bfloat16 made
  1,650 tokens/s offline against its float32's 2,000 (0.83x); on an AVX2 CPU, which emulates
  bf16, it is 6.6x slower (chapter 07 §11).
- K/V dtypes: "auto" (the model's) and "int8" everywhere; "fp8" (e4m3) where Triton has fp8
  conversions, sm_89 (Ada, Hopper) and up, and on a CPU (torch's reference attention).
- kernels: the Triton attention backend and CUDA graphs on CUDA, the torch reference elsewhere.

The GPU-shaped run (`python -m minillm.bench chapters --gpu-shaped bf16|fp16`) sets
MINILLM_GPU_SHAPED so that a CPU run takes a GPU's rules: bf16 as an H200 (sm_90, 141 GB) or
fp16 as a T4 (sm_75, 16 GB), fp8 K/V refused on the latter. It keeps the CPU's tensors and, by
default, the torch attention backend. With MINILLM_GPU_SHAPED_ATTENTION=triton (`--attention
triton`) attention="auto" builds the Triton kernels too, run by Triton's interpreter
(TRITON_INTERPRET=1), as a GPU would build them; the interpreter is 20x slower than the
reference or more on the shipped model (chapter 00: 232 s against 10 s on 2 cores; 05 and 06
do not finish in 10 minutes), so that run is for chapters a reader names, not the whole book.
"""

from __future__ import annotations

import dataclasses
import os

import torch

GPU_SHAPED_ENV = "MINILLM_GPU_SHAPED"
GPU_SHAPED_ATTENTION_ENV = "MINILLM_GPU_SHAPED_ATTENTION"  # "torch" (default) or "triton"
FP8_KV_CAPABILITY = (8, 9)  # Triton's fp8 e4m3 conversions: Ada (sm_89), Hopper (sm_90)
BF16_CAPABILITY = (8, 0)  # bf16 tensor cores: Ampere and up


def dtype_for(capability: tuple[int, int] | None) -> torch.dtype:
    """The engine's default dtype for a compute capability (None: a CPU)."""
    if capability is None:
        return torch.float32
    return torch.bfloat16 if tuple(capability) >= BF16_CAPABILITY else torch.float16


def has_fp8_kv(capability: tuple[int, int] | None) -> bool:
    """Whether fp8 K/V runs here: on a CPU (torch's attention) and from sm_89 on a GPU."""
    return capability is None or tuple(capability) >= FP8_KV_CAPABILITY


@dataclasses.dataclass(frozen=True)
class DeviceCaps:
    """A device's name, torch device type, CUDA compute capability (None: a CPU's rules) and
    memory in bytes. shaped: a CPU run that takes a GPU's rules (the GPU-shaped run);
    interpreted_triton: that run builds the Triton kernels, under Triton's interpreter."""

    name: str
    torch_device: str
    capability: tuple[int, int] | None
    memory_bytes: int
    shaped: bool = False
    interpreted_triton: bool = False

    @property
    def gpu(self) -> bool:
        """Whether a GPU's rules apply (a real GPU, or the GPU-shaped run)."""
        return self.capability is not None

    @property
    def sm(self) -> str:
        return "cpu" if self.capability is None else f"sm_{self.capability[0]}{self.capability[1]}"

    @property
    def dtype(self) -> torch.dtype:
        """The engine's default dtype here (module docstring)."""
        return dtype_for(self.capability)

    @property
    def dtype_bytes(self) -> int:
        return self.dtype.itemsize

    @property
    def kv_cache_dtypes(self) -> tuple[str, ...]:
        """The kv_cache_dtype values the engine accepts on this device."""
        return ("auto", "int8", "fp8") if has_fp8_kv(self.capability) else ("auto", "int8")

    def kv_cache_dtype(self, wanted: str) -> tuple[str, str | None]:
        """The K/V dtype to use for the one wanted, and a note to print when it falls back:
        fp8 becomes int8 (the same byte per number) where the device has no fp8 kernels."""
        if wanted in self.kv_cache_dtypes:
            return wanted, None
        if wanted == "fp8":
            return "int8", (f"fp8 K/V needs compute capability 8.9 or more; this {self.name} is "
                            f"{self.sm}, so int8 K/V (also one byte a number) stands in for it")
        raise ValueError(f"kv_cache_dtype must be one of {self.kv_cache_dtypes} on {self.name}, "
                         f"got {wanted!r}")

    @property
    def attention_backend(self) -> str:
        """What attention_backend="auto" builds: the Triton kernels on CUDA (and in a GPU-shaped
        run that asks for them, interpreted), torch elsewhere."""
        return "triton" if self.torch_device == "cuda" or self.interpreted_triton else "torch"

    @property
    def cuda_graphs(self) -> bool:
        """Whether decode steps replay as CUDA graphs (with the Triton backend, on CUDA)."""
        return self.torch_device == "cuda"

    def fits(self, nbytes: float, utilization: float = 0.9) -> bool:
        """Whether nbytes fit in this share of the device's memory."""
        return nbytes <= utilization * self.memory_bytes

    def describe(self) -> str:
        how = " (GPU-shaped: a CPU run with this GPU's rules)" if self.shaped else ""
        interpreted = " (interpreted)" if self.interpreted_triton else ""
        return (f"{self.name}, {self.sm}, {self.memory_bytes / 1e9:.0f} GB, engine dtype "
                f"{str(self.dtype).removeprefix('torch.')}, K/V dtypes "
                f"{'/'.join(self.kv_cache_dtypes)}, attention {self.attention_backend}"
                f"{interpreted}{how}")


# The two GPUs the book is written for, by the dtype that picks them in the GPU-shaped run.
SHAPES = {"bf16": ("H200-shaped", (9, 0), 141 * 10**9),
          "fp16": ("T4-shaped", (7, 5), 16 * 10**9)}


def fake(capability: tuple[int, int], memory_gb: float, name: str = "GPU") -> DeviceCaps:
    """A CUDA device with this capability and memory, for tests of the rules."""
    return DeviceCaps(name, "cuda", tuple(capability), int(memory_gb * 1e9))  # type: ignore[arg-type]


def gpu_shape() -> str | None:
    """"bf16" or "fp16" during a GPU-shaped run, else None; any other value is refused."""
    shape = os.environ.get(GPU_SHAPED_ENV) or None
    if shape is not None and shape not in SHAPES:
        raise ValueError(f"{GPU_SHAPED_ENV} must be one of {sorted(SHAPES)}, got {shape!r}")
    return shape


def gpu_shaped_attention() -> str:
    """The attention backend "auto" builds in a GPU-shaped run: "torch" (the default) or "triton"
    (under Triton's interpreter, which must then be on); any other value is refused."""
    backend = os.environ.get(GPU_SHAPED_ATTENTION_ENV) or "torch"
    if backend not in ("torch", "triton"):
        raise ValueError(f"{GPU_SHAPED_ATTENTION_ENV} must be 'torch' or 'triton', got {backend!r}")
    if backend == "triton" and not interpreting():
        raise ValueError(f"{GPU_SHAPED_ATTENTION_ENV}=triton runs the kernels on the CPU, so it "
                         "needs TRITON_INTERPRET=1 set before triton is imported")
    return backend


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter, which needs fp32 arithmetic (every
    kernel upcasts after each load there)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's precision for fp32 operands. An fp32 model needs exact products ("ieee"); fp16
    and bf16 values upcast to fp32 (interpreter only) are exact in tf32. On a GPU, fp16 and bf16
    operands go to the tensor cores as they are and this setting does not apply to them."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 10**9


def capabilities(device: str | torch.device | None = None) -> DeviceCaps:
    """What this device can do: the CUDA GPU given (or visible), or this CPU, which takes a
    T4's or an H200's rules during a GPU-shaped run."""
    dev = torch.device(device if device is not None else
                       "cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        capability = tuple(torch.cuda.get_device_capability(dev))
        return DeviceCaps(props.name, "cuda", capability, props.total_memory)  # type: ignore[arg-type]
    shape = gpu_shape()
    if shape is not None:
        name, capability, memory = SHAPES[shape]
        return DeviceCaps(name, dev.type, capability, memory, shaped=True,
                          interpreted_triton=gpu_shaped_attention() == "triton")
    return DeviceCaps(f"this {dev.type}", dev.type, None, _ram_bytes())
