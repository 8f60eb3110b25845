"""The training script's pipeline, on a tiny corpus: tokenizer, model, a few steps, save, load."""

import dataclasses

import torch

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
