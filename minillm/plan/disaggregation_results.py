"""What disaggregated serving reports: one run of the two pools, and its colocated comparison.

minillm.plan.disaggregation runs the pools (simulate_disaggregated) and the comparison
(compare_disaggregation), returns these records and re-exports them: only the records, their
summaries and the comparison's table live here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from minillm.calc import parallel, roofline
from minillm.calc.hardware import Link
from minillm.config import EngineConfig
from minillm.metrics import Summary, summarize
from minillm.model_config import ModelConfig
from minillm.request import RequestOutput
from minillm.sim.fleet import FleetResult
from minillm.sim.two_pools import KVTransfer


@dataclass(frozen=True)
class DisaggregatedResult:
    """A disaggregated run: outputs in workload order (joined metrics), the transfers (None for
    a request with output_len 1 under first_token_from="prefill", which ends on the prefill
    side), where the first token came from, each pool's GPUs, replica
    layout, config and per-replica counters; kv_link as given (one lane of it); times on the
    virtual clock (s), wall_time on this machine (s)."""

    outputs: list[RequestOutput]
    transfers: list[KVTransfer | None]
    prefill_gpus: int
    decode_gpus: int
    kv_link: Link
    prefill_layout: parallel.ParallelConfig
    decode_layout: parallel.ParallelConfig
    prefill_config: EngineConfig
    decode_config: EngineConfig
    prefill_stats: list[dict[str, int]]
    decode_stats: list[dict[str, int]]
    model: ModelConfig
    hardware: roofline.Hardware
    wall_time: float
    first_token_from: str = "decode"

    @property
    def num_gpus(self) -> int:
        return self.prefill_gpus + self.decode_gpus

    @property
    def kv_bytes_moved(self) -> float:
        return sum(t.num_bytes for t in self.transfers if t is not None)

    @property
    def transfer_times(self) -> list[float]:
        """Seconds each transfer took on the link, waits for the link excluded."""
        return [t.end - t.start for t in self.transfers if t is not None]

    def summary(self, slo: dict[str, float] | None = None) -> Summary:
        """minillm.metrics.summarize over every request (goodput under slo)."""
        return summarize((o.metrics for o in self.outputs), slo)


@dataclass(frozen=True)
class Comparison:
    """Disaggregated and colocated serving of one workload on the same number of GPUs;
    colocated_kwargs: the EngineConfig keywords the colocated replicas ran with (the tuned
    max_num_seqs and max_num_batched_tokens among them, unless tune_colocated was off)."""

    disaggregated: DisaggregatedResult
    colocated: FleetResult
    slo: dict[str, float]
    colocated_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def goodput(self) -> tuple[float, float]:
        """(disaggregated, colocated) requests/s that met the SLO."""
        return (self.disaggregated.summary(self.slo).goodput or 0.0,
                self.colocated.summary(self.slo).goodput or 0.0)

    def table(self) -> str:
        """TTFT and TPOT p50/p99 (ms) and goodput (req/s) of both, one row each."""
        lines = [f"{'':<22} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} {'TPOT p99':>9} "
                 f"{'goodput':>8}"]
        d = self.disaggregated
        rows = [(f"disagg {d.prefill_gpus}P+{d.decode_gpus}D", d.summary(self.slo)),
                (f"colocated x{len(self.colocated.replicas)}",
                 self.colocated.summary(self.slo))]
        for name, s in rows:
            lines.append(f"{name:<22} {s.ttft.p50 * 1e3:>9.1f} {s.ttft.p99 * 1e3:>9.1f} "
                         f"{s.tpot.p50 * 1e3:>9.2f} {s.tpot.p99 * 1e3:>9.2f} "
                         f"{s.goodput or 0.0:>8.2f}")
        return "\n".join(lines)
