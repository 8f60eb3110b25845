"""The engine benchmark runs end to end on a small workload and reports its ratios.

Speed itself is never asserted here: the benchmark prints ratios measured side by side.
"""

import argparse

from minillm import default_model_path
from minillm.bench import engine as bench_engine


def test_heavy_tailed_workload_is_seeded_and_heavy_tailed():
    reqs = bench_engine.heavy_tailed_workload(200, vocab_size=100, seed=3)
    assert reqs == bench_engine.heavy_tailed_workload(200, vocab_size=100, seed=3)
    long = [r for r in reqs if r.max_tokens >= 192]
    assert 10 <= len(long) <= 50  # about 15% long
    assert all(16 <= len(r.prompt_token_ids) <= 64 for r in reqs)
    assert all(0 <= t < 100 for r in reqs for t in r.prompt_token_ids)


def test_engine_benchmark_reports_ratios(capsys):
    args = argparse.Namespace(model=default_model_path(), num_requests=6, batch_size=3, seed=0)
    ratios = bench_engine.main(args)
    out = capsys.readouterr().out
    assert set(ratios) == {"continuous / static", "continuous / transformers"}
    assert all(r > 0 for r in ratios.values())
    assert "tokens/s" in out and "continuous / static" in out

