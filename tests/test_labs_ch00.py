"""Chapter 00's graded exercises name the common wrong answers."""

from __future__ import annotations

import pytest

from minillm.labs import check


@pytest.mark.ch00
@pytest.mark.parametrize("wrong, hint", [
    (lambda m: (m.token_times[-1] - m.token_times[0]) / len(m.token_times), "n - 1"),
    (lambda m: m.e2e / len(m.token_times), "E2E"),
    (lambda m: (m.token_times[-1] - m.token_times[0]) / max(len(m.token_times) - 1, 1),
     "return None"),
])
def test_tpot_wrong_answers_are_named(wrong, hint: str, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    assert check("00.1", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch00
def test_blocks_needed_rounding_down_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert check("00.2", lambda n, p: n // p) is False
    assert "round up" in capsys.readouterr().out


def _serve_steps(num_steps):
    """A loop that steps a fixed number of times: misses requests that wait for a seat."""
    def serve(engine, prompts, params):
        ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        last = {}
        for _ in range(num_steps):
            for out in engine.step():
                last[out.request_id] = out
        return [last[i] for i in ids if i in last]
    return serve


def _serve_in_finish_order(engine, prompts, params):
    for p, sp in zip(prompts, params):
        engine.add_request(p, sp)
    done = []
    while engine.has_unfinished_requests():
        done += [out for out in engine.step() if out.finished]
    return done


def _serve_first_outputs(engine, prompts, params):
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    first = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            first.setdefault(out.request_id, out)
    return [first[i] for i in ids]


@pytest.mark.ch00
@pytest.mark.parametrize("wrong, hint", [
    (_serve_steps(8), "wait for a seat"),
    (_serve_in_finish_order, "prompt order"),
    (_serve_first_outputs, "last output"),
    (lambda engine, prompts, params: [], "add_request"),
])
def test_serve_wrong_answers_are_named(wrong, hint: str, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    assert check("00.3", wrong) is False
    assert hint in capsys.readouterr().out
