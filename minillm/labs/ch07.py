"""Graded exercises of chapter 07 (measuring serving honestly).

07.1 and 07.2 consume the benchmark client's per-request records (minillm.serving.RequestRecord,
what minillm.serve.client.benchmark returns in result.records): each has prompt_len and
output_len (tokens, output_len from the server's usage chunk), metrics (a RequestMetrics whose
token_times are the arrival times of the streamed chunks with text, not of tokens: a chunk may
carry several) and error (None, or why the request failed). The graders build records from a
recorded stream of known shape, so the expected figures follow from vLLM's definitions:
TPOT = (E2E - TTFT) / (output tokens - 1), 0 for a one-token reply; a failed request never
counts as good. 07.3 sizes max_num_seqs with the KV formula and the roofline's decode step.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from minillm.calc.roofline import decode_step_time
from minillm.calc.sizing import max_concurrency
from minillm.labs.exercise import Exercise, close, expect_callable
from minillm.metrics import RequestMetrics
from minillm.serve.serving import RequestRecord

# ---- records of a recorded stream ------------------------------------------------------------

def recorded_stream(num_requests: int, seed: int, rate: float = 8.0,
                    fail_every: int = 9) -> list[RequestRecord]:
    """Records as the client would write them for a stream of known shape: Poisson arrivals at
    `rate` requests/s; output_len tokens streamed in chunks of 1-3 tokens (so chunks are not
    tokens); every fail_every-th request failed mid-stream (error set, no finish time)."""
    rng, records, t = random.Random(seed), [], 0.0
    for i in range(num_requests):
        t += rng.expovariate(rate)
        prompt_len, output_len = rng.randint(16, 256), rng.choice([1, 2, 8, 32, 64, 128])
        m = RequestMetrics(arrival_time=t)
        now = t + rng.uniform(0.02, 0.6)  # the first chunk: queueing plus prefill
        m.first_scheduled_time = None  # a client cannot see the server's scheduler
        m.first_token_time, left = now, output_len - min(output_len, rng.randint(1, 3))
        m.token_times.append(now)
        while left > 0:  # later chunks, each with 1-3 tokens, after a gap of 5-80 ms
            now += rng.uniform(0.005, 0.08)
            left -= min(left, rng.randint(1, 3))
            m.token_times.append(now)
        error = None
        if fail_every and i % fail_every == fail_every - 1:  # the stream broke halfway
            error = "the stream ended before data: [DONE]"
            m.token_times = m.token_times[:max(1, len(m.token_times) // 2)]
            output_len = len(m.token_times)  # no usage chunk came: what the text holds
        records.append(make_record(prompt_len, output_len, m, error))
    return records


def make_record(prompt_len: int, output_len: int, metrics: RequestMetrics,
                error: str | None) -> RequestRecord:
    """One of the client's records, as it writes them (minillm.serve.client): first and last
    chunk times, and the token count in the metrics, even for a request that failed."""
    if metrics.token_times:
        metrics.first_token_time = metrics.token_times[0]
        metrics.finished_time = metrics.token_times[-1]
    metrics.num_output_tokens = output_len
    return RequestRecord(prompt_len=prompt_len, output_len=output_len, metrics=metrics,
                         error=error)


def tpot_of(record: RequestRecord) -> float:
    """vLLM's per-request TPOT: (E2E - TTFT) / (output tokens - 1), 0 for one token."""
    m = record.metrics
    if record.output_len <= 1:
        return 0.0
    return (m.e2e - m.ttft) / (record.output_len - 1)


def is_good(record: RequestRecord, slo: Mapping[str, float]) -> bool:
    """A completed request within every bound of slo (seconds; equal to a bound is within)."""
    if record.error is not None:
        return False
    values = {"ttft": record.metrics.ttft, "tpot": tpot_of(record), "e2e": record.metrics.e2e}
    return all(values[name] <= bound for name, bound in slo.items())


def reference_goodput(records: Sequence[RequestRecord], slo: Mapping[str, float],
                      duration: float) -> float:
    return sum(is_good(r, slo) for r in records) / duration


def run_duration(records: Sequence[RequestRecord]) -> float:
    """The benchmark's duration: first arrival to the last finish (seconds)."""
    ends = [r.metrics.finished_time for r in records if r.error is None]
    return max(ends) - min(r.metrics.arrival_time for r in records)


# ---- 07.1: goodput from the records ----------------------------------------------------------

AT_A_BOUND = None  # an SLO whose TTFT bound is exactly the first request's TTFT
GOODPUT_SLOS = [{"ttft": 0.3, "tpot": 0.04}, AT_A_BOUND, {"tpot": 0.035, "e2e": 2.0},
                {"e2e": 1.5}, {"ttft": 0.25, "tpot": 0.05, "e2e": 3.0}]


def goodput_hint(got: float, records: Sequence[RequestRecord], slo: Mapping[str, float],
                 duration: float) -> str:
    """Name the usual mistake behind a wrong goodput, or ''."""
    ok = [r for r in records if r.error is None]
    chunk_tpot = {"ttft": lambda r: r.metrics.ttft, "e2e": lambda r: r.metrics.e2e,
                  "tpot": lambda r: ((r.metrics.e2e - r.metrics.ttft)
                                     / max(1, len(r.metrics.token_times) - 1))}
    by_chunks = sum(all(chunk_tpot[k](r) <= b for k, b in slo.items()) for r in ok)
    strict = sum(all({"ttft": r.metrics.ttft, "tpot": tpot_of(r), "e2e": r.metrics.e2e}[k] < b
                     for k, b in slo.items()) for r in ok)
    good = sum(is_good(r, slo) for r in records)
    if "tpot" in slo and close(got, by_chunks / duration) and by_chunks != good:
        return (" (a chunk may carry several tokens: TPOT is (E2E - TTFT) / (output_len - 1) "
                "with output_len, the tokens the usage chunk reports, not the number of chunks "
                "in token_times)")
    if close(got, good / len(records)) or close(got, good / max(1, len(ok))):
        return (" (goodput is a rate: requests within the SLO per second of the run, not a "
                "share of the requests)")
    with_failed = sum(is_good(RequestRecord(r.prompt_len, r.output_len, r.metrics), slo)
                      for r in records)
    if with_failed != good and close(got, with_failed / duration):
        return (" (a failed request never counts, however fast its first chunks came: skip "
                "the records whose error is set)")
    if close(got, len(ok) / duration):
        return " (count only the requests that meet every bound of the SLO)"
    if close(got, strict / duration) and strict != good:
        return " (a request exactly at a bound meets it: compare with <=)"
    return ""


def grade_goodput(goodput: Any) -> str:
    expect_callable(goodput, "goodput(records, slo, duration) -> requests/s")
    for seed, slo in enumerate(GOODPUT_SLOS):
        records = recorded_stream(60, seed)
        if slo is AT_A_BOUND:
            slo = {"ttft": records[0].metrics.ttft}
        duration = run_duration(records)
        got = goodput(records, dict(slo), duration)
        assert got is not None, "goodput returned None"
        assert isinstance(got, (int, float)), f"return requests/s as a number, got {got!r:.80}"
        want = reference_goodput(records, slo, duration)
        failed = sum(r.error is not None for r in records)
        assert close(got, want, rel_tol=1e-9), (
            f"60 recorded requests ({failed} failed) over {duration:.2f} s, SLO "
            f"{', '.join(f'{k} <= {v * 1e3:g} ms' for k, v in slo.items())}: goodput is "
            f"{want:.4f} requests/s, you returned {got:.4f}"
            f"{goodput_hint(got, records, slo, duration)}")
    return ("goodput = requests that completed within every bound / the run's duration, with "
            "TPOT from the usage token count: vLLM's request_goodput")


# ---- 07.2: the capacity at an SLO from a sweep of records ------------------------------------

def reference_capacity(runs: Mapping[float, Sequence[RequestRecord]], slo: Mapping[str, float],
                       attainment: float) -> float | None:
    """The highest offered rate up to which every run keeps `attainment` of its requests good."""
    return _walk({rate: sum(is_good(r, slo) for r in records) >= attainment * len(records)
                  for rate, records in runs.items()})


def sweep_of_records(seed: int, rates: Sequence[float], capacity: float,
                     lucky: float | None = None) -> dict[float, list]:
    """A synthetic rate sweep: requests served by a server of `capacity` requests/s, so past it
    a queue builds and TTFT grows with each request's place in it; some requests fail. The run
    at rate `lucky` found the server four times faster (a quiet moment on a shared machine)."""
    runs: dict[float, list[RequestRecord]] = {}
    rng = random.Random(seed)
    for rate in rates:
        speed = 4 * capacity if rate == lucky else capacity
        records, t, free_at = [], 0.0, 0.0
        for _ in range(40):
            t += rng.expovariate(rate)
            start = max(t, free_at)
            free_at = start + rng.expovariate(speed)
            m = RequestMetrics(arrival_time=t)
            m.first_token_time = start + 0.05
            output_len = rng.randint(8, 64)
            m.token_times = [m.first_token_time + k * 0.02 for k in range(0, output_len, 2)]
            error = "HTTP 500" if rng.random() < 0.03 else None
            if error is None:
                m.finished_time = m.token_times[-1]
            records.append(make_record(16, output_len, m, error))
        runs[rate] = records
    return dict(sorted(runs.items(), key=lambda kv: rng.random()))  # any order: sort it yourself


# (seed, rates, server capacity, attainment target, the rate of a lucky run or None)
CAPACITY_CASES = [(0, (2, 4, 8, 16, 32), 10.0, 0.9, None), (1, (1, 2, 3, 5, 8, 13), 6.0, 0.9, 8),
                  (2, (4, 8, 16, 32), 40.0, 0.8, None), (3, (10, 20, 40), 5.0, 0.95, None),
                  (4, (1, 2, 4, 8, 16, 32, 64), 20.0, 0.9, None),
                  (2, (4, 8, 16, 32), 40.0, 0.97, None)]


def capacity_hint(got: Any, runs: Mapping[float, Sequence[RequestRecord]], slo: Mapping[str, float],
                  attainment: float) -> str:
    share = {rate: sum(is_good(r, slo) for r in rs) / len(rs) for rate, rs in runs.items()}
    ok_share = {rate: sum(is_good(r, slo) for r in rs) / max(1, sum(r.error is None for r in rs))
                for rate, rs in runs.items()}
    passes = {rate: s >= attainment for rate, s in share.items()}
    ok_passes = {rate: s >= attainment for rate, s in ok_share.items()}
    passing = [rate for rate, ok in passes.items() if ok]
    if got == _walk(ok_passes) != _walk(passes):
        return " (a failed request counts against the share: divide by all the requests)"
    if passing and got == max(passing):
        return (" (a rate past the first that misses the target does not count: once the queue "
                "builds, a lucky run at a higher rate is noise, not capacity)")
    if got is not None and got == max(share, key=lambda rate: (share[rate], -rate)):
        return (" (that is the rate where the most requests met the SLO; the capacity is the "
                "highest rate that still keeps the target share)")
    return ""


def _walk(passes: Mapping[float, bool]) -> float | None:
    """The highest rate before the first that does not pass (None if the lowest does not)."""
    best = None
    for rate in sorted(passes):
        if not passes[rate]:
            break
        best = rate
    return best


def grade_capacity(capacity: Any) -> str:
    expect_callable(capacity, "capacity(runs, slo, attainment) -> requests/s or None")
    slo = {"ttft": 0.5, "tpot": 0.025}
    for seed, rates, server_rate, attainment, lucky in CAPACITY_CASES:
        runs = sweep_of_records(seed, rates, server_rate, lucky)
        got = capacity({rate: list(rs) for rate, rs in runs.items()}, dict(slo), attainment)
        want = reference_capacity(runs, slo, attainment)
        shares = ", ".join(f"{rate:g}: {sum(is_good(r, slo) for r in runs[rate])}/"
                           f"{len(runs[rate])}" for rate in sorted(runs))
        assert got == want, (
            f"a sweep whose requests met the SLO at each rate as {{{shares}}} with a target "
            f"of {attainment:.0%}: the capacity is {want!r}, you returned {got!r:.80}"
            f"{capacity_hint(got, runs, slo, attainment)}")
    return ("the capacity at an SLO is the highest offered rate up to which every run keeps "
            "the target share of requests within it (DistServe's per-GPU goodput)")


# ---- 07.3: max_num_seqs from the KV wall and the TPOT target ---------------------------------

SIZING_CASES = [("llama-3-8b", "H100-SXM", 8192, 0.030), ("llama-3-8b", "H100-SXM", 2048, 0.020),
                ("llama-3-8b", "A100-80GB", 4096, 0.025), ("llama-3-70b", "H100-SXM", 4096, 0.05),
                ("qwen3-0.6b", "H100-SXM", 32768, 0.010), ("llama-3-8b", "H100-SXM", 1024, 0.004)]
GPU_MEMORY_UTILIZATION = 0.9


def batch_for_tpot(model: str, hw: str, context_len: int, tpot: float, limit: int) -> int:
    """The largest batch up to limit whose modelled decode step fits in tpot seconds."""
    best = 0
    for batch in range(1, limit + 1):
        if decode_step_time(model, hw, batch, context_len).time > tpot:
            break
        best = batch
    return best


def reference_max_num_seqs(model: str, hw: str, context_len: int, tpot: float) -> int:
    wall = max_concurrency(model, hw, context_len, GPU_MEMORY_UTILIZATION)
    return batch_for_tpot(model, hw, context_len, tpot, wall)


def grade_max_num_seqs(size: Any) -> str:
    expect_callable(size, "max_num_seqs_for(model, hw, context_len, tpot_slo) -> sequences")
    for model, hw, context_len, tpot in SIZING_CASES:
        got = size(model, hw, context_len, tpot)
        assert got is not None, "max_num_seqs_for returned None"
        want = reference_max_num_seqs(model, hw, context_len, tpot)
        wall = max_concurrency(model, hw, context_len, GPU_MEMORY_UTILIZATION)
        by_slo = batch_for_tpot(model, hw, context_len, tpot, 4096)
        hint = ""
        if got == wall and wall != want:
            hint = " (that is the KV wall alone: the batch must also keep TPOT within the SLO)"
        elif got == by_slo and by_slo != want:
            hint = (" (that batch meets the TPOT target, but its KV cache does not fit: take the "
                    "smaller of the two)" if wall else
                    " (the weights alone fill this GPU: no batch fits, so 0)")
        elif got == max_concurrency(model, hw, context_len) and got != want:
            hint = (" (leave vLLM's headroom: gpu_memory_utilization=0.9 of the memory, the rest "
                    "for activations and the CUDA context)")
        assert got == want, (
            f"{model} on {hw}, {context_len}-token contexts, TPOT <= {tpot * 1e3:g} ms: "
            f"max_num_seqs is {want}, you returned {got!r:.80}{hint}")
    return ("max_num_seqs = min(the KV wall at 90% of memory, the largest batch whose decode "
            "step meets the TPOT target): sized from the formula and the SLO, not from GPU %")


EXERCISES = [
    Exercise("07.1", "Goodput from the client's records",
             "Write goodput(records, slo, duration) -> requests/s that completed within every "
             "bound of slo (seconds; keys ttft, tpot, e2e), TPOT from output_len.",
             grade_goodput),
    Exercise("07.2", "The capacity at an SLO",
             "Write capacity(runs, slo, attainment) -> the highest offered rate up to which every "
             "run kept at least `attainment` of its requests within the SLO (None if none did).",
             grade_capacity),
    Exercise("07.3", "Size max_num_seqs from the KV wall and the SLO",
             "Write max_num_seqs_for(model, hw, context_len, tpot_slo) -> the largest batch that "
             "fits the KV cache (90% of memory) and whose decode step meets tpot_slo.",
             grade_max_num_seqs),
]
