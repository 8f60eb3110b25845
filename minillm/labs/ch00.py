"""Graded exercises of chapter 00 (a tour of minillm).

00.3 runs the reader's step loop on a real engine (the shipped model, two seats) and compares
every token, the order of the outputs and the freed KV pool with what LLM.generate gives.
"""

from __future__ import annotations

from typing import Any

from minillm.labs.exercise import Exercise, close, expect_callable
from minillm.metrics import RequestMetrics


def metrics_with(token_times: list[float], arrival: float = 0.0) -> RequestMetrics:
    """A finished request's timestamps (seconds) as the engine records them."""
    return RequestMetrics(arrival_time=arrival, first_scheduled_time=arrival,
                          first_token_time=token_times[0] if token_times else None,
                          finished_time=token_times[-1] if token_times else None,
                          token_times=list(token_times))


def grade_tpot(tpot: Any) -> str:
    expect_callable(tpot, "tpot(metrics) -> float | None")
    m = metrics_with([0.50, 0.60, 0.75, 0.85, 1.10], arrival=0.20)  # TTFT 0.3 s, E2E 0.9 s
    got = tpot(m)
    assert got is not None, "tpot returned None for a request with 5 output tokens"
    assert isinstance(got, (int, float)), f"tpot should return seconds (a float), got {got!r}"
    n, want = 5, (1.10 - 0.50) / 4
    assert not close(got, (1.10 - 0.20) / n), (
        "you divided E2E by n: TPOT leaves out the first token, which TTFT already counts")
    assert not close(got, (1.10 - 0.50) / n), (
        "you divided by n: n tokens have n - 1 gaps between them, so divide by n - 1")
    assert close(got, want), (
        f"for token_times {m.token_times} (arrival {m.arrival_time}) TPOT is "
        f"{want:.4f} s, you returned {got!r}")
    single = tpot(metrics_with([0.4], arrival=0.1))
    assert single is None, (
        f"with a single output token there is no 'time per output token': return None, "
        f"not {single!r}")
    return f"TPOT = (E2E - TTFT) / (n - 1) = {want * 1000:.1f} ms for that request"


def grade_blocks_needed(blocks_needed: Any) -> str:
    expect_callable(blocks_needed, "blocks_needed(num_tokens, block_size) -> int")
    cases = [(1, 16, 1), (16, 16, 1), (17, 16, 2), (100, 16, 7), (5, 1, 5), (0, 16, 0)]
    for num_tokens, block_size, want in cases:
        got = blocks_needed(num_tokens, block_size)
        assert got is not None, "blocks_needed returned None"
        assert got == want, (
            f"{num_tokens} tokens in blocks of {block_size} need {want} blocks, you returned "
            f"{got!r}" + (" (round up: a partly filled block is still a whole block)"
                          if got == num_tokens // block_size else ""))
    return "a sequence holds ceil(tokens / block_size) blocks; only its last one is partly empty"


SERVE_SEATS, SERVE_BLOCKS = 2, 32
SERVE_PROMPTS = [[1 + (5 * i + 3 * j) % 3000 for j in range(n)]
                 for i, n in enumerate([9, 30, 4, 17, 12, 25])]
SERVE_MAX_TOKENS = [6, 3, 8, 2, 5, 4]  # different lengths: requests finish out of prompt order


def _serve_engine() -> Any:
    from minillm import LLM

    return LLM(max_num_seqs=SERVE_SEATS, num_kv_blocks=SERVE_BLOCKS, device="cpu")


def _serve_params() -> list[Any]:
    from minillm import SamplingParams

    return [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
            for n in SERVE_MAX_TOKENS]


def _check_served(got: Any, want: list[Any], llm: Any, num_steps: int) -> None:
    n = len(want)
    assert got is not None, "serve returned None: return a list of RequestOutput, one per prompt"
    assert isinstance(got, (list, tuple)), f"return a list of RequestOutput, got {type(got)!r}"
    assert not llm.engine.has_unfinished_requests(), (
        f"your loop returned while requests were still unfinished: with {SERVE_SEATS} seats, "
        "requests wait for a seat, so serving them takes more steps than max_tokens; step until "
        "engine.has_unfinished_requests() is False")
    assert len(got) == n, (
        f"{n} prompts went in and {len(got)} outputs came back: return one output per prompt"
        + (" (did you add every request with engine.add_request before stepping?)"
           if len(got) == 0 else ""))
    for i, out in enumerate(got):
        assert hasattr(out, "token_ids") and hasattr(out, "finished"), (
            f"output {i} is a {type(out).__name__}, not a RequestOutput (engine.step() returns "
            "RequestOutput objects)")
    unfinished = [i for i, out in enumerate(got) if not out.finished]
    assert not unfinished, (
        f"outputs {unfinished} are not finished: keep the last output of each request, and step "
        f"until engine.has_unfinished_requests() is False (with {SERVE_SEATS} seats, requests "
        "wait for a seat, so serving them takes more steps than max_tokens)")
    tokens = [list(o.token_ids) for o in got]
    wanted = [list(w.token_ids) for w in want]
    for i, (g, w) in enumerate(zip(tokens, wanted)):
        if g == w:
            continue
        if g in wanted:
            raise AssertionError(
                f"output {i} holds the tokens of prompt {wanted.index(g)}: return the outputs in "
                "prompt order, not in the order requests finished (match them by request_id)")
        raise AssertionError(f"prompt {i}: generate gives {w}, your loop gave {g}")
    free = llm.stats()["num_free_blocks"]
    assert free == SERVE_BLOCKS, f"after serving, {SERVE_BLOCKS - free} KV blocks are still held"
    assert len(llm.trace) == num_steps, (
        f"your loop ran {len(llm.trace)} engine steps where generate runs {num_steps}: call "
        "engine.step() only while engine.has_unfinished_requests()")


def grade_serve(serve: Any) -> str:
    expect_callable(serve, "serve(engine, prompts, params) -> list of RequestOutput")
    import torch

    from minillm.calc import machine

    threads = torch.get_num_threads()
    machine.settle_threads()
    try:
        reference = _serve_engine()
        want = reference.generate(SERVE_PROMPTS, _serve_params(), use_tqdm=False)
        llm = _serve_engine()
        got = serve(llm.engine, [list(p) for p in SERVE_PROMPTS], _serve_params())
        _check_served(got, want, llm, len(reference.trace))
    finally:
        torch.set_num_threads(threads)
    return (f"your loop served {len(SERVE_PROMPTS)} requests through {SERVE_SEATS} seats in "
            f"{len(llm.trace)} engine steps, token for token as generate, and freed every block")


EXERCISES = [
    Exercise("00.1", "TPOT from a request's timestamps",
             "Write tpot(metrics) -> seconds per output token after the first, from "
             "metrics.token_times; None with fewer than two tokens.", grade_tpot),
    Exercise("00.2", "KV blocks a sequence needs",
             "Write blocks_needed(num_tokens, block_size) -> the number of KV blocks a "
             "sequence of num_tokens tokens occupies.", grade_blocks_needed),
    Exercise("00.3", "The step loop of generate",
             "Write serve(engine, prompts, params) -> one finished RequestOutput per prompt, in "
             "prompt order, by adding the requests and calling engine.step() until all finish.",
             grade_serve),
]
