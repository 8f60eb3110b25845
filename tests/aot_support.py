"""Ahead-of-time compilation of Triton kernels for a named GPU, in a fresh interpreter.

The kernel tests switch Triton's CPU interpreter on (TRITON_INTERPRET=1) before triton is first
imported, and an interpreted kernel cannot be compiled; so a compile check runs its function's
source in a subprocess with the interpreter off. No GPU is needed: triton.compile targets a
compute capability by name.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def compile_in_subprocess(fn: Callable[..., None], *args: object) -> None:
    """Run fn(*args) from fn's own source (fn must import what it uses), interpreter off;
    fail with the subprocess's stderr if it raises."""
    code = f"{inspect.getsource(fn)}\n{fn.__name__}({', '.join(map(repr, args))})\n"
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # triton 3.9's default, stated to silence its warning
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]


def compile_every_kernel(arch: int, dtype_name: str, block_d: int = 128,
                         kv_dtype: str = "auto") -> None:
    """Compile each kernel for sm_<arch> with the constexprs, warps and stages its launcher
    passes there (here for P = 16, G <= 16, D = 80 or 128: block_d = 128), and check that the
    arch's tiles fit its chip: shared memory within the per-block limit, and no register spills
    (ptxas's local memory, read from the cubin by cuobjdump, which Triton ships) unless timing
    on a GPU of that generation chose the tiles (tiles.MEASURED). Self-contained:
    compile_in_subprocess runs its source in a fresh process, where TRITON_INTERPRET is off, so the
    kernels are JIT functions, not interpreted. kv_dtype "int8" or "fp8": the cache is
    quantized (minillm.quant.kv) and the kernels take its per-head fp32 scales."""
    import os  # noqa: F811 - the source runs alone in a subprocess: it imports its own
    import re
    import subprocess
    import tempfile

    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    from minillm.attention import tiles as tile_table
    from minillm.attention import triton_decode, triton_extend, triton_write_kv
    from minillm.device import dot_precision

    dtype = getattr(torch, {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}[dtype_name])
    precision = dot_precision(dtype)
    capability = divmod(arch, 10)
    tiles = tile_table.tiles_for_capability(capability, block_d, dtype.itemsize)
    shared_limit = tile_table.SHARED_MEMORY_BYTES[capability]
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                             "cuobjdump")
    int_pointers = {"block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "seq_ids_ptr": "*i32",
                    "query_start_loc_ptr": "*i32", "slot_mapping_ptr": "*i64"}
    if kv_dtype != "auto":  # the cache's own element type; its scales are fp32
        cache = {"int8": "*i8", "fp8": "*fp8e4nv"}[kv_dtype]
        int_pointers.update(k_cache_ptr=cache, v_cache_ptr=cache, k_scale_ptr="*fp32",
                            v_scale_ptr="*fp32")

    def build(kernel, constexprs: dict, num_warps: int = 4, num_stages: int = 3,
              fp32_pointers: tuple = ()) -> None:
        signature = {}
        for name in kernel.arg_names:
            if name in constexprs:
                signature[name] = "constexpr"
            elif name.endswith("_ptr"):
                signature[name] = ("*fp32" if name in fp32_pointers
                                   else int_pointers.get(name, f"*{dtype_name}"))
            else:
                signature[name] = "fp32" if name == "qk_scale" else "i32"
        source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                                  options={"num_warps": num_warps, "num_stages": num_stages})
        name = kernel.__name__
        assert f".entry {name}(" in compiled.asm["ptx"], name
        assert compiled.metadata.shared <= shared_limit, (name, compiled.metadata.shared)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
            cubin.write(compiled.asm["cubin"])
            cubin.flush()
            usage = subprocess.run([cuobjdump, "--dump-resource-usage", cubin.name],
                                   capture_output=True, text=True, check=True).stdout
        spilled = re.search(r"STACK:(\d+).*LOCAL:(\d+)", usage)
        assert spilled, usage
        if capability not in tile_table.MEASURED:  # where timing decided, a spill may win
            assert spilled.groups() == ("0", "0"), (name, constexprs, usage)

    build(triton_write_kv.write_kv_kernel, dict(BLOCK_D=block_d, KV_DTYPE=kv_dtype,
                                                EXACT_FP8_CAST=False))
    decode = dict(P=16, BLOCK_G=16, BLOCK_N=tiles.decode.block_n, BLOCK_D=block_d,
                  DOT_PRECISION=precision, UPCAST=False, KV_DTYPE=kv_dtype)
    launch = dict(num_warps=tiles.decode.num_warps, num_stages=tiles.decode.num_stages)
    build(triton_decode.decode_kernel, dict(decode, SPLIT=False), **launch)  # lse_ptr unused
    build(triton_decode.decode_kernel, dict(decode, SPLIT=True), **launch,
          fp32_pointers=("out_ptr", "lse_ptr"))
    build(triton_decode.merge_splits_kernel, dict(BLOCK_S=16, BLOCK_D=block_d),
          fp32_pointers=("part_ptr", "lse_ptr"))
    build(triton_extend.extend_kernel,
          dict(P=16, BLOCK_M=tiles.extend.block_m, BLOCK_N=tiles.extend.block_n, BLOCK_D=block_d,
               DOT_PRECISION=precision, UPCAST=False, KV_DTYPE=kv_dtype),
          num_warps=tiles.extend.num_warps, num_stages=tiles.extend.num_stages)
