"""GET /metrics: the engine's state and request latencies in Prometheus text, under vLLM's names.

The names are vLLM V1's, so a Grafana dashboard or a script written for vLLM reads minillm too.
Counters get Prometheus' `_total` suffix on the wire (vllm:num_preemptions_total). Latencies are
the server's view (from the request's arrival at the server), which a benchmark client's view
adds network and HTTP time to. Each server has its own registry, so several can share a process.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from minillm.request import RequestOutput
from minillm.serve.engine_client import EngineClient

disable_created_metrics()  # no `_created` twin of every counter, as vLLM does

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                   1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class ServerMetrics:
    """Updated after every step (the EngineClient's on_step), from the engine's counters as of
    that step (EngineClient.stats)."""

    def __init__(self, engine: EngineClient, model_name: str):
        self.engine = engine
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name}

        def make(kind, name, doc, **kw):
            metric = kind(name, doc, list(labels), registry=self.registry, **kw)
            return metric.labels(**labels)

        self.running = make(Gauge, "vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = make(Gauge, "vllm:num_requests_waiting", "Requests waiting to be admitted.")
        self.swapped = make(Gauge, "vllm:num_requests_swapped",
                            "Preempted requests whose KV wait in host memory (swap).")
        self.kv_usage = make(Gauge, "vllm:kv_cache_usage_perc",
                             "Fraction of KV-cache blocks in use (1 = full).")
        self.prefix_queries = make(Counter, "vllm:prefix_cache_queries",
                                   "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = make(Counter, "vllm:prefix_cache_hits",
                                "Prompt tokens whose KV the prefix cache held.")
        self.preemptions = make(Counter, "vllm:num_preemptions",
                                "Requests preempted (their KV recomputed or swapped).")
        # Speculative decoding's counters, present when the engine speculates (as in vLLM).
        self.spec_counters = [
            (make(Counter, f"vllm:{key}", doc), key) for key, doc in (
                ("spec_decode_num_drafts", "Verifications of proposed tokens."),
                ("spec_decode_num_draft_tokens", "Tokens proposed."),
                ("spec_decode_num_accepted_tokens", "Proposed tokens the target accepted."))
        ] if engine.speculative else []
        self.prompt_tokens = make(Counter, "vllm:prompt_tokens", "Prompt tokens prefilled.")
        self.generation_tokens = make(Counter, "vllm:generation_tokens", "Tokens generated.")
        self.ttft = make(Histogram, "vllm:time_to_first_token_seconds",
                         "Arrival at the server to the first token.", buckets=LATENCY_BUCKETS)
        self.itl = make(Histogram, "vllm:inter_token_latency_seconds",
                        "Gap between consecutive tokens of a request.", buckets=LATENCY_BUCKETS)
        self.e2e = make(Histogram, "vllm:e2e_request_latency_seconds",
                        "Arrival at the server to the last token.", buckets=LATENCY_BUCKETS)
        self.queue = make(Histogram, "vllm:request_queue_time_seconds",
                          "Arrival to the first step that ran the request.",
                          buckets=LATENCY_BUCKETS)
        self._stats = engine.stats()
        self.refresh()

    def refresh(self) -> None:
        """Gauges and counters from the engine's stats (counters advance by the difference)."""
        stats = self.engine.stats()
        self.running.set(stats["num_running"])
        self.waiting.set(stats["num_waiting"])
        self.swapped.set(stats["num_swapped"])
        self.kv_usage.set(1.0 - stats["num_free_blocks"] / stats["num_blocks"])
        for counter, key in ((self.prefix_queries, "prefix_cache_query_tokens"),
                             (self.prefix_hits, "prefix_cache_hit_tokens"),
                             (self.preemptions, "num_preemptions"),  # vLLM counts tokens too
                             *self.spec_counters):
            counter.inc(max(stats[key] - self._stats[key], 0))
        self._stats = stats

    def on_step(self, outputs: list[RequestOutput]) -> None:
        """The step's tokens of each output (one; more under speculative decoding, which all
        carry the step's time): their latencies go to the histograms."""
        self.refresh()
        for out in outputs:
            if out.finish_reason == "error":  # it failed in this step: no token came of it
                continue
            m = out.metrics
            times = m.token_times
            new = 1
            while new < len(times) and times[-1 - new] == times[-1]:
                new += 1
            self.generation_tokens.inc(new)
            for i in range(len(times) - new, len(times)):
                if i == 0:  # the request's first token
                    self.prompt_tokens.inc(len(out.prompt_token_ids))
                    self.ttft.observe(m.ttft or 0.0)
                    self.queue.observe(m.queue_time or 0.0)
                else:
                    self.itl.observe(times[i] - times[i - 1])
            if out.finished and m.e2e is not None:
                self.e2e.observe(m.e2e)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
