"""The batched sampler: one token per row of logits, each row with its own request's parameters
and generator, read back to the host in one copy."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minillm.sampling.params import SamplingParams


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[dict[int, float] | None]


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
                      ) -> torch.Tensor:
    """Set logits outside each row's top-k and top-p set to -inf.

    logits (B, V) float32; top_k (B,) int64 with 0 meaning off; top_p (B,) float32 in (0, 1].
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V)
    vocab = logits.shape[-1]
    k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab)  # (B,)
    ranks = torch.arange(vocab, device=logits.device)  # (V,)
    remove = ranks[None, :] >= k[:, None]  # (B, V): past the k-th best
    probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(dim=-1)
    # A token is dropped when the tokens ranked above it already reach top_p; the best one never is.
    mass_before = probs.cumsum(dim=-1) - probs  # (B, V)
    remove |= mass_before >= top_p[:, None]
    remove[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor, max_k: int) -> torch.Tensor:
    """Top-k alone, without sorting the vocabulary: set logits below each row's k-th best to
    -inf, the k-th best read from one topk of the largest k in the batch (a partial selection,
    far cheaper than a full sort). Ties with the k-th best all stay, where a sort keeps k of them.

    logits (B, V) float32; top_k (B,) int64 with 0 meaning off; max_k = max(top_k), from the host.
    """
    max_k = min(max_k, logits.shape[-1])
    best = logits.topk(max_k, dim=-1).values  # (B, max_k), best first
    k = torch.where(top_k > 0, top_k, max_k).clamp(max=max_k)  # (B,)
    kth_best = best.gather(1, k[:, None] - 1)  # (B, 1)
    kth_best = kth_best.masked_fill(top_k[:, None] == 0, float("-inf"))  # rows without top-k
    return logits.masked_fill(logits < kth_best, float("-inf"))


@dataclass
class DeviceSample:
    """One step's sampled tokens before the host has read them.

    tokens (B,) int64 stays on the device. host is the copy read() returns from: the tokens, or
    with logprobs (B, 2 + 2k) float64 rows of token, its logprob, the top-k ids and their
    logprobs. On a GPU the copy goes to pinned memory behind an event as soon as the sampling
    kernels are queued, so read() waits for this step's kernels only, not for a step queued
    after it; on a CPU host is the result itself.
    """

    tokens: torch.Tensor
    params: list[SamplingParams]
    host: torch.Tensor
    ready: torch.cuda.Event | None
    k: int | None = None  # logprobs' width; None: no row asked for logprobs

    def read(self) -> SampleResult:
        if self.ready is not None:
            self.ready.synchronize()
        if self.k is None:
            return SampleResult(self.host.tolist(), [None] * len(self.params))
        rows, k = self.host.tolist(), self.k
        logprobs: list[dict[int, float] | None] = []
        for row, p in zip(rows, self.params):
            if p.logprobs is None:
                logprobs.append(None)
                continue
            ids, values = row[2:2 + p.logprobs], row[2 + k:2 + k + p.logprobs]
            entry = {int(t): v for t, v in zip(ids, values)}
            entry[int(row[0])] = row[1]
            logprobs.append(entry)
        return SampleResult([int(row[0]) for row in rows], logprobs)


def device_to_host(t: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """t's copy on the host, and on a GPU the event after which it holds t: the copy is
    queued behind the kernels that compute t, into pinned memory, without waiting for them."""
    if t.device.type != "cuda":
        return t, None
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return host, ready


class Sampler:
    """Picks one token per row of logits, each row with its own request's parameters.

    The whole batch is sampled at once, with no read-back until the chosen tokens: per-row
    settings go to the device in one non-blocking copy, and each row draws from its own
    generator, so batching never changes a request's samples. The vocabulary is sorted only
    when some row asks for top-p; top-k alone takes a partial selection (topk).
    """

    def __call__(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
    ) -> SampleResult:
        """logits (B, V), one row per request that samples this step; generators[i] is row i's
        (None for greedy rows)."""
        return self.launch(logits, params, generators).read()

    def launch(self, logits: torch.Tensor, params: list[SamplingParams],
               generators: list[torch.Generator | None]) -> DeviceSample:
        """Sample every row on the device and start the one copy of the result to the host;
        read() waits for it. The tokens stay on the device too, where the next step's inputs
        can take them before the host has seen them (asynchronous scheduling)."""
        logits = logits.float()
        return self.packed(logits, params, self.sample(logits, params, generators))

    @staticmethod
    def packed(logits: torch.Tensor, params: list[SamplingParams], tokens: torch.Tensor
               ) -> DeviceSample:
        """tokens (B,) chosen from logits' rows (B, V) float32, with the top-k log-probabilities
        of the model's raw distribution and the chosen token's for rows that ask, on their way
        to the host in one copy."""
        if all(p.logprobs is None for p in params):
            return DeviceSample(tokens, params, *device_to_host(tokens))
        logprobs = logits.log_softmax(dim=-1)  # (B, V): the model's own distribution
        k = max(p.logprobs or 0 for p in params)
        top = logprobs.topk(k, dim=-1)  # (B, k), best first; row i keeps its first logprobs
        chosen = logprobs.gather(1, tokens[:, None])  # (B, 1)
        # One (B, 2 + 2k) float64 read-back: token ids below 2**53 are exact in float64.
        packed = torch.cat([tokens[:, None].double(), chosen.double(), top.indices.double(),
                            top.values.double()], dim=1)
        return DeviceSample(tokens, params, *device_to_host(packed), k=k)

    @staticmethod
    def sample(logits: torch.Tensor, params: list[SamplingParams],
               generators: list[torch.Generator | None]) -> torch.Tensor:
        """The chosen token of each row: (B, V) float32 -> (B,) int64, without a read-back."""
        rows = [i for i, p in enumerate(params) if p.temperature > 0]
        if not rows:
            return logits.argmax(dim=-1)
        every_row = len(rows) == len(params)
        row_ids = None if every_row else host_to_device(rows, torch.int64, logits.device)
        probs = filtered_probs(logits if every_row else logits[row_ids], [params[i] for i in rows])
        chosen = exponential_race(probs, [generators[i] for i in rows])
        if every_row:
            return chosen
        tokens = logits.argmax(dim=-1)  # (B,): the greedy rows keep theirs
        tokens[row_ids] = chosen
        return tokens

def mask_eos_before_min_tokens(logits: torch.Tensor, eos_token_ids: set[int],
                               requests: list[tuple[int, int]]) -> torch.Tensor:
    """min_tokens: a row that predicts one of a request's first min_tokens output tokens cannot
    pick end-of-sequence (vLLM masks it the same way). requests: per request in row order, how
    many outputs it still needs before it may end, and its rows. (S, V) -> (S, V)."""
    if not eos_token_ids or all(short <= 0 for short, _ in requests):
        return logits
    rows, first = [], 0
    for short, num_rows in requests:
        rows += range(first, first + min(num_rows, max(short, 0)))
        first += num_rows
    eos = torch.tensor(sorted(eos_token_ids), device=logits.device)
    at = (torch.tensor(rows, device=logits.device)[:, None], eos[None, :])  # (R, 1), (1, E)
    return logits.index_put(at, torch.tensor(float("-inf"), device=logits.device))


def filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The distribution each row samples from: softmax(logits / temperature) over the row's top-k
    and top-p set. logits (R, V) float32, every row with temperature > 0 -> (R, V)."""
    settings = host_to_device(
        [[p.temperature for p in params], [p.top_k for p in params], [p.top_p for p in params]],
        torch.float32, logits.device)  # (3, R)
    # top_k rides along as float32, exact for any vocabulary below 2**24 tokens
    temperature, top_k, top_p = settings
    scaled = logits / temperature[:, None]  # (R, V)
    if any(p.top_p < 1.0 for p in params):  # top-p needs the sorted distribution
        scaled = apply_top_k_top_p(scaled, top_k.long(), top_p)
    elif any(p.top_k > 0 for p in params):
        scaled = apply_top_k(scaled, top_k.long(), max(p.top_k for p in params))
    return scaled.softmax(dim=-1)


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The distribution the sampler draws each row's token from, written out: filtered_probs for
    rows with temperature > 0, and for a greedy row all the mass on its argmax. (B, V) -> (B, V).
    Speculative decoding's acceptance rule compares these (minillm.spec.rejection)."""
    logits = logits.float()
    probs = torch.zeros_like(logits).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
    rows = [i for i, p in enumerate(params) if p.temperature > 0]
    if rows:
        row_ids = host_to_device(rows, torch.int64, logits.device)
        probs[row_ids] = filtered_probs(logits[row_ids], [params[i] for i in rows])
    return probs


def draw(probs: torch.Tensor, params: list[SamplingParams],
         generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of probs (R, V): the argmax for greedy rows, else a draw with the row's
    generator (exponential_race). (R,) int64, no read-back."""
    tokens = probs.argmax(dim=-1)
    rows = [r for r, p in enumerate(params) if p.temperature > 0]
    if rows:
        tokens[rows] = exponential_race(probs[rows], [generators[r] for r in rows])
    return tokens


def exponential_race(probs: torch.Tensor, generators: list[torch.Generator | None]
                     ) -> torch.Tensor:
    """One sample per row of probs (R, V): argmax of probs / E with E ~ Exp(1) i.i.d.

    Token v wins with probability probs[v] (the smallest of independent exponentials E_v / p_v
    is E_v / p_v's with probability p_v / sum p). It is how torch.multinomial draws a single
    sample (ATen's Distributions.cpp), so a row's draws are the same as multinomial's with the
    same generator; but multinomial also reads back a validity check per call, and this draws
    the noise row by row (each request's own generator) and takes one argmax over the batch.
    """
    noise = torch.empty_like(probs)  # (R, V)
    for row, generator in zip(noise, generators):
        row.exponential_(generator=generator)
    return (probs / noise).argmax(dim=-1)  # (R,)


def host_to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of values on device without stalling the host: a CUDA copy from pinned memory
    is asynchronous, and the caching host allocator keeps the buffer alive until it completes."""
    pinned = device.type == "cuda"
    return torch.tensor(values, dtype=dtype, pin_memory=pinned).to(device, non_blocking=pinned)
