"""Chapter 02's graded exercises name the common wrong answers."""

from __future__ import annotations

import pytest

from minillm.labs import check


@pytest.mark.ch02
@pytest.mark.parametrize("wrong, hint", [
    (lambda t, g: t / g, "units"),
    (lambda t, g: g * 1e9 / (t * 1e12), "inverted"),
    (lambda t, g: g / t, "inverted"),
    (lambda t, g: t * 1e12 * g * 1e9, "don't multiply"),
    (lambda t, g: 2 * t * 1e12 / (g * 1e9), "double or halve"),
])
def test_datasheet_ridge_wrong_answers_are_named(wrong, hint: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert check("02.1", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch02
@pytest.mark.parametrize("wrong, hint", [
    (lambda f, b, p, w: f / p + b / w, "don't add"),
    (lambda f, b, p, w: min(f / p, b / w), "not the min"),
    (lambda f, b, p, w: max(p / f, w / b), "work / rate"),
    (lambda f, b, p, w: f / p, "only the FLOPs"),
    (lambda f, b, p, w: b / w, "only the bytes"),
])
def test_roofline_time_wrong_answers_are_named(wrong, hint: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert check("02.2", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch02
def test_roofline_time_runs_as_the_simulators_clock(capsys: pytest.CaptureFixture[str]) -> None:
    """An answer right on the formula cases but adding the two times elsewhere is caught when
    it prices the simulator's steps, with the request it got wrong."""
    from minillm.labs.ch02 import STEPS

    known = {(f, m, p, b) for _, f, m, p, b in STEPS}

    def right_only_on_the_cases(f: float, m: float, p: float, b: float) -> float:
        return max(f / p, m / b) if (f, m, p, b) in known else f / p + m / b

    assert check("02.2", right_only_on_the_cases) is False
    assert "in the simulator with your roofline_time as its clock" in capsys.readouterr().out


def kv_numbers(c) -> int:  # noqa: ANN001
    return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim


@pytest.mark.ch02
@pytest.mark.parametrize("wrong, hint", [
    (lambda c, e, b: (c.num_params * len(e) + kv_numbers(c) * sum(n + s for n, s in e)) * b,
     "shared by the whole batch"),
    (lambda c, e, b: (c.num_params + kv_numbers(c) * sum(s for n, s in e)) * b,
     "writes for its new tokens"),
    (lambda c, e, b: (c.num_params + kv_numbers(c) * sum(n for n, s in e)) * b,
     "over its whole context"),
    (lambda c, e, b: c.num_params * b, "count the KV cache too"),
    (lambda c, e, b: (c.num_params + kv_numbers(c) // 2 * sum(n + s for n, s in e)) * b,
     "two tensors"),
    (lambda c, e, b: (c.num_params + kv_numbers(c) * c.num_attention_heads
                      // c.num_key_value_heads * sum(n + s for n, s in e)) * b,
     "per KV head"),
    (lambda c, e, b: c.num_params * b + kv_numbers(c) * sum(n + s for n, s in e),
     "KV numbers take dtype_bytes"),
])
def test_step_bytes_wrong_answers_are_named(wrong, hint: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert check("02.3", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch02
def test_step_bytes_is_checked_against_a_real_engine_run(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """Right on the hand cases, wrong for the chunk sizes a real run schedules: caught on the
    engine's own steps."""
    from minillm.labs.solutions.ch02 import step_bytes

    def wrong_for_odd_chunks(c, e, b):  # noqa: ANN001, ANN202
        return step_bytes(c, e, b) + sum(n == 48 for n, _ in e)

    assert check("02.3", wrong_for_odd_chunks) is False
    assert "of a real engine run scheduled" in capsys.readouterr().out
