"""python -m minillm.bench quant --quick: one table, a row per setting, every column filled."""

import math
import re

import pytest

from minillm import default_model_path
from minillm.bench.__main__ import main as bench_main
from minillm.bench.quant import COLUMNS, POOL_BYTES, SETTINGS
from minillm.model_config import ModelConfig

pytestmark = pytest.mark.ch10


def test_bench_quant_quick_prints_every_setting_side_by_side(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["quant", "--quick"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("setting"))
    assert lines[header].split() == " ".join(COLUMNS).split()
    rows = {}
    for line in lines[header + 1:header + 1 + len(SETTINGS)]:
        name = next(s.name for s in sorted(SETTINGS, key=lambda s: -len(s.name))
                    if line.startswith(s.name))
        rows[name] = [float(x.replace(",", "")) for x in line[len(name):].split()]
    assert list(rows) == [s.name for s in SETTINGS]
    # The byte columns, worked out by hand from the shipped model's shape: every projection of
    # every layer, plus the lm_head (tied to the embedding, fp32 in every setting), read once.
    c = ModelConfig.from_pretrained(default_model_path())
    E, F, L, V = c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    # (out, in) of q, k, v, o, gate, up and down
    shapes = [(q, E), (kv, E), (kv, E), (E, q), (F, E), (F, E), (E, F)]
    weights = L * sum(o * i for o, i in shapes)
    channels = L * sum(o for o, _ in shapes)  # int8: one fp32 scale per output channel
    fp32_w, int8_w = 4 * (weights + V * E), weights + 4 * channels + 4 * V * E
    kv_token = {4: 2 * L * kv * 4, 1: 2 * L * kv * 1}  # bytes per token: K and V of every layer
    for s in SETTINGS:
        w, kv_mb, pool, ppl, d_nats, agree, _, ratio = rows[s.name]
        bytes_per = 1 if s.kv_cache_dtype in ("int8", "fp8") else 4
        assert w == pytest.approx((int8_w if s.quantization else fp32_w) / 1e6, abs=1e-3), s.name
        assert kv_mb == pytest.approx(4 * 256 * kv_token[bytes_per] / 1e6, abs=1e-3), s.name
        assert pool == POOL_BYTES // kv_token[bytes_per], s.name
        # Quantization that works barely moves the model: a wrong scale or a misread K/V shows
        # as a perplexity change of whole nats and an agreement near chance.
        assert abs(d_nats) < 0.05 and agree >= 90, s.name
        assert ppl == pytest.approx(rows["fp32"][3] * math.exp(d_nats), rel=2e-3), s.name
    assert rows["fp32"][5] == 100.0 and rows["fp32"][7] == 1.0  # the baseline against itself
    assert rows["int8 W"][1] == rows["fp32"][1]  # int8 weights leave the K/V alone
    assert re.search(r"perplexity over \d+ held-out tokens", out)
    assert re.search(r"tok/s: 32 tokens decoded, median of 1 interleaved round", out)
