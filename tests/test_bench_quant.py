"""python -m minillm.bench quant --quick: one table, a row per setting, every column filled."""

import re

import pytest

from minillm.bench.__main__ import main as bench_main
from minillm.bench.quant import COLUMNS, SETTINGS

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
    for name, (w, kv, pool, ppl, _, agree, tok_s, ratio) in rows.items():
        assert w > 0 and kv > 0 and pool > 0 and ppl > 1 and 0 < agree <= 100
        assert tok_s > 0 and ratio > 0, name
    fp32, int8_kv, int8_w = rows["fp32"], rows["int8 KV"], rows["int8 W"]
    assert fp32[5] == 100.0 and fp32[7] == 1.0  # the baseline agrees with itself, ratio 1
    assert abs(int8_kv[2] - 4 * fp32[2]) < 4 and int8_kv[1] == pytest.approx(fp32[1] / 4, abs=1e-3)
    assert int8_w[0] < fp32[0] / 2  # int8 projections, fp32 lm_head
    # (pool tokens: POOL_BYTES // bytes per token, so 4x up to the floor's rounding)
    assert re.search(r"perplexity over \d+ held-out tokens", out)
