"""The draft model of speculative decoding: a ~0.9M-parameter Llama that guesses the target's
next tokens.

Speculative decoding lets a small model propose k tokens that the target checks in one forward
pass; every proposal the target accepts is a decode step saved. So the draft must (1) speak the
target's token ids - it reuses the target's tokenizer files byte for byte, never a new one - and
(2) agree with the target as often as possible, at a fraction of its cost. It is trained on the
same texts, with the same held-out play; ``--distil-weight`` mixes in distillation from the
target (KL against its next-token distribution), off by default (see DRAFT_CONFIG).

The figure that predicts a greedy speculative run's acceptance rate is ``greedy_agreement``: the
fraction of teacher-forced positions of held-out text where draft and target pick the same
argmax.

Run:  python -m minillm.train --draft --out minillm/assets/tiny-shakespeare-draft
      [--target minillm/assets/tiny-shakespeare] [--minutes 12] [--data-tarball ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaForCausalLM,
)

from minillm.train.card import folder_mb, reload_check, samples_markdown
from minillm.train.data import encode_docs, load_corpus
from minillm.train.draft_card import draft_card
from minillm.train.loop import (
    TrainConfig,
    build_model,
    count_params,
    evaluate,
    fixed_windows,
    next_token_logits,
    train,
)

# 2 layers at width 128: the 4096 x 128 tied embedding (524K) is over half of the ~0.87M
# parameters; per token the draft costs about a sixth of the target's ~5M multiply-adds.
DRAFT_CONFIG = TrainConfig(
    hidden_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    intermediate_size=320,
    warmup_steps=30,  # a clock-bound run on a shared CPU gets only hundreds of steps
    minutes=20.0,
    eval_every_s=120.0,
    # Data alone: in 20 min a distilled run (weight 0.5) saw under half the tokens and agreed
    # less with the target (41.2% vs 47.5%); the option stays for longer budgets.
    distil_weight=0.0,
    distil_windows=4,  # when distilling, the teacher reads 4 of the 16 windows: ~1.5x, not ~3x
)

# The target's tokenizer files, copied unchanged so the ids mean the same in both models.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

AGREEMENT_TOKENS = 2048  # teacher-forced positions of held-out text for greedy_agreement


def load_target(path: Path) -> LlamaForCausalLM:
    """The target in fp32, frozen: the teacher for distillation and the reference for agreement."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval().requires_grad_(False)


@torch.no_grad()
def greedy_agreement(
    draft: torch.nn.Module,
    target: torch.nn.Module,
    ids: torch.Tensor,
    num_tokens: int = AGREEMENT_TOKENS,
    seq_len: int = 256,
) -> float:
    """Fraction of positions where draft and target have the same argmax next token.

    Both read the same text (teacher forcing) in consecutive seq_len-token windows over the first
    num_tokens + 1 ids; with greedy decoding, a proposed token is accepted exactly when the
    argmaxes agree, so this approximates the per-token acceptance rate of a greedy run.
    Models are Hugging Face causal LMs (anything whose output has ``.logits``).
    """
    n_windows = min(num_tokens, len(ids) - 1) // seq_len
    if n_windows == 0:
        raise ValueError(f"need more than {seq_len} ids for one window, got {len(ids)}")
    windows = ids[: n_windows * seq_len + 1]
    windows = torch.stack([windows[i * seq_len : (i + 1) * seq_len + 1] for i in range(n_windows)])
    same = [
        next_token_logits(draft, chunk, bf16=False).argmax(-1)
        == next_token_logits(target, chunk, bf16=False).argmax(-1)
        for chunk in windows.split(4)
    ]
    return torch.cat(same).float().mean().item()


def save_draft(model: LlamaForCausalLM, target_dir: Path, out: Path) -> None:
    """bf16 weights and config as the target is saved, the target's tokenizer files unchanged
    (re-saving a loaded tokenizer would rewrite them, and add a chat template file)."""
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copyfile(target_dir / name, out / name)
    config = model.config
    ids = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id}
    GenerationConfig(**ids, pad_token_id=config.pad_token_id).save_pretrained(out)


def add_draft_args(parser: argparse.ArgumentParser) -> None:
    """The draft recipe's options (``--draft`` switches it on)."""
    parser.add_argument(
        "--draft", action="store_true",
        help="train the small draft model of speculative decoding for --target",
    )
    parser.add_argument(
        "--target", type=Path, default=Path(__file__).parents[1] / "assets" / "tiny-shakespeare",
        help="the target model folder: its tokenizer is reused and it is the distillation teacher",
    )
    parser.add_argument(
        "--distil-weight", type=float, default=DRAFT_CONFIG.distil_weight,
        help="fraction of the draft's loss that is KL against the target (0: data only)",
    )


def draft_config(args: argparse.Namespace) -> TrainConfig:
    """DRAFT_CONFIG with the command line's overrides."""
    if not 0.0 <= args.distil_weight <= 1.0:
        raise ValueError(f"--distil-weight must be in [0, 1], got {args.distil_weight}")
    return dataclasses.replace(
        DRAFT_CONFIG, minutes=args.minutes, seed=args.seed, bf16=args.bf16,
        distil_weight=args.distil_weight,
    )


def shown_path(path: Path) -> str:
    """A path as the card shows it: relative to the repository when inside it."""
    repo = Path(__file__).resolve().parents[2]
    try:
        return str(path.resolve().relative_to(repo))
    except ValueError:
        return str(path)


def reproduce_command(args: argparse.Namespace, cfg: TrainConfig) -> str:
    """The command line that makes this draft (the data tarball, a local copy, is left out)."""
    flags = [
        f"--out {shown_path(args.out)}", f"--target {shown_path(args.target)}",
        f"--minutes {cfg.minutes:g}", f"--seed {cfg.seed}",
        f"--distil-weight {cfg.distil_weight:g}",
    ]
    if not cfg.bf16:
        flags.append("--fp32")
    return "OMP_WAIT_POLICY=PASSIVE python -m minillm.train --draft " + " ".join(flags)


def main_draft(args: argparse.Namespace) -> None:
    """Data -> target's tokenizer -> train (distilling) -> save -> reload -> measure -> card."""
    cfg = draft_config(args)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    if not (args.target / "tokenizer.json").is_file():
        raise FileNotFoundError(f"--target {args.target} has no tokenizer.json; give the target "
                                "model's folder (minillm/assets/tiny-shakespeare)")
    tok = AutoTokenizer.from_pretrained(args.target)
    target = load_target(args.target)
    corpus = load_corpus(args.data_tarball, cfg)
    train_ids, val_ids = encode_docs(tok, corpus.train), encode_docs(tok, corpus.val)
    n_tokens = {"train": len(train_ids), "val": len(val_ids)}
    model = build_model(cfg, tok)
    print(f"{n_tokens} tokens, vocab {len(tok)}, {count_params(model):,} params; {cfg}", flush=True)
    teacher = target if cfg.distil_weight > 0 else None
    stats = train(model, train_ids, val_ids, cfg, teacher=teacher)
    save_draft(model, args.target, args.out)
    model, tok = reload_check(args.out, corpus.val[0][:5000])
    # losses and agreement of what ships: bf16 weights, evaluated in fp32
    val_windows = fixed_windows(val_ids, cfg.seq_len, len(val_ids))
    stats.train_loss = evaluate(model, fixed_windows(train_ids, cfg.seq_len, cfg.eval_windows))
    stats.val_loss = evaluate(model, val_windows)
    stats.params, stats.eos_id = count_params(model), tok.eos_token_id
    measured = {
        "target_val_loss": evaluate(target, val_windows),
        "target_params": count_params(target),
        "agreement": greedy_agreement(model, target, val_ids),
        "agreement_tokens": (min(AGREEMENT_TOKENS, len(val_ids) - 1) // 256) * 256,
    }
    print(f"measured: {measured}", flush=True)
    samples = samples_markdown(model, tok, cfg)
    command = reproduce_command(args, cfg)
    card = draft_card(cfg, corpus, n_tokens, stats, measured, samples, command)
    (args.out / "README.md").write_text(card)
    print(card, flush=True)
    print(f"saved {args.out} ({folder_mb(args.out):.1f} MB)", flush=True)
