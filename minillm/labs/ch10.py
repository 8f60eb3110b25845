"""Graded exercises of chapter 10 (faster decode): the acceptance rule and an int8 quantizer.

10.1: the reader's acceptance rule for one request, accept(p, q, proposals, generator) -> the
tokens it emits. Graded three ways: greedy cases (one-hot p) with known answers; many draws of
k = 2 proposals on a small vocabulary, where every emitted position must follow its row of p
(chi-square, minillm.spec.lossless) and proposals must be accepted as often as the rule allows
(sum of min(p, q) at each position); and inside the engine, in place of
minillm.spec.rejection.verify, on the tiny random model: greedy tokens equal to a plain run's,
and sampled sequences whose every position passes the chapter's chi-square test.

10.2: the reader's per-output-channel symmetric int8 quantizer, quantize(weight) -> (q, scale).
Graded on test_matrices(): dtypes and shapes, the error bound (half a step of the row's own
scale), each row using its whole range (the sign of a scale per row, not per tensor), agreement
with minillm.quant.int8, and the quantized tiny model's greedy tokens in the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

import torch

from minillm.labs.exercise import Exercise, expect_callable
from minillm.sampling import SamplingParams, sampling_probs

ACCEPT_SIGNATURE = "accept(p, q, proposals, generator) -> list of emitted token ids"
NUM_DRAWS = 12000  # per distribution case: a 5% error in the first token's law is seen
ENGINE_SAMPLES = 1500  # sequences of 4 tokens sampled in the engine with the reader's rule


def _rows(values: list[list[float]]) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.float32)
    return t / t.sum(dim=-1, keepdim=True)


# Sampled cases on a 5-token vocabulary, k = 2: (p (k+1, V), q (k, V)). The first has a draft
# that overrates token 0, then token 4; the second one-hot q (prompt lookup) on tokens the
# target rates at 0.3 and 0.2, so the bonus row p[2] is reached in ~6% of the draws.
CASES = [
    (_rows([[0.1, 0.3, 0.35, 0.15, 0.1], [0.2, 0.2, 0.2, 0.2, 0.2],
            [0.4, 0.1, 0.1, 0.1, 0.3]]),
     _rows([[0.6, 0.1, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.1, 0.6]])),
    (_rows([[0.3, 0.4, 0.1, 0.1, 0.1], [0.5, 0.1, 0.1, 0.2, 0.1],
            [0.1, 0.2, 0.3, 0.2, 0.2]]),
     _rows([[1.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0]])),
]


def one_hot(token: int, vocab: int = 5) -> list[float]:
    return [1.0 if v == token else 0.0 for v in range(vocab)]


# Greedy cases: p one-hot at the target's argmax per row, one-hot q at the proposals.
# (argmaxes of p_0..p_k, proposals) -> the emitted tokens.
GREEDY = [
    (([2, 3, 4], [2, 3]), [2, 3, 4]),  # every proposal is the argmax: both, then the bonus
    (([2, 3, 4], [2, 1]), [2, 3]),     # second rejected: replaced by the argmax
    (([2, 3, 4], [0, 3]), [2]),        # first rejected: the rest are dropped, even a match
]


def _emitted(accept: Callable, p: torch.Tensor, q: torch.Tensor, proposals: list[int],
             generator: torch.Generator | None) -> list[int]:
    out = accept(p.clone(), q.clone(), list(proposals), generator)
    assert isinstance(out, (list, tuple)), (
        f"accept returned {type(out).__name__} {out!r:.60}; return a list of token ids")
    out = [int(t) for t in out]
    k = len(proposals)
    assert 1 <= len(out) <= k + 1, (
        f"accept emitted {len(out)} tokens for {k} proposals; it emits the accepted proposals "
        "and then exactly one more (the replacement at the first rejection, or the bonus)")
    assert out[:-1] == list(proposals[:len(out) - 1]), (
        f"accept emitted {out} for proposals {proposals}: all but the last emitted token must be "
        "the accepted proposals, in order")
    return out


def _check_greedy(accept: Callable) -> None:
    for (argmaxes, proposals), want in GREEDY:
        p = torch.tensor([one_hot(a) for a in argmaxes])
        q = torch.tensor([one_hot(d) for d in proposals])
        got = _emitted(accept, p, q, proposals, torch.Generator().manual_seed(0))
        assert got == want, (
            f"greedy (p one-hot at {argmaxes}), proposals {proposals}: you emitted {got}, the "
            f"rule emits {want}. With one-hot p, min(1, p(d)/q(d)) is 1 if d is the argmax and "
            "0 otherwise, and the residual max(0, p - q) is p itself")


def _check_distribution(accept: Callable) -> None:
    """Every emitted position t (0 .. k: the first token, the second, the bonus) of the draws
    that reach it must follow p[t]: the rows of p do not depend on the tokens before them, so a
    lossless rule emits each position as a plain sample from its row would."""
    from minillm.spec.lossless import chi_square

    for case, (p, q) in enumerate(CASES):
        k, vocab = q.shape
        gen = torch.Generator().manual_seed(1000 + case)
        counts = torch.zeros(k + 1, vocab)  # counts[t]: the token at position t, where emitted
        reached, accepted = [0] * k, [0] * k
        for _ in range(NUM_DRAWS):
            proposals = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(k)]
            out = _emitted(accept, p, q, proposals, gen)
            for t, token in enumerate(out):
                counts[t, token] += 1
            for i in range(min(len(out), k)):  # proposal i was reached: all before it passed
                reached[i] += 1
                accepted[i] += i < len(out) - 1
        rate, allowed = accepted[0] / NUM_DRAWS, float(torch.minimum(p[0], q[0]).sum())
        for t in range(k + 1):
            n = float(counts[t].sum())
            if n == 0:  # never reached (a rule that rejects everything): the rate check below
                continue
            law = [round(float(c) / n, 3) for c in counts[t]]
            target = [round(float(x), 3) for x in p[t]]
            if not chi_square(counts[t], p[t]).rejects:
                continue
            where = {0: "the first emitted token", k: f"position {t} (the bonus, or a draw "
                     "at the last proposal's rejection)"}.get(t, f"position {t}")
            if t == 0 and rate > allowed + 0.05:
                why = ("you accept more often than min(1, p(d) / q(d)) allows: the proposer's "
                       "distribution leaks into the output")
            elif t == 0 and rate > allowed - 0.05:
                why = ("you accept at the right rate, so look at the replacement: draw it from "
                       "the residual max(0, p - q), renormalised, not from p (p already gave "
                       "its share min(p, q) through the accepted proposals)")
            elif t == 0:
                why = "accept d with probability min(1, p(d) / q(d)), with a fresh uniform draw"
            else:
                why = (f"row {t} of p governs position {t}: check the rule at every proposal, "
                       "not just the first, and draw the bonus from p[k] when all k passed")
            raise AssertionError(
                f"case {case + 1}: {where} follows {law}, the target p[{t}] is {target} "
                f"(chi-square rejects it over {n:.0f} draws that reached it): {why}")
        for i in (i for i in range(k) if reached[i]):
            rate_i, allowed_i = accepted[i] / reached[i], float(torch.minimum(p[i], q[i]).sum())
            assert abs(rate_i - allowed_i) < 0.03, (
                f"case {case + 1}: you accepted {rate_i:.1%} of the proposals at position "
                f"{i + 1}; the rule accepts sum(min(p, q)) = {allowed_i:.1%}. The output law is "
                "right, but accepting less throws speed away: accept d with probability "
                "min(1, p(d) / q(d))")


def _as_verify(accept: Callable) -> Callable:
    """The reader's per-request rule in the shape of minillm.spec.rejection.verify (the batch:
    every request's rows one after another), so the engine can call it."""

    def verify(logits, proposals, draft_probs, params, generators):
        row_params = [p for p, d in zip(params, proposals) for _ in range(len(d) + 1)]
        probs = sampling_probs(logits, row_params)  # (R, V)
        out, row = [], 0
        for d, q, g, sp in zip(proposals, draft_probs, generators, params):
            p = probs[row:row + len(d) + 1]  # (k + 1, V)
            row += len(d) + 1
            if not d:  # nothing proposed: an ordinary sample
                out.append([int(torch.multinomial(p[0], 1, generator=g))
                            if sp.temperature > 0 else int(p[0].argmax())])
                continue
            if q is None:  # one-hot proposals (prompt lookup, greedy drafts)
                q = torch.zeros(len(d), p.shape[1])
                q[range(len(d)), d] = 1.0
            out.append(_emitted(accept, p, q.float(), d, g))
        return out

    return verify


def _greedy_tokens(engine: Any, prompts: list[list[int]]) -> list[list[int]]:
    """The 12 greedy tokens the engine generates for each prompt, in the prompts' order."""
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    ids = [engine.add_request(prompt, params) for prompt in prompts]
    done = {}
    while engine.has_unfinished_requests():
        done |= {o.request_id: o.token_ids for o in engine.step() if o.finished}
    return [done[i] for i in ids]


def _check_in_engine(accept: Callable) -> None:
    from minillm.spec import lossless

    prompts = [[1, 2, 3, 1, 2, 3, 1, a] for a in range(8)]
    plain = _greedy_tokens(lossless.tiny_engine(None), prompts)
    with mock.patch("minillm.spec.decoder.verify", _as_verify(accept)):
        for method in ("ngram", "draft_model"):
            assert _greedy_tokens(lossless.tiny_engine(method), prompts) == plain, (
                f"in the engine ({method}), greedy tokens differ from a plain run's: under greedy "
                "decoding the rule must emit exactly the target's argmax tokens")
        sequences = lossless.sample_sequences(lossless.tiny_engine("draft_model", k=2),
                                              ENGINE_SAMPLES, 4)
    exact = lossless.exact_position_pairs(lossless.exact_sequences(4))
    for t, (counts, probs) in enumerate(zip(lossless.position_pairs(sequences), exact), start=1):
        assert not lossless.chi_square(counts, probs).rejects, (
            f"in the engine (k = 2), the tiny model's sampled tokens at positions {t - 1} and "
            f"{t} do not follow the target's distribution (chi-square rejects): check the rule "
            "on every proposal, stopping at the first rejection, and the bonus token")


def grade_accept(accept: Any) -> str:
    expect_callable(accept, ACCEPT_SIGNATURE)
    _check_distribution(accept)
    _check_greedy(accept)
    _check_in_engine(accept)
    return ("greedy cases right, every emitted position (the bonus too) follows its row of p "
            f"over {len(CASES) * NUM_DRAWS:,} draws of k = 2 proposals at the rule's acceptance "
            "rate, and inside the engine the tiny model's tokens are unchanged. Speculation "
            "changes the speed, never the distribution")


# ---- 10.2: a per-channel int8 quantizer ----------------------------------------------------

def test_matrices() -> list[torch.Tensor]:
    """Weights a quantizer meets: ordinary rows, one outlier row 50x larger, an all-zero row,
    and half-precision inputs."""
    gen = torch.Generator().manual_seed(10)
    w = torch.randn(48, 64, generator=gen) * 0.05
    w[7] *= 50  # an outlier channel: a scale per tensor would coarsen every other row
    w[11] = 0  # a dead channel
    return [w, w.half(), w.bfloat16(), torch.randn(5, 3, generator=gen)]


def _check_one(quantize: Callable, w: torch.Tensor) -> None:
    from minillm.quant.int8 import quantize_per_channel

    out = quantize(w.clone())
    assert isinstance(out, tuple) and len(out) == 2, "return a pair (q, scale)"
    q, scale = out
    shape = tuple(w.shape)
    assert isinstance(q, torch.Tensor) and q.dtype == torch.int8 and tuple(q.shape) == shape, (
        f"q must be an int8 tensor of the weight's shape {shape}, got "
        f"{getattr(q, 'dtype', type(q))} {tuple(getattr(q, 'shape', ()))}")
    scale = torch.as_tensor(scale).float().reshape(-1)
    assert scale.numel() == shape[0], (
        f"one scale per output channel (row): {shape[0]} scales, got {scale.numel()}")
    assert torch.isfinite(scale).all() and (scale > 0).all(), (
        "every scale must be positive and finite (an all-zero row too: its scale is free, 1 "
        "will do, but 0 makes dequantization divide by zero somewhere downstream)")
    assert int(q.abs().max()) <= 127, "symmetric int8 uses [-127, 127]; -128 has no +128 twin"
    x = w.float()
    err = (x - q.float() * scale[:, None]).abs().amax(dim=1)
    worst = int((err - scale / 2).argmax())
    assert bool((err <= scale / 2 * 1.001 + 1e-12).all()), (
        f"row {worst}: an error of {float(err[worst]):.3g} is more than half a step "
        f"({float(scale[worst]) / 2:.3g}): round to the nearest integer, do not truncate")
    live = x.abs().amax(dim=1) > 0
    reach = q.abs().amax(dim=1)[live]
    assert bool((reach == 127).all()), (
        f"some rows reach only {int(reach.min())} of 127 steps: give each row its own scale "
        "max|row| / 127, so one outlier channel does not coarsen the others")
    ref_q, ref_scale = quantize_per_channel(w)
    assert torch.allclose(scale, ref_scale, rtol=1e-5), "scales differ from max|row| / 127"
    assert float((q != ref_q).float().mean()) < 1e-3, (
        "q differs from minillm.quant.int8 on more than rounding ties")


def _check_quantized_engine(quantize: Callable) -> None:
    from minillm.quant.int8 import quantize_model
    from minillm.spec.lossless import tiny_engine

    def tokens(patch: Callable | None) -> list[list[int]]:
        engine = tiny_engine(None)
        if patch is None:
            quantize_model(engine.model)
        else:
            with mock.patch("minillm.quant.int8.quantize_per_channel", patch):
                quantize_model(engine.model)
        return _greedy_tokens(engine, [[1, 2, 3, a] for a in range(8)])

    def reshaped(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, scale = quantize(weight)
        return q, torch.as_tensor(scale).float().reshape(-1)

    assert tokens(reshaped) == tokens(None), (
        "the tiny model quantized with your function gives other greedy tokens than with "
        "minillm.quant.int8's")


def grade_quantize(quantize: Any) -> str:
    expect_callable(quantize, "quantize(weight (N, K)) -> (q (N, K) int8, scale (N,))")
    for w in test_matrices():
        _check_one(quantize, w)
    _check_quantized_engine(quantize)
    return ("every element within half a step of its row, each row using all 127 steps (the "
            "outlier row kept to itself), the same q and scales as minillm.quant.int8, and the "
            "quantized model's greedy tokens unchanged")


EXERCISES = [
    Exercise("10.1", "The acceptance rule",
             "Write accept(p, q, proposals, generator): p (k+1, V) the target's distributions, "
             "q (k, V) the proposer's, proposals the k drafted tokens; return the accepted "
             "proposals and one more token (residual draw at the first rejection, or the "
             "bonus from p[k]), using generator for every random draw.",
             grade_accept),
    Exercise("10.2", "A per-channel int8 quantizer",
             "Write quantize(weight (N, K)) -> (q (N, K) int8, scale (N,) float): one symmetric "
             "scale per output channel, q = round(w / scale) in [-127, 127].",
             grade_quantize),
]
