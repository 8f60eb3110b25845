"""The shipped draft model of speculative decoding (minillm/assets/tiny-shakespeare-draft).

It must load in both minillm and transformers, speak exactly the target's token ids (the same
tokenizer files), stay small, and agree with the target's greedy choices on held-out text well
beyond what an untrained model of the same shape manages: that agreement is what a speculative
run's acceptance rate follows.
"""

from __future__ import annotations

import pytest
import torch

from minillm import LLM, SamplingParams, default_draft_path, default_model_path
from minillm.model import LlamaForCausalLM
from minillm.quality import HELD_OUT
from minillm.train.draft import TOKENIZER_FILES, greedy_agreement, load_target
from minillm.train.loop import count_params

pytestmark = pytest.mark.ch10

DRAFT, TARGET = default_draft_path(), default_model_path()
# Teacher-forced positions of The Tempest: the card's 2,048 (its first 512, the Gutenberg header
# and the list of persons, agree less).
WINDOW_TOKENS = 2048
# The shipped draft measured 0.475 here (as on its card); an untrained model of its shape 0.036
# (it keeps picking a few tokens, right only where the target happens to pick those too).
MIN_AGREEMENT = 0.33


@pytest.fixture(scope="module")
def tempest_ids() -> torch.Tensor:
    """<|endoftext|> then the held-out play's first tokens, as training streams documents."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TARGET)
    text = HELD_OUT.read_text()[:20_000]  # ~6,000 tokens, enough for the window
    return torch.tensor([tok.eos_token_id, *tok(text)["input_ids"]][: WINDOW_TOKENS + 1])


@pytest.fixture(scope="module")
def hf_draft():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(DRAFT, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def hf_target():
    return load_target(TARGET)


def test_the_draft_folder_ships_with_the_package():
    assert DRAFT.is_dir(), f"{DRAFT} is missing: train it with python -m minillm.train --draft"
    mb = sum(f.stat().st_size for f in DRAFT.iterdir()) / 1e6
    assert mb < 3.0, f"the draft folder is {mb:.1f} MB; keep the package small (bf16 weights)"


def test_tokenizer_files_are_the_targets_byte_for_byte():
    for name in TOKENIZER_FILES:
        assert (DRAFT / name).read_bytes() == (TARGET / name).read_bytes(), name


def test_loads_in_minillm_and_transformers_with_the_targets_vocab(hf_draft, hf_target):
    ours = LlamaForCausalLM.from_pretrained(DRAFT)
    assert ours.config.vocab_size == hf_target.config.vocab_size == 4096
    assert ours.config.tie_word_embeddings
    params = count_params(hf_draft)
    assert count_params(ours) == params
    assert 500_000 <= params <= 1_000_000, f"{params:,} parameters; the brief is 0.5M-1M"
    assert params < count_params(hf_target) / 5


def test_minillm_runs_the_draft_as_transformers_does(hf_draft):
    prompt = "ROMEO.\n"
    llm = LLM(DRAFT, num_kv_blocks=32)
    out = llm.generate(prompt, SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)[0]
    ids = torch.tensor([llm.tokenizer.encode(prompt)])
    hf = hf_draft.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                           do_sample=False)
    assert list(out.token_ids) == hf[0, ids.shape[1]:].tolist()


def test_the_card_says_what_it_is_for_and_how_it_was_made():
    card = (DRAFT / "README.md").read_text()
    assert "speculative decoding" in card
    assert "python -m minillm.train --draft" in card
    assert "agree" in card and "4.164" in card  # agreement measured; the target's val loss


def test_draft_agrees_with_the_targets_greedy_choices(hf_draft, hf_target, tempest_ids):
    agreement = greedy_agreement(hf_draft, hf_target, tempest_ids, WINDOW_TOKENS)
    assert agreement >= MIN_AGREEMENT, f"draft agrees with the target on {agreement:.3f}"


def test_an_untrained_model_of_the_same_shape_fails_the_agreement_check(hf_draft, hf_target,
                                                                         tempest_ids):
    from transformers import LlamaForCausalLM as HFLlama

    torch.manual_seed(0)
    untrained = HFLlama(hf_draft.config).eval()  # transformers' own initialisation
    agreement = greedy_agreement(untrained, hf_target, tempest_ids, WINDOW_TOKENS)
    assert agreement < MIN_AGREEMENT / 2, f"an untrained model agrees on {agreement:.3f}"
