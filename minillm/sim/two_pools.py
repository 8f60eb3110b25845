"""Disaggregated serving's run loop: a prefill pool and a decode pool of simulated engines, and
the link between them that each request's prompt K/V crosses (minillm.disaggregation sizes the
pools, builds them and reports; this module steps them).

The two pools are stepped in order of virtual time, with arrivals and K/V landings as events:
a request's prompt runs on a prefill replica (output_len 1), its K/V leaves on that replica's
link once the first token is out, and lands on a decode replica (minillm.sim.kv_handover), which
generates the rest. The request's output joins its two halves.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from minillm.calc.hardware import Link
from minillm.metrics import RequestMetrics
from minillm.request import Request, RequestOutput
from minillm.sim.kv_handover import DecodeReplica
from minillm.sim.simulated_engine import Simulator
from minillm.workloads.streams import Arrivals, RequestSpec


@dataclass(frozen=True)
class KVTransfer:
    """One request's prompt K/V crossing the link: bytes, and when it left and landed (s)."""

    index: int
    prefill_replica: int
    decode_replica: int | None  # None while the K/V is on the link: routed when it lands
    num_bytes: float
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start



class TwoPools:
    """Prefill and decode replicas stepped in order of virtual time; arrivals and landings are
    events applied when the clock meets them (before a step that starts at the same instant)."""

    def __init__(self, prefill: list[Simulator], decode: list[DecodeReplica], link: Link,
                 kv_bytes_per_token: float, stream_from_decode: bool = True):
        self.prefill, self.decode, self.link = prefill, decode, link
        self.kv_bytes_per_token = kv_bytes_per_token
        # vLLM's proxy: the decode side makes every token the client sees, the first included
        self.stream_from_decode = stream_from_decode
        self.link_free = [0.0] * len(prefill)  # when each prefill replica's link is next idle
        self.transfers: list[KVTransfer | None] = []

    def run(self, workload: Sequence[RequestSpec]) -> list[RequestOutput]:
        """Serve every request; the joined outputs come back in workload order."""
        n = len(workload)
        arrivals = Arrivals(workload)
        seq = itertools.count()  # keeps landings of one instant in the order they were made
        landings: list[tuple[float, int, int, list[int]]] = []  # (time, order, index, tokens)
        replicas = [*self.prefill, *self.decode]
        self.transfers = [None] * n
        halves: list[Request | None] = [None] * n
        done: list[RequestOutput | None] = [None] * n
        num_sent, num_landed = itertools.count(), itertools.count()
        while arrivals or landings or any(s.scheduler.has_unfinished_requests() for s in replicas):
            busy = [s for s in replicas if s.scheduler.has_unfinished_requests()]
            sim = min(busy, key=lambda s: s.clock) if busy else None
            next_arrival = arrivals.next_time() if arrivals else math.inf
            next_landing = landings[0][0] if landings else math.inf
            soonest = min(next_arrival, next_landing)  # an arrival first, at a tie
            if soonest < math.inf and (sim is None or soonest <= sim.clock):
                if next_arrival <= next_landing:  # an arrival: its prompt, to a prefill replica
                    now, i = arrivals.pop()
                    p = self.prefill[next(num_sent) % len(self.prefill)]
                    if not p.scheduler.has_unfinished_requests():
                        p.clock = max(p.clock, now)
                    halves[i] = p.add_request(i, dataclasses.replace(workload[i], output_len=1),
                                              now)
                else:  # a landing: to a decode replica
                    now, _, i, tokens = heapq.heappop(landings)
                    d = next(num_landed) % len(self.decode)
                    rest = workload[i].output_len - (0 if self.stream_from_decode else 1)
                    self.decode[d].land(i, tokens, rest, now)
                    transfer = self.transfers[i]
                    assert transfer is not None
                    self.transfers[i] = dataclasses.replace(transfer, decode_replica=d)
                continue
            assert sim is not None
            ended = []
            for req in sim.step():
                i = int(req.request_id)
                if isinstance(sim, DecodeReplica):
                    first_half = halves[i]
                    assert first_half is not None
                    done[i] = joined(first_half, req, self.stream_from_decode)
                    ended.append(i)
                elif workload[i].output_len == 1 and not self.stream_from_decode:
                    done[i] = RequestOutput.of(req)
                    ended.append(i)
                else:
                    landing = self.send(i, self.prefill.index(sim), req)
                    # from the decode side the prompt alone lands: its sampled token is discarded
                    known = req.prompt_token_ids if self.stream_from_decode else req.token_ids
                    heapq.heappush(landings, (landing, next(seq), i, list(known)))
            for _ in ended:
                arrivals.finished(sim.clock)
        for sim in replicas:
            bm = sim.block_manager
            if bm.num_free_blocks != bm.num_blocks:
                raise RuntimeError(f"a KV block was lost on a replica: {sim.stats()}")
        assert all(o is not None for o in done), "a request was lost"
        return done  # type: ignore[return-value]

    def send(self, index: int, replica: int, req: Request) -> float:
        """Put req's prompt K/V on prefill replica's link once its first token is out and the
        link is free; returns when it lands."""
        assert req.metrics.first_token_time is not None
        num_bytes = req.num_prompt_tokens * self.kv_bytes_per_token
        start = max(req.metrics.first_token_time, self.link_free[replica])
        end = self.link_free[replica] = (start + self.link.latency
                                         + num_bytes / self.link.bandwidth)
        self.transfers[index] = KVTransfer(index, replica, None, num_bytes, start, end)
        return end


def joined(prefill_half: Request, decode_half: Request,
           stream_from_decode: bool = False) -> RequestOutput:
    """One request's output from its two halves: arrival (and first scheduling) from the
    prefill side; the first token from the prefill side, or with stream_from_decode from the
    decode side like every later token; the finish from the decode side."""
    first, rest = prefill_half.metrics, decode_half.metrics
    if stream_from_decode:
        first_token, times = rest.first_token_time, rest.token_times
        tokens = decode_half.output_token_ids
    else:
        first_token, times = first.first_token_time, first.token_times + rest.token_times
        tokens = prefill_half.output_token_ids + decode_half.output_token_ids
    metrics = RequestMetrics(arrival_time=first.arrival_time,
                             first_scheduled_time=first.first_scheduled_time,
                             first_token_time=first_token, finished_time=rest.finished_time,
                             token_times=times)
    return RequestOutput(prefill_half.request_id, prefill_half.prompt,
                         prefill_half.prompt_token_ids, "", tokens,
                         decode_half.finish_reason, None, metrics, decode_half.is_finished)
