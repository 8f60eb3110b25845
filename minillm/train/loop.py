"""The training loop: the config, the model, AdamW with warmup + cosine, batches, evaluation.

Train a ~5M-parameter Llama (GQA, RoPE, RMSNorm, SwiGLU, tied embeddings) on random windows of
the token stream until a wall-clock budget runs out, printing a progress line every so often.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


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
    # distillation (draft models): this fraction of the loss is KL(teacher || model) over the
    # next-token distribution, the rest the data's cross-entropy; 0 trains on the data alone.
    # The teacher reads only the first distil_windows windows of each batch: its forward pass
    # costs several of the student's training steps, so this bounds the slowdown.
    distil_weight: float = 0.0
    distil_windows: int = 4
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


def next_token_logits(model: LlamaForCausalLM, windows: torch.Tensor, bf16: bool) -> torch.Tensor:
    """fp32 logits for every position but the last of each window (whose target is unseen)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return model(input_ids=windows[:, :-1]).logits.float()


def lm_loss(model: LlamaForCausalLM, windows: torch.Tensor, bf16: bool) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) of the windows' last seq_len tokens."""
    logits = next_token_logits(model, windows, bf16)
    return F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())


def training_loss(
    model: LlamaForCausalLM,
    windows: torch.Tensor,
    cfg: TrainConfig,
    teacher: LlamaForCausalLM | None,
) -> torch.Tensor:
    """The data's cross-entropy, mixed with KL(teacher || model) when distilling.

    A draft model is judged by how often the target accepts its tokens, so matching the
    target's whole next-token distribution (not just the one token the text has) is the
    signal that matters; the data term keeps it anchored where the teacher is unsure.
    """
    logits = next_token_logits(model, windows, cfg.bf16)
    data = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
    if teacher is None or cfg.distil_weight == 0.0:
        return data
    taught = windows[: cfg.distil_windows]
    with torch.no_grad():
        target = next_token_logits(teacher, taught, cfg.bf16).flatten(0, 1)
    kl = F.kl_div(
        F.log_softmax(logits[: len(taught)].flatten(0, 1), dim=-1),
        F.log_softmax(target, dim=-1),
        log_target=True,
        reduction="batchmean",  # sum over the vocabulary, mean over positions
    )
    return (1.0 - cfg.distil_weight) * data + cfg.distil_weight * kl


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
    # (steps, minutes, train loss, val loss) at each progress line, for the card's loss curve
    curve: list[tuple[int, float, float, float]] = field(default_factory=list)


def train(
    model: LlamaForCausalLM,
    train_ids: torch.Tensor,
    val_ids: torch.Tensor,
    cfg: TrainConfig,
    teacher: LlamaForCausalLM | None = None,
) -> RunStats:
    """Train until the wall-clock budget is spent, evaluating every eval_every_s seconds.

    With a teacher (and cfg.distil_weight > 0) the loss is mixed with distillation.
    """
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
        loss = training_loss(model, sample_batch(train_ids, cfg, gen), cfg, teacher)
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
    stats.curve.append((stats.steps, elapsed / 60, train_loss, val_loss))
    print(
        f"step {stats.steps:5d} | {elapsed / 60:5.1f} min | "
        f"{stats.tokens_seen / elapsed:6.0f} tok/s | batch {batch_loss:.3f} | "
        f"train {train_loss:.3f} | val {val_loss:.3f}",
        flush=True,
    )
