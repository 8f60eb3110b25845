"""Graded exercises of chapter 12 (attention as an IO problem): the online softmax and the merge.

12.1: the reader's online_softmax_update runs inside minillm.attention.online_softmax's
tiled_attention, on cases built so that each common slip shows: one key tile (the max never
changes), several (a max that rises in the last), fp32 scores near 100 (exp overflows unless the
max is subtracted first). Output and log-sum-exp are compared with float64 attention; when a case
fails, probes of the update alone name the slip. A tile that masks every key of a row that has
seen none must leave no NaN.

12.2: the reader's merge_splits runs inside split_kv_attention, on splits of very unequal size
beside one that saw no key (out 0, lse -inf, as the decode kernel writes it), and in a tree of
merges (which needs the merged lse), compared with unsplit float64 attention.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minillm.attention import online_softmax as ref
from minillm.labs.exercise import Exercise, expect_callable

UPDATE = "online_softmax_update(m, l, acc, scores, v) -> (m, l, acc)"
MERGE = "merge_splits(outs, lses) -> (out, lse)"
# Absolute and relative. The reference reaches 4e-15 in float64; in fp32, 4e-6 on outputs and
# 2e-5 on log-sum-exps near 100 (scores rounded to fp32): 1e-4 leaves a margin of 20x.
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}
OVERFLOW = ("exp(100) is already inf in fp32, whose largest value is about exp(88.7): subtract "
            "the running max before the exponent, exp(scores - m_new), so no term exceeds 1")
HINTS = {
    "max": " (m is the running max of the scores themselves, torch.maximum(m, scores.amax(-1)),"
           " taken before any exponent: then exp(scores - m_new) <= 1 and cannot overflow)",
    "subtract": f" (your l sums exp(scores), not exp(scores - m_new). {OVERFLOW}; and "
                "tiled_attention returns lse = m + log(l), so l must be the sum under m)",
    "normalised": " (return acc unnormalised, the running sum of exp(score - m) * v: "
                  "tiled_attention divides by l once, after the last key tile)",
    "overflow": f" ({OVERFLOW})",
    "masked": "a key tile that masks every key of a row that has seen none yet (a split that "
              "ends before the row's position) leaves your state NaN: there m = m_new = -inf, "
              "and exp(-inf - (-inf)) is NaN; subtract 0 instead of m_new while it is -inf, so "
              "that the row keeps l = 0 and acc = 0 until a key it may see arrives",
    "scaled": " (the scores arrive already scaled by 1/sqrt(D) and -inf where masked: use them "
              "as they are, your m is theirs times a constant)",
    "first": " (after the first tile, which arrives with m = -inf, l = 0, acc = 0, your state "
             "holds NaN or inf: subtract the new max, exp(scores - m_new) and exp(m - m_new), "
             "never the old m = -inf)",
    "formula": " (with m_new = max(m, the tile's max): p = exp(scores - m_new); l becomes "
               "exp(m - m_new) * l plus p's row sums, acc becomes exp(m - m_new) * acc plus p @ v)",
}


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype = torch.float64) -> bool:
    tol = TOLERANCE[dtype]
    return got.shape == want.shape and torch.allclose(got.double(), want.double(), rtol=tol,
                                                      atol=tol, equal_nan=True)


def _difference(got: torch.Tensor, want: torch.Tensor, against: str = "float64 attention") -> str:
    if not torch.isfinite(got).all():
        return "holds NaN or inf"
    return f"differs from {against} by up to {(got.double() - want).abs().max():.2g}"


def _fold(update: Callable, tiles: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple:
    """Call update on copies, from a fresh state, for each (scores (H, R, J), v (H, J, D)) tile;
    each result checked for type, shapes and dtype. The final (m, l, acc)."""
    (H, M, _), dt, D = tiles[0][0].shape, tiles[0][0].dtype, tiles[0][1].shape[-1]
    state = (torch.full((H, M), float("-inf"), dtype=dt), torch.zeros(H, M, dtype=dt),
             torch.zeros(H, M, D, dtype=dt))
    for scores, v in tiles:
        got = update(*(x.clone() for x in state), scores.clone(), v.clone())
        assert got is not None, "your update returned None: return the new state, (m, l, acc)"
        assert isinstance(got, (tuple, list)) and len(got) == 3 and all(
            isinstance(x, torch.Tensor) for x in got), (
            f"return the tuple (m, l, acc) of three tensors, not {type(got).__name__}")
        shapes = [tuple(x.shape) for x in got]
        assert shapes == [(H, M), (H, M), (H, M, D)], (
            f"m and l keep the shape {(H, M)} (one per query row) and acc {(H, M, D)}; you "
            f"returned {shapes} (reduce a tile over its keys, dim -1)")
        assert all(x.dtype == dt for x in got), (
            f"return the state in the dtype it came in ({dt}), not {[x.dtype for x in got]}")
        state = tuple(got)
    return state


def _probe_tiles() -> dict[str, list]:
    g = torch.Generator().manual_seed(12)
    s1, v1, v2 = (torch.randn(shape, generator=g, dtype=torch.float64)
                  for shape in ((2, 3, 4), (2, 4, 5), (2, 4, 5)))
    # Every score of the second tile lies above the first tile's max: the max rises for all rows.
    s2 = s1.amax(-1, keepdim=True) + 1 + torch.rand(2, 3, 4, generator=g, dtype=torch.float64)
    masked = s1.clone()
    masked[:, 0] = float("-inf")  # row 0 sees no key of the first tile
    return {"one": [(s1, v1)], "rising": [(s1, v1), (s2, v2)],
            "large": [((s1 + 100).float(), v1.float()), ((s2 + 100).float(), v2.float())],
            "masked": [(masked, v1), (s2, v2)]}


def _update_hint(update: Callable) -> str:
    """Which slip the update makes, from probes of it alone; the generic formula if none shows."""
    tiles = _probe_tiles()
    for probe in ("one", "rising"):
        m, l, acc = _fold(update, tiles[probe])
        M, L, A = _fold(ref.online_softmax_update, tiles[probe])
        if not _close(m, M):
            c = ((m * M).sum() / (M * M).sum()).item()  # m = c M: scaled once more
            return HINTS["scaled"] if _close(m, c * M) and abs(c - 1) > 1e-6 else HINTS["max"]
        if probe == "one" and not (torch.isfinite(l).all() and torch.isfinite(acc).all()):
            return HINTS["first"]
        if probe == "one" and _close(l, torch.exp(tiles["one"][0][0]).sum(-1)):
            return HINTS["subtract"]
        if probe == "one" and _close(acc, A / L[..., None]):
            return HINTS["normalised"]
        stale = [name for name, got, want in (("l", l, L), ("acc", acc, A))
                 if not _close(got, want)]
        if stale and probe == "rising":  # right on one tile, wrong on two
            return (" (right on one key tile, wrong on two: when a tile raises the max, what "
                    f"{' and '.join(stale)} summed so far was under the old max; multiply it by "
                    "exp(m - m_new) before adding the tile's terms)")
        if stale:
            return HINTS["formula"]
    _, l, acc = _fold(update, tiles["large"])
    return HINTS["formula"] if torch.isfinite(acc / l[..., None]).all() else HINTS["overflow"]


def _inputs(H: int, T: int, S: int, D: int, dtype: torch.dtype, kind: str = "random",
            seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (H, T, D), k and v (H, S, D). kind "late": the last key matches the last query, so its
    score tops every earlier one; "large": a shared direction puts every score near 100."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(H, n, D, generator=g, dtype=torch.float64) for n in (T, S, S))
    if kind == "late":
        k[:, -1] = 3 * q[:, -1]  # (H, D): a score of 3 |q|^2 / sqrt(D), ~8.5 against ~N(0, 1)
    if kind == "large":
        shared = (100 * D ** 0.5) ** 0.5  # q . k / sqrt(D) ~ shared^2 / sqrt(D) = 100
        q[..., 0] += shared
        k[..., 0] += shared
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 attention output (H, T, D) and log-sum-exp (H, T) of the same inputs."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(1, 2) * q.shape[-1] ** -0.5  # (H, T, S)
    if causal:
        scores = scores.masked_fill(~ref.causal_mask(q.shape[1], k.shape[1]), float("-inf"))
    return ref.naive_attention(q, k, v, causal), torch.logsumexp(scores, dim=-1)


F64, F32 = torch.float64, torch.float32
# (what the case is, T, S, block_m, block_n, dtype, kind of inputs); 2 heads of D = 8, causal.
UPDATE_CASES = [
    ("a decode (T = 1) over 20 positions, one key tile", 1, 20, 16, 32, F64, "random"),
    ("a causal prefill of 50 tokens in 16 x 16 tiles", 50, 50, 16, 16, F64, "random"),
    ("an extend of 20 tokens after 77 cached, 16 x 32 tiles", 20, 97, 16, 32, F64, "random"),
    ("a decode over 200 positions, its top score in the last key tile", 1, 200, 16, 32, F64,
     "late"),
    ("an fp32 prefill of 40 tokens in 16 x 16 tiles", 40, 40, 16, 16, F32, "random"),
    ("an fp32 prefill of 40 tokens with scores near 100", 40, 40, 16, 16, F32, "large"),
]


def grade_online_softmax_update(update: Any) -> str:
    expect_callable(update, UPDATE)
    _fold(update, _probe_tiles()["one"])  # type and shapes first, with a readable message
    worst = 0.0
    for what, T, S, bm, bn, dtype, kind in UPDATE_CASES:
        q, k, v = _inputs(2, T, S, 8, dtype, kind)
        out, lse = ref.tiled_attention(q, k, v, True, bm, bn, update=update, return_lse=True)
        want_out, want_lse = _reference(q, k, v, causal=True)
        for name, got, want in (("the output", out, want_out), ("the log-sum-exp", lse, want_lse)):
            assert _close(got, want, dtype), (f"inside tiled_attention, on {what}, {name} "
                                              f"{_difference(got, want)}{_update_hint(update)}")
        if dtype == F64:
            worst = max(worst, (out - want_out).abs().max().item())
    _, l, acc = _fold(update, _probe_tiles()["masked"])
    _, L, A = _fold(ref.online_softmax_update, _probe_tiles()["masked"])
    assert _close(acc / l[..., None], A / L[..., None]), HINTS["masked"]
    return (f"inside tiled_attention your update matches float64 attention on all "
            f"{len(UPDATE_CASES)} cases (to {worst:.0e} in float64), including a max that rises "
            "in the last key tile and fp32 scores near 100, where exp(score) alone overflows: "
            "rescaling by exp(m - m_new) makes the tiled softmax exact")


# ---- 12.2: the split-KV merge -----------------------------------------------------------------

def _merge_hint(outs: torch.Tensor, lses: torch.Tensor, out: torch.Tensor, lse: torch.Tensor
                ) -> str:
    """Which slip a wrong merge of these partial results makes."""
    want_out, _ = ref.merge_splits(outs.double(), lses.double())
    if not (torch.isfinite(out).all() and torch.isfinite(lse).all()):
        if lses.max() > 80:
            return (f" (exp of an lse of {lses.max():.0f} overflows: subtract the largest lse "
                    "before the exponent, exp(lse_p - max), or use torch.logsumexp)")
        return (" (a split that saw no key has lse = -inf and output 0: its weight "
                "exp(-inf - lse) is 0; keep it out of the max you subtract)")
    if not _close(out, want_out, outs.dtype):
        if _close(out, outs.mean(dim=0), outs.dtype):
            return (" (a plain average counts a split whose keys hold little of the softmax's "
                    "mass as much as one that holds most: weight each split by its share, "
                    "exp(lse_p - lse), where lse is the logsumexp of the splits' lses)")
        return (" (weight each split's output by exp(lse_p - lse), lse = logsumexp over the "
                "splits; the weights sum to one)")
    if _close(lse, lses.sum(dim=0), outs.dtype):
        return (" (the lse of the union is the log of the summed exponential mass, "
                "logsumexp over the splits, not the sum of their lses)")
    return " (the merged lse is torch.logsumexp(lses, dim=0): the log of the total mass)"


def _merged(merge: Callable, outs: torch.Tensor, lses: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The reader's merge of outs (Z, H, T, D) and lses (Z, H, T), asserted right on them."""
    got = merge(outs.clone(), lses.clone())
    assert isinstance(got, (tuple, list)) and len(got) == 2 and all(
        isinstance(x, torch.Tensor) for x in got), (
        f"return the tuple (out, lse), not {type(got).__name__}: the merged log-sum-exp too, so "
        "that a merged result can be merged again (a tree of merges, as a kernel with many "
        "splits runs)")
    out, lse = got
    assert out.shape == outs.shape[1:] and lse.shape == lses.shape[1:], (
        f"outs {tuple(outs.shape)} and lses {tuple(lses.shape)} merge to out "
        f"{tuple(outs.shape[1:])} and lse {tuple(lses.shape[1:])}; you returned "
        f"{tuple(out.shape)} and {tuple(lse.shape)} (merge over dim 0, the splits)")
    want_out, want_lse = ref.merge_splits(outs.double(), lses.double())
    for name, got, want in (("output", out, want_out), ("log-sum-exp", lse, want_lse)):
        assert _close(got, want, outs.dtype), (
            f"the merged {name} {_difference(got, want, 'a float64 merge of the same splits')}"
            f"{_merge_hint(outs, lses, out, lse)}")
    return out, lse


def _split(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[int]
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """outs (Z, H, T, D) and lses (Z, H, T) of attention over each key range [a, b) of bounds;
    an empty range as the decode kernel writes it (out 0, lse -inf)."""
    parts = [ref.tiled_attention(q, k[:, a:b], v[:, a:b], causal=False, block_n=32,
                                 return_lse=True) if b > a else
             (torch.zeros_like(q), torch.full(q.shape[:2], float("-inf"), dtype=q.dtype))
             for a, b in zip(bounds, bounds[1:])]
    return torch.stack([o for o, _ in parts]), torch.stack([s for _, s in parts])


def grade_merge_splits(merge: Any) -> str:
    expect_callable(merge, MERGE)
    cases = [("a decode over 301 positions in 4 splits", _inputs(2, 1, 301, 8, F64), 4),
             ("4 queries over 130 positions in 3 splits", _inputs(3, 4, 130, 8, F64), 3),
             ("fp32 scores near 100 in 5 splits", _inputs(2, 1, 200, 8, F32, "large"), 5),
             ("splits of 3, 250 and 7 positions beside one that saw no key",
              _inputs(2, 2, 260, 8, F64, seed=1), [0, 3, 253, 253, 260]),
             # Splits (0, 1) and (2, 3) merged first, then the two results: a tree of merges.
             ("a tree of merges, ((0, 1), (2, 3))", _inputs(2, 3, 240, 8, F64, seed=2),
              [[0, 10, 100], [100, 130, 240]])]
    for what, (q, k, v), splits in cases:
        want_out, want_lse = _reference(q, k, v, causal=False)
        try:
            if isinstance(splits, int):  # the merged lse is checked inside _merged
                out, lse = ref.split_kv_attention(q, k, v, splits, 32,
                                                  lambda o, s: _merged(merge, o, s)), want_lse
            elif isinstance(splits[0], int):
                out, lse = _merged(merge, *_split(q, k, v, splits))
            else:
                halves = [_merged(merge, *_split(q, k, v, b)) for b in splits]
                out, lse = _merged(merge, *(torch.stack(x) for x in zip(*halves)))
        except AssertionError as err:
            raise AssertionError(f"on {what}: {err}") from None
        for name, got, want in (("output", out, want_out), ("log-sum-exp", lse, want_lse)):
            assert _close(got, want, q.dtype), (
                f"on {what}, the merged {name} {_difference(got, want)}")
    return ("your merge gives unsplit float64 attention from 3 to 5 splits, splits of 3 and 250 "
            "keys beside an empty one, fp32 scores near 100, and a tree of merges: each split "
            "weighs exp(lse_p - lse), its share of the softmax's mass")


EXERCISES = [
    Exercise("12.1", "The online-softmax update",
             f"Write {UPDATE}: fold one tile of scores (..., R, J) (R query rows, J keys), already "
             "scaled and -inf where masked, and its values v (..., J, D) into the running max m "
             "(..., R), the running sum l of exp(score - m) and the unnormalised output acc "
             "(..., R, D).",
             grade_online_softmax_update),
    Exercise("12.2", "The split-KV merge",
             f"Write {MERGE}: outs (Z, ..., D) are attention outputs over Z disjoint key ranges "
             "(splits), each normalised over its own range, lses (Z, ...) their log-sum-exps; "
             "return the output over all the keys and its log-sum-exp.", grade_merge_splits),
]
