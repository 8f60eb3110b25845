"""Reference solutions of chapter 07's graded exercises."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from minillm.calc.roofline import decode_step_time
from minillm.calc.sizing import max_concurrency


def goodput(records: Sequence[Any], slo: Mapping[str, float], duration: float) -> float:
    """07.1: completed requests within every bound, per second of the run. TPOT counts tokens
    (output_len, from the usage chunk), not chunks: a chunk may carry several tokens."""
    good = 0
    for r in records:
        if r.error is not None:
            continue
        ttft, e2e = r.metrics.ttft, r.metrics.e2e
        tpot = (e2e - ttft) / (r.output_len - 1) if r.output_len > 1 else 0.0
        values = {"ttft": ttft, "tpot": tpot, "e2e": e2e}
        good += all(values[name] <= bound for name, bound in slo.items())
    return good / duration


def capacity(runs: Mapping[float, Sequence[Any]], slo: Mapping[str, float],
             attainment: float) -> float | None:
    """07.2: walk the rates upwards; stop at the first run that keeps fewer than `attainment`
    of all its requests (failed ones included) within the SLO."""
    best = None
    for rate in sorted(runs):
        records = runs[rate]
        good = goodput(records, slo, 1.0)  # a count, with a duration of one second
        if good < attainment * len(records):
            break
        best = rate
    return best


def max_num_seqs_for(model: str, hw: str, context_len: int, tpot_slo: float) -> int:
    """07.3: the KV wall at 90% of memory, then the largest batch whose decode step (one token
    for each sequence over context_len tokens) meets the TPOT target; the smaller wins."""
    wall = max_concurrency(model, hw, context_len, gpu_memory_utilization=0.9)
    best = 0
    for batch in range(1, wall + 1):
        if decode_step_time(model, hw, batch, context_len).time > tpot_slo:
            break
        best = batch
    return best


SOLUTIONS = {"07.1": goodput, "07.2": capacity, "07.3": max_num_seqs_for}

MODEL_ANSWERS: dict[str, str] = {
    "07.4": """\
**Model answer.** Past capacity the open loop's queue grows for as long as requests keep
arriving faster than they leave: with an offered rate r above the capacity c, the n-th request
waits about n (1/c - 1/r) seconds, so the p99 TTFT grows linearly with the run's length (twice
the requests, about twice the p99) and faster at 3x than at 1.5x capacity. At 1.2x and 32
requests the queue barely forms and the two loops look alike; at 3x and 128 requests the open
loop's p99 is seconds. The closed loop's p99 stays near one batch's worth of prefill and decode
whatever the length, because at most C requests are ever in the server.

A closed loop lies less when its clients stop waiting on the server: many more clients than
seats (so a queue can form), think times drawn so that the offered rate is set by the clients,
not by the server's speed, and client-side timeouts counted as failures. In the limit (many
clients, each sending rarely) it becomes an open loop. Sentence for a reviewer: "a latency
measured with a fixed number of clients that each wait for their reply cannot show queueing
beyond that number, so it says nothing about latency at or past saturation; report the offered
rate (open loop) or the throughput only."

**Rubric (10 points).**
- 3: the table of p99 TTFT for both loops over rates and lengths, measured, with the linear
  growth of the open loop's p99 in the run's length explained by the queue.
- 2: the closed loop's p99 bounded by C, explained (the server never holds more than C).
- 3: a concrete change that makes a closed-loop benchmark approach the open one (more clients
  than seats with think times; timeouts as failures), with a measurement.
- 2: the reviewer's sentence names coordinated omission or the missing queue.
""",
    "07.5": """\
**Model answer** (measured on a 2-core CPU with the shipped model; your numbers will differ).

A tighter TTFT target (4x a lone request) moves the knee down to about half the capacity or
less: even a short queue behind one long prompt breaks it, and the long prompts themselves
(whose own prefill exceeds 4x a short request's TTFT) never count. A looser one (30x) moves the
knee up to about the capacity, and the collapse past it becomes gentler: queues must grow
longer before they break the target. The throughput plateau does not move: it is the server's
capacity, whatever the SLO.

With max_num_seqs=4 the capacity falls (fewer sequences share each step) but TPOT is lower,
so a tight TPOT target may favour it; with 32 the throughput rises a little on a CPU (steps
get compute-bound quickly) and TPOT grows. Under the chapter's SLO the best goodput usually
comes from 16 or 32, not necessarily the setting with the highest throughput: goodput is
decided by the SLO, and the configuration that maximises tokens/s can be the one whose TPOT
breaks it.

Modelled (Llama-3-8B, H100-SXM, closed loop with every seat busy): with the chapter's
workload 64 seats serve about 300 requests/s at a TPOT p50 of ~5 ms, 256 about 570 at ~12 ms,
and 1,024 about 600 (+7%) at ~30 ms: past 256 the extra seats buy little throughput and break
a 22 ms TPOT target, so goodput falls. With 2,048-token prompts prefill dominates: about 33
requests/s whatever the seats (the GPU is compute-bound on the prompts) and a TPOT of ~30 ms,
since nearly every step carries a prefill chunk; more seats buy nothing, and the knee is set
by prefill, which is where chunk size (chapter 06) and disaggregation come in.

**Rubric (10 points).**
- 3: the knee at three TTFT targets, with the plateau unchanged, explained.
- 3: the max_num_seqs comparison measured, and the point that the best goodput is not
  necessarily the best throughput.
- 2: the simulator runs for 64/256/1,024 seats, with the KV wall noticed at 2k-token prompts.
- 2: every number labelled measured or modelled, with the hardware.
""",
}
