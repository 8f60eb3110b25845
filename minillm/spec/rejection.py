"""Checking proposed tokens against the target: the rejection-sampling rule that keeps the
output distribution exactly the target's (Leviathan et al. 2023; Chen et al. 2023).

A request proposed d_1..d_k, drawn from the proposer's distributions q_1..q_k (one-hot for
prompt lookup and greedy drafts). The target's forward over [x, d_1..d_k] gave the distributions
p_0..p_k that the sampler would draw the tokens after x, d_1, ..., d_k from. Going left to
right, d_i is accepted with probability min(1, p_{i-1}(d_i) / q_i(d_i)); at the first rejection
the token is drawn instead from the residual max(0, p_{i-1} - q_i), renormalised, and the rest
are dropped; if all k are accepted, a bonus token is drawn from p_k. Each emitted token is then
distributed exactly as p says (accept: q(d) min(1, p/q) = min(q, p); reject: the residual makes
up p - min(q, p)), so speculation changes the speed, never the text's distribution. Under greedy
decoding every p is one-hot at the target's argmax, and the rule reduces to "accept while the
proposal equals the target's argmax, then emit the argmax".
"""

from __future__ import annotations

import torch

from minillm.sampling import SamplingParams, draw, sampling_probs


def verify(logits: torch.Tensor, proposals: list[list[int]], draft_probs: list[torch.Tensor | None],
           params: list[SamplingParams], generators: list[torch.Generator | None]
           ) -> list[list[int]]:
    """The tokens each request emits this step: its accepted proposals, then one more.

    logits (R, V): request b's 1 + k_b rows in order (the row of its last known token, then one
    per proposal), requests one after another. proposals[b]: its k_b proposed tokens (may be
    empty: then it samples one token, as without speculation). draft_probs[b]: (k_b, V), the
    distributions they were drawn from, or None for one-hot proposals (prompt lookup, greedy).
    """
    row_params = [p for p, d in zip(params, proposals) for _ in range(len(d) + 1)]
    p = sampling_probs(logits, row_params)  # (R, V): what the target would sample from
    q = torch.zeros_like(p)  # the proposer's distribution for each row's next token; 0: none
    drafted_rows, drafted, one_hot_rows, one_hot_tokens = [], [], [], []
    row = 0
    for d, probs in zip(proposals, draft_probs):
        rows = list(range(row, row + len(d)))  # row r + i checks proposal d[i]
        if d and probs is None:
            one_hot_rows += rows
            one_hot_tokens += d
        elif d:
            q[row:row + len(d)] = probs.float()
        drafted_rows += rows
        drafted += d
        row += len(d) + 1
    if one_hot_rows:  # one indexed write for every one-hot proposal of the step
        q[one_hot_rows, one_hot_tokens] = 1.0
    residual = (p - q).clamp(min=0)
    # p == q leaves no residual; but then every proposal is accepted and the row goes unused.
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p)
    row_generators = [g for g, d in zip(generators, proposals) for _ in range(len(d) + 1)]
    candidates = draw(residual, row_params, row_generators)
    accepted = torch.zeros(p.shape[0], dtype=torch.bool, device=p.device)
    if drafted:
        index = torch.tensor(drafted_rows, device=p.device)
        tokens = torch.tensor(drafted, device=p.device)[:, None]
        p_d, q_d = p[index].gather(1, tokens)[:, 0], q[index].gather(1, tokens)[:, 0]
        u = _uniforms(row_params, generators, proposals, p.device)[index]
        accepted[index] = u * q_d < p_d  # probability min(1, p/q), no division by a tiny q
    host = torch.stack([accepted.long(), candidates]).tolist()  # the step's one read-back
    out, row = [], 0
    for d in proposals:
        n = 0
        while n < len(d) and host[0][row + n]:
            n += 1
        out.append(d[:n] + [host[1][row + n]])
        row += len(d) + 1
    return out


def _uniforms(row_params: list[SamplingParams], generators: list[torch.Generator | None],
              proposals: list[list[int]], device: torch.device) -> torch.Tensor:
    """U(0, 1) per row from its request's generator; 0.5 for greedy rows (p is 0 or 1 there)."""
    u = torch.full((len(row_params),), 0.5, device=device)
    row = 0
    for d, g in zip(proposals, generators):
        if row_params[row].temperature > 0 and d:
            u[row:row + len(d)] = torch.rand(len(d), generator=g, device=device)
        row += len(d) + 1
    return u
