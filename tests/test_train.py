"""The training script's pipeline, on a tiny corpus: tokenizer, model, a few steps, save, load."""

import dataclasses

import pytest
import torch
from transformers import AutoTokenizer

from minillm import LLM, SamplingParams
from minillm.train import (
    TrainConfig,
    build_model,
    encode_docs,
    evaluate,
    fixed_windows,
    save,
    train,
    train_tokenizer,
)

DOCS = ["Ham.\nTo be, or not to be, that is the question.\n" * 40,
        "Rom.\nBut soft, what light through yonder window breaks?\n" * 40]


def test_pipeline_learns_and_saves_a_loadable_checkpoint(tmp_path):
    cfg = dataclasses.replace(
        TrainConfig(), vocab_size=300, hidden_size=32, num_layers=1, num_heads=4,
        num_kv_heads=2, head_dim=8, intermediate_size=64, seq_len=32, batch_size=4,
        warmup_steps=5, minutes=0.15, eval_every_s=1e9, eval_windows=4, threads=1)
    tok = train_tokenizer(DOCS, cfg.vocab_size)
    ids = encode_docs(tok, DOCS)
    assert tok.decode(tok.encode(DOCS[0][:60])) == DOCS[0][:60]  # byte-level: lossless
    model = build_model(cfg, tok)
    windows = fixed_windows(ids, cfg.seq_len, cfg.eval_windows)
    before = evaluate(model, windows)
    stats = train(model, ids, ids, cfg)
    assert stats.steps > 5 and evaluate(model, windows) < before - 1.0

    save(model, tok, tmp_path)
    llm = LLM(tmp_path, num_kv_blocks=32)
    out = llm.generate("Ham.\n", SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)[0]
    assert out.token_ids and llm.config.max_model_len == cfg.max_position_embeddings

    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert hf.config.num_key_value_heads == 2 and hf.config.num_attention_heads == 4


# ----------------------------------------------------------------------------------------------
# the draft recipe (python -m minillm.train --draft): distillation and the target's tokenizer

TINY = dict(vocab_size=300, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
            head_dim=8, intermediate_size=64, seq_len=32, batch_size=4, warmup_steps=5,
            eval_every_s=1e9, eval_windows=4, threads=1, bf16=False)


def test_distillation_loss_mixes_the_data_loss_with_kl_to_the_teacher():
    from minillm.train.loop import lm_loss, training_loss

    tok = train_tokenizer(DOCS, 300)
    ids = encode_docs(tok, DOCS)
    windows = fixed_windows(ids, 32, 4)
    cfg = dataclasses.replace(TrainConfig(), **TINY)
    torch.manual_seed(0)
    model, teacher = build_model(cfg, tok), build_model(cfg, tok)
    with torch.no_grad():
        teacher.model.embed_tokens.weight.mul_(50.0)  # sharp next-token distributions
    data = lm_loss(model, windows, bf16=False)
    assert training_loss(model, windows, cfg, teacher) == data  # distil_weight 0: data only
    only_kl = dataclasses.replace(cfg, distil_weight=1.0)
    assert abs(training_loss(model, windows, only_kl, model).item()) < 1e-5  # KL to itself
    half = dataclasses.replace(cfg, distil_weight=0.5)
    kl = training_loss(model, windows, only_kl, teacher)
    assert kl > 0.1
    assert torch.allclose(training_loss(model, windows, half, teacher), (data + kl) / 2)

    stats = train(model, ids, ids, dataclasses.replace(only_kl, minutes=0.05), teacher=teacher)
    assert stats.steps > 3 and training_loss(model, windows, only_kl, teacher) < kl - 0.05
    assert len(stats.curve) == 2  # the first step and the end, for the card's loss curve


def test_a_draft_is_saved_with_the_targets_tokenizer_files_unchanged(tmp_path):
    import argparse

    from minillm import default_model_path
    from minillm.train.draft import TOKENIZER_FILES, draft_config, save_draft

    target = default_model_path()
    tok = AutoTokenizer.from_pretrained(target)
    cfg = dataclasses.replace(TrainConfig(), **dict(TINY, vocab_size=4096))
    save_draft(build_model(cfg, tok), target, tmp_path)
    for name in TOKENIZER_FILES:
        assert (tmp_path / name).read_bytes() == (target / name).read_bytes()
    assert not (tmp_path / "chat_template.jinja").exists()  # nothing the target does not ship
    llm = LLM(tmp_path, num_kv_blocks=8)
    assert llm.model.config.vocab_size == len(tok)

    args = argparse.Namespace(minutes=1.0, seed=1, bf16=True, distil_weight=1.5)
    with pytest.raises(ValueError, match="distil-weight"):
        draft_config(args)
