"""`python -m minillm.bench preempt` on a tiny squeeze: the table's rows and that its numbers
agree with each other. Speed is never asserted; the counts are (greedy runs are deterministic)."""

import argparse
import contextlib
import io
import re

import pytest

from minillm.bench import __main__ as bench_cli
from minillm.bench import preempt
from minillm.calc import machine

pytestmark = pytest.mark.ch09

ROW = re.compile(r"^(ample|recompute|swap)\s+(\d+)\s+(\d+)\s+(-?\d+)\s+(\d+)\s+(\d+)\s+"
                 r"([\d.]+)\s+([\d.]+)\s+([\d.]+)$")


def table(out: str) -> dict[str, dict[str, float]]:
    rows = {}
    for line in out.splitlines():
        if m := ROW.match(line):
            values = [float(v) for v in m.groups()[1:]]
            rows[m[1]] = dict(zip(("blocks", "preemptions", "extra", "recomputed", "bytes",
                                   "itl_p99_ms", "tok_s", "tok_s_cpu"), values))
    return rows


@pytest.fixture(scope="module")
def run() -> tuple[int, str]:
    """One tiny run for the whole module (capsys is per test, so stdout is caught here)."""
    buffer = io.StringIO()
    parser = argparse.ArgumentParser()
    preempt.add_arguments(parser)
    args = parser.parse_args(["--num-requests", "6", "--prompt-len", "48", "--output-len", "24",
                              "--rounds", "2"])
    with contextlib.redirect_stdout(buffer):  # preempt.main: leaves torch's threads as they are
        code = preempt.main(args)
    return code, buffer.getvalue()


def test_the_table_has_one_row_per_run_and_the_ratios(run):
    code, out = run
    assert code == 0, out
    assert set(table(out)) == {"ample", "recompute", "swap"}
    assert re.search(r"^swap/recompute\s", out, re.M)
    assert "tokens identical under recompute, swap and no preemption: yes" in out
    assert re.search(r"swap / recompute throughput: [\d.]+ median of 2 rounds", out)


def test_recompute_computes_extra_tokens_and_swap_moves_bytes(run):
    _, out = run
    rows = table(out)
    ample, rec, swap = rows["ample"], rows["recompute"], rows["swap"]
    assert ample["preemptions"] == ample["extra"] == ample["bytes"] == 0
    assert rec["blocks"] == swap["blocks"] < ample["blocks"]
    assert rec["preemptions"] > 0 and swap["preemptions"] > 0
    # Recompute: every thrown-away token is computed again, nothing crosses to the host pool.
    assert rec["bytes"] == 0
    assert rec["extra"] == rec["recomputed"] > 0
    # Swap: nothing is computed twice; each victim's blocks go out and come back.
    assert swap["extra"] == swap["recomputed"] == 0
    assert swap["bytes"] > 0
    assert rec["extra"] > swap["extra"]
    # Whole blocks move: fp32 K/V of the shipped model is 2 * 6 layers * 2 heads * 32 dims *
    # 4 bytes = 3,072 bytes a token, 49,152 a 16-token block, out and back.
    assert swap["bytes"] % (2 * 49_152) == 0
    assert all(r["tok_s"] > 0 and r["itl_p99_ms"] > 0 for r in rows.values())


def test_the_gpu_side_is_labelled_modelled(run):
    _, out = run
    modelled = [line for line in out.splitlines() if line.endswith("(modelled)")]
    assert len(modelled) == len(preempt.MODELLED)
    assert any("swap wins at every length" in line for line in modelled)
    assert any(re.search(r"\d+ tokens", line) for line in modelled)


def test_a_token_mismatch_fails_loudly():
    runs = {name: {"tokens": [[1, 2, 3]]} for name in preempt.RUNS}
    assert preempt.check_identical([runs]) is None
    runs["swap"] = {"tokens": [[1, 2, 4]]}
    problem = preempt.check_identical([runs])
    assert problem is not None and "swap" in problem and "token 2" in problem


def test_the_bench_settles_threads_first(monkeypatch):
    order = []
    monkeypatch.setattr(machine, "settle_threads", lambda: order.append("settle") or 1)
    monkeypatch.setattr(preempt, "main", lambda args: order.append("preempt") or 0)
    assert bench_cli.main(["preempt", "--quick"]) == 0
    assert order == ["settle", "preempt"]


def test_every_modelled_pair_fits_its_gpu() -> None:
    from minillm.calc.preemption import fits

    assert all(fits(model, hw) for _, model, hw in preempt.MODELLED)
