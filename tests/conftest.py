"""Shared test settings."""

import torch

# The tests run tiny tensors, for which one intra-op thread is fastest; pytest -n 2 then keeps
# both cores busy without the two workers' thread pools fighting over them.
torch.set_num_threads(1)
