"""Synthetic serving workloads: when requests arrive and how long their prompts and outputs are.

A Workload is a list of RequestSpec plus how it is driven:

- open loop (concurrency None): request i arrives at its arrival_time whatever the server is
  doing, as production traffic does; a slow server builds a queue and latency grows without
  bound past saturation.
- closed loop (concurrency C): C clients each send a request, wait for its last token, and send
  the next one at once; the server never has more than C requests, so latency stays bounded and
  the offered load falls as the server slows down.

A length argument is an int (fixed), a (lo, hi) tuple (uniform integers, inclusive) or a
distribution object (Uniform, LogNormal, Choice, Mixture: minillm.workloads.lengths, importable
from here too). Everything is
seeded: the same arguments give the same workload.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

# The length distributions, re-exported: chapters write workload.Uniform and so on.
from minillm.workloads.lengths import Choice as Choice
from minillm.workloads.lengths import Fixed as Fixed
from minillm.workloads.lengths import Length as Length
from minillm.workloads.lengths import LengthDistribution as LengthDistribution
from minillm.workloads.lengths import LogNormal as LogNormal
from minillm.workloads.lengths import Mixture as Mixture
from minillm.workloads.lengths import Uniform as Uniform
from minillm.workloads.lengths import as_distribution, check_int


@dataclass(frozen=True)
class RequestSpec:
    """One synthetic request.

    arrival_time: seconds from the start of the run (0.0 in a closed loop, where a request is
    sent when a client is free). prompt_len, output_len: tokens. Requests with the same
    prefix_id share their first prefix_len prompt tokens (a common system prompt). seed
    determines the rest of the prompt. prompt: the text, for a request drawn from a text data
    set (minillm.serve.datasets); prompt_len is then its length in the data set's tokenizer.
    priority: the request's priority under scheduling_policy="priority" (lower runs first).
    """

    arrival_time: float
    prompt_len: int
    output_len: int
    prefix_id: int | None = None
    prefix_len: int = 0
    seed: int = 0
    prompt: str | None = None
    priority: int = 0

    def __post_init__(self) -> None:
        t = self.arrival_time
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t >= 0):
            raise ValueError(f"arrival_time must be a finite number >= 0 seconds, got {t!r}")
        check_int(self.prompt_len, "prompt_len")
        check_int(self.output_len, "output_len")
        check_int(self.prefix_len, "prefix_len", minimum=0)
        if self.prefix_len > self.prompt_len:
            raise ValueError(f"prefix_len={self.prefix_len} exceeds prompt_len={self.prompt_len}")
        if self.prefix_id is None and self.prefix_len:
            raise ValueError(f"prefix_len={self.prefix_len} needs a prefix_id")
        if self.prefix_id is not None:
            check_int(self.prefix_id, "prefix_id", minimum=0)
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise ValueError(f"priority must be an int, got {self.priority!r}")
        if self.prompt is not None and (not isinstance(self.prompt, str) or not self.prompt):
            raise ValueError(f"prompt must be a non-empty str or None, got {self.prompt!r:.80}")

    def token_ids(self, vocab_size: int) -> list[int]:
        """prompt_len token ids in [1, vocab_size): id 0 is eos in the shipped model.

        The prefix depends only on (prefix_id, prefix_len), so specs with the same prefix_id
        share it token for token; the suffix depends only on seed.
        """
        check_int(vocab_size, "vocab_size", minimum=2)
        prefix: list[int] = []
        if self.prefix_id is not None:
            rng = random.Random(f"minillm-prefix-{self.prefix_id}")
            prefix = [rng.randrange(1, vocab_size) for _ in range(self.prefix_len)]
        rng = random.Random(self.seed)
        return prefix + [rng.randrange(1, vocab_size)
                         for _ in range(self.prompt_len - self.prefix_len)]


class Workload(list[RequestSpec]):
    """Request specs in issue order, and how to drive them.

    concurrency: None for an open loop (each request arrives at its arrival_time); an int C for
    a closed loop (at most C in flight, the next sent the moment one finishes).
    rate: the mean arrival rate the workload was drawn at (requests/s), when there is one.
    """

    def __init__(self, specs: Sequence[RequestSpec] = (), concurrency: int | None = None,
                 rate: float | None = None):
        super().__init__(specs)
        for spec in self:
            if not isinstance(spec, RequestSpec):
                raise ValueError(f"a Workload holds RequestSpec items, got {spec!r:.80}")
        if concurrency is not None:
            check_int(concurrency, "concurrency")
        self.concurrency = concurrency
        self.rate = rate

    @property
    def is_closed_loop(self) -> bool:
        return self.concurrency is not None

    def __getitem__(self, index: int | slice) -> RequestSpec | Workload:  # type: ignore[override]
        """A slice is a Workload driven the same way; an int index is one RequestSpec."""
        if isinstance(index, slice):
            return Workload(super().__getitem__(index), self.concurrency, self.rate)
        return super().__getitem__(index)

    def __repr__(self) -> str:
        loop = (f"closed loop, concurrency {self.concurrency}" if self.is_closed_loop
                else f"open loop, {self.rate:g} req/s" if self.rate is not None else "open loop")
        return (f"Workload({len(self)} requests, {loop}, "
                f"{sum(s.prompt_len for s in self)} prompt + "
                f"{sum(s.output_len for s in self)} output tokens)")


class Arrivals:
    """When a simulation sends each request of a workload, as a heap of (time, index): an open
    loop's at their arrival_time; a closed loop's first `concurrency` at 0 s, and each next one
    the moment a request finishes (finished). A plain list of specs is an open loop. The one
    driver of the simulator, the fleet, disaggregated serving, the in-process replay
    (minillm.serve.serving) and the real run of calibration (minillm.serve.real_run)."""

    def __init__(self, workload: Sequence[RequestSpec]):
        self.workload = workload
        self.concurrency: int | None = getattr(workload, "concurrency", None)
        first = len(workload) if self.concurrency is None else min(self.concurrency,
                                                                   len(workload))
        self.pending = [(workload[i].arrival_time if self.concurrency is None else 0.0, i)
                        for i in range(first)]
        heapq.heapify(self.pending)
        self.sent = first  # requests put in pending so far

    def __bool__(self) -> bool:
        """Whether a request is still to be sent."""
        return bool(self.pending)

    def next_time(self) -> float:
        """When the next request is sent (there must be one)."""
        return self.pending[0][0]

    def pop(self) -> tuple[float, int]:
        """The next request to send: (its send time, its workload index)."""
        return heapq.heappop(self.pending)

    def finished(self, now: float) -> None:
        """A request finished at now: a closed loop's client sends its next request then."""
        if self.concurrency is not None and self.sent < len(self.workload):
            heapq.heappush(self.pending, (now, self.sent))
            self.sent += 1


def _check_rate(rate: object) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise ValueError(f"rate must be a positive number of requests/s (or inf), got {rate!r}")
    return float(rate)


def arrival_times(rng: random.Random, n: int, rate: float, burstiness: float = 1.0) -> list[float]:
    """The first request at 0 s, then gamma gaps of mean 1/rate s and shape burstiness.

    burstiness 1 is a Poisson process (exponential gaps); below 1 the same mean rate comes in
    bursts, above 1 more evenly (vLLM's --burstiness).
    """
    if not (isinstance(burstiness, (int, float)) and 0 < burstiness < math.inf):
        raise ValueError(f"burstiness must be a positive number (1 = Poisson), got {burstiness!r}")
    times, t = [], 0.0
    for i in range(n):
        if i > 0 and rate != math.inf:
            t += (rng.expovariate(rate) if burstiness == 1 else
                  rng.gammavariate(burstiness, 1.0 / (rate * burstiness)))
        times.append(t)
    return times


def poisson(num_requests: int, rate: float, prompt_len: Length, output_len: Length,
            seed: int = 0, burstiness: float = 1.0) -> Workload:
    """Open loop: num_requests arriving as a Poisson process of rate requests/s (inf: all at 0).

    burstiness != 1 draws gamma inter-arrival gaps of that shape instead, with the same mean.
    """
    check_int(num_requests, "num_requests")
    rate = _check_rate(rate)
    prompt, output = as_distribution(prompt_len, "prompt_len"), as_distribution(
        output_len, "output_len")
    rng = random.Random(seed)
    specs = [RequestSpec(t, prompt.sample(rng), output.sample(rng), seed=rng.getrandbits(63))
             for t in arrival_times(rng, num_requests, rate, burstiness)]
    return Workload(specs, rate=rate)


def closed_loop(num_requests: int, concurrency: int, prompt_len: Length, output_len: Length,
                seed: int = 0) -> Workload:
    """Closed loop: concurrency clients send num_requests in all, each waiting for its last."""
    check_int(num_requests, "num_requests")
    check_int(concurrency, "concurrency")
    prompt, output = as_distribution(prompt_len, "prompt_len"), as_distribution(
        output_len, "output_len")
    rng = random.Random(seed)
    specs = [RequestSpec(0.0, prompt.sample(rng), output.sample(rng), seed=rng.getrandbits(63))
             for _ in range(num_requests)]
    return Workload(specs, concurrency=concurrency)


def shared_prefix(num_requests: int, rate: float, prefix_len: int, num_prefixes: int,
                  suffix_len: Length, output_len: Length, seed: int = 0) -> Workload:
    """Open loop where every prompt starts with one of num_prefixes system prompts.

    Each prompt is prefix_len tokens of a prefix picked uniformly at random, then suffix_len
    tokens of its own: the workload that prefix caching speeds up.
    """
    check_int(num_requests, "num_requests")
    rate = _check_rate(rate)
    check_int(prefix_len, "prefix_len")
    check_int(num_prefixes, "num_prefixes")
    suffix, output = as_distribution(suffix_len, "suffix_len"), as_distribution(
        output_len, "output_len")
    rng = random.Random(seed)
    specs = []
    for t in arrival_times(rng, num_requests, rate):
        prefix_id = rng.randrange(num_prefixes)
        specs.append(RequestSpec(t, prefix_len + suffix.sample(rng), output.sample(rng),
                                 prefix_id=prefix_id, prefix_len=prefix_len,
                                 seed=rng.getrandbits(63)))
    return Workload(specs, rate=rate)
