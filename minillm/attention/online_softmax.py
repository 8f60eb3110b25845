"""Attention without its score matrix: key tiles, the online softmax, and the split-KV merge.

naive_attention is attention as the formula writes it: the (H, T, S) scores, their softmax, then
the weighted sum of V. Its memory and its traffic grow with T * S. tiled_attention computes the
same output while holding one (H, M, n) tile of scores at a time: for every query row it keeps a
running max m, a running sum l of exponentials under that max, and an unnormalised output acc,
and it folds the key tiles in one after another (online_softmax_update). When a tile raises the
max, what was summed so far was computed under the old one, and multiplying it by exp(m_old -
m_new) puts it under the new one: the result is exact, not an approximation. This is the loop
inside FlashAttention and inside our Triton kernels (triton_extend.py, triton_decode.py), here in
PyTorch so that it can be read, measured and replaced by a reader's own update.

Split-KV decode (Flash-Decoding) runs that loop over separate ranges of the context and merges
the partial results through their log-sum-exps: merge_splits.

Shapes: q (H, T, D), k and v (H, S, D); the T queries are the last T positions of the S (T = S
is a prefill, T < S an extend or, T = 1, a decode). Every function computes in fp32 and returns
q's dtype, as the kernels do (float64 inputs stay float64: the reference the others are checked
against).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Update = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """fp32 for fp32 and narrower inputs (the kernels accumulate in fp32), float64 for float64."""
    return torch.promote_types(x.dtype, torch.float32)


def causal_mask(T: int, S: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(T, S) bool, True where query i (at position S - T + i) may see key j: j <= its position."""
    query_pos = torch.arange(S - T, S, device=device)
    return torch.arange(S, device=device)[None, :] <= query_pos[:, None]


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True
                    ) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v with every intermediate materialised: (H, T, D)."""
    T, S = q.shape[1], k.shape[1]
    dt = compute_dtype(q)
    scores = q.to(dt) @ k.to(dt).transpose(1, 2) * q.shape[-1] ** -0.5  # (H, T, S)
    if causal:
        scores = scores.masked_fill(~causal_mask(T, S, q.device), float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # (H, T, S), a second tensor of the same size
    return (probs @ v.to(dt)).to(q.dtype)


def online_softmax_update(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor,
                          scores: torch.Tensor, v: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one key tile into the running state of each query row.

    m, l (..., M): the running max and the running sum of exp(score - m); acc (..., M, D): the
    running sum of exp(score - m) * v. scores (..., M, n): this tile, scaled, -inf where masked;
    v (..., n, D). Returns the new (m, l, acc).
    """
    m_new = torch.maximum(m, scores.amax(dim=-1))
    # A row that has seen nothing yet has m = m_new = -inf: keep it at zero rather than NaN.
    m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    rescale = torch.exp(m - m_safe)  # what was summed under the old max, now under the new one
    p = torch.exp(scores - m_safe[..., None])  # the max is subtracted before exp: no overflow
    return m_new, rescale * l + p.sum(dim=-1), rescale[..., None] * acc + p @ v


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                    block_m: int = 64, block_n: int = 64, update: Update = online_softmax_update,
                    return_lse: bool = False):
    """The same attention as naive_attention, one (H, block_m, block_n) score tile at a time.

    Causal: a query tile stops at the key tile that holds its last row's position (the diagonal
    tile, the only one that needs a mask); the tiles beyond it are never computed. With
    return_lse, also the log-sum-exp of each row's scores (H, T) fp32, what merge_splits needs.
    """
    H, T, D = q.shape
    S = k.shape[1]
    scale, dt = D ** -0.5, compute_dtype(q)
    out = torch.empty_like(q)
    lse = torch.empty(H, T, dtype=dt, device=q.device)
    for (i0, i1), key_tiles in tile_schedule(T, S, causal, block_m, block_n):
        qi = q[:, i0:i1].to(dt) * scale  # (H, M, D)
        m = torch.full((H, i1 - i0), float("-inf"), dtype=dt, device=q.device)
        l = torch.zeros(H, i1 - i0, dtype=dt, device=q.device)
        acc = torch.zeros(H, i1 - i0, D, dtype=dt, device=q.device)
        for j0, j1, diagonal in key_tiles:
            scores = qi @ k[:, j0:j1].to(dt).transpose(1, 2)  # (H, M, n): the only score tile
            if diagonal:  # this tile's mask only: a (T, S) one would make memory quadratic
                query_pos = torch.arange(S - T + i0, S - T + i1, device=q.device)
                visible = torch.arange(j0, j1, device=q.device)[None, :] <= query_pos[:, None]
                scores = scores.masked_fill(~visible, float("-inf"))
            m, l, acc = update(m, l, acc, scores, v[:, j0:j1].to(dt))
        out[:, i0:i1] = (acc / l[..., None]).to(q.dtype)
        lse[:, i0:i1] = m + torch.log(l)
    return (out, lse) if return_lse else out


def tile_schedule(T: int, S: int, causal: bool = True, block_m: int = 64, block_n: int = 64
                  ) -> list[tuple[tuple[int, int], list[tuple[int, int, bool]]]]:
    """The order tiled_attention visits its tiles in: for each query tile (i0, i1), its key tiles
    (j0, j1, diagonal). Causal: a query tile's keys stop at its last row's position; diagonal
    is True for the tiles where some key lies in some row's future (only those need a mask)."""
    schedule = []
    for i0 in range(0, T, block_m):
        i1 = min(i0 + block_m, T)
        last_key = S - T + i1 if causal else S  # one past the last position this tile sees
        keys = [(j0, min(j0 + block_n, last_key), causal and min(j0 + block_n, last_key)
                 > S - T + i0 + 1) for j0 in range(0, last_key, block_n)]
        schedule.append(((i0, i1), keys))
    return schedule


def merge_splits(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine attention over disjoint key ranges: outs (P, ..., D) each normalised over its own
    range, lses (P, ...) their log-sum-exps -> the output over all ranges and its log-sum-exp.

    Each partial output is weighted by its range's share of the total exponential mass,
    exp(lse_p - lse); a range that saw no key (lse = -inf) gets weight zero.
    """
    dt = compute_dtype(outs)
    lse = torch.logsumexp(lses.to(dt), dim=0)
    weights = torch.exp(lses.to(dt) - lse)  # (P, ...): the shares, summing to one
    out = (weights[..., None] * outs.to(dt)).sum(dim=0)
    return out.to(outs.dtype), lse


def split_kv_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_splits: int,
                       block_n: int = 64, merge: Callable = merge_splits) -> torch.Tensor:
    """Non-causal attention (a decode: every key is visible) over num_splits contiguous ranges of
    the context, each with its own online softmax, then merged: what split-KV decode computes
    with one program per range. (H, T, D)."""
    S = k.shape[1]
    bounds = [round(S * i / num_splits) for i in range(num_splits + 1)]
    parts = [tiled_attention(q, k[:, a:b], v[:, a:b], causal=False, block_n=block_n,
                             return_lse=True) for a, b in zip(bounds, bounds[1:]) if b > a]
    out, _ = merge(torch.stack([o for o, _ in parts]), torch.stack([lse for _, lse in parts]))
    return out
