"""Incremental detokenization: the deltas always join to the full decode, even mid-character."""

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from minillm.tokenizer import IncrementalDetokenizer, load_tokenizer

TEXT = ("Ay, there's the rub; für Ärger 𝄞 music — “quoted” naïve café 日本語 ✓\n" * 20)


@pytest.fixture(scope="module")
def tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def test_deltas_join_to_the_full_decode(tokenizer):
    ids = tokenizer.encode(TEXT)
    prompt_len = 7
    detok = IncrementalDetokenizer(tokenizer, ids[:prompt_len])
    text = "".join(detok.step(ids[:n]) for n in range(prompt_len + 1, len(ids) + 1))
    assert text == tokenizer.decode(ids[prompt_len:])


def test_random_byte_tokens_never_emit_broken_characters(tokenizer):
    rng = random.Random(0)
    ids = [rng.randrange(1, tokenizer.vocab_size) for _ in range(200)]
    detok = IncrementalDetokenizer(tokenizer, ids[:1])
    pieces = [detok.step(ids[:n]) for n in range(2, len(ids) + 1)]
    full = tokenizer.decode(ids[1:])
    joined = "".join(pieces)
    assert full.startswith(joined)  # only an undecodable tail may be held back
    assert all(not p.endswith("\ufffd") for p in pieces)


def test_special_tokens_are_skipped(tokenizer):
    prompt = tokenizer.encode("Ay, ")
    ids = prompt + tokenizer.encode("naïve café") + [tokenizer.eos_token_id]
    detok = IncrementalDetokenizer(tokenizer, prompt)
    text = "".join(detok.step(ids[:n]) for n in range(len(prompt) + 1, len(ids) + 1))
    assert text == "naïve café"


def test_no_tokenizer_files_means_none(tmp_path):
    assert load_tokenizer(tmp_path) is None
    assert IncrementalDetokenizer(None, [1, 2]).step([1, 2, 3]) == ""
