"""Shared test settings."""

import os

import torch

# The tests run tiny tensors, for which one intra-op thread is fastest; pytest -n 2 then keeps
# both cores busy without the two workers' thread pools fighting over them.
torch.set_num_threads(1)

# Without CUDA the Triton kernels run under the interpreter, which must be switched on before
# triton is first imported: set here, it holds whichever test module a worker imports first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
