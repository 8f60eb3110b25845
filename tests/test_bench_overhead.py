"""The overhead benchmark splits a step's time into its phases, and the phases add up.

No speed is asserted: what is asserted is how the time is split (each phase's time excludes the
phases it calls, so they sum to the whole generate) and what it counts (steps, operators).
"""

import argparse
import time

from minillm import default_model_path
from minillm.bench import __main__ as bench_cli
from minillm.bench import overhead


class Outer:
    def __init__(self, inner):
        self.inner = inner

    def run(self):
        return self.inner.run() + 1


class Inner:
    def run(self):
        time.sleep(0.05)
        return 1


def test_a_phase_excludes_the_time_of_the_phases_it_calls():
    timer, inner = overhead.PhaseTimer(), Inner()
    outer = Outer(inner)
    timer.wrap(inner, "run", "inner")
    timer.wrap(outer, "run", "outer")
    start = time.perf_counter()
    assert outer.run() == 2 and outer.run() == 2  # the wrapped methods still return
    total = time.perf_counter() - start
    assert timer.calls == {"inner": 2, "outer": 2}
    assert timer.seconds["inner"] >= 0.1  # both sleeps are the inner phase's ...
    assert timer.seconds["outer"] < timer.seconds["inner"] / 10  # ... not the outer's
    assert timer.seconds["inner"] + timer.seconds["outer"] <= total


def test_the_phases_of_a_run_add_up_to_its_steps_and_leave_the_engine_as_it_was(capsys):
    args = argparse.Namespace(model=default_model_path(), seats=[1, 3], prompt_len=8,
                              output_len=4, rounds=1, engine_requests=0, seed=0)
    figures = overhead.main(args)
    printed = capsys.readouterr().out
    for seats in (1, 3):
        f = figures["sync"][seats]
        # One step prefills every prompt and samples the first token, three more decode.
        assert f["steps"] == 4
        phases = sum(f[phase] for phase, _, _ in overhead.PHASES)
        assert 0.9 * f["step ms"] <= phases <= f["step ms"]
        assert f["forward"] > 0 and f["schedule"] > 0 and f["detokenize + stops"] > 0
        assert f["ops per forward"] > 6 * 10  # six layers of several operators each
        a = figures["async"][seats]
        # The asynchronous loop reads the last tokens in a step of its own, which launches none.
        assert a["steps"] == 5 and a["speedup"] > 0
    for phase, _, _ in overhead.PHASES:
        assert phase in printed
    assert "dispatch floor" in printed and "host's bookkeeping" in printed
    assert "tokens/s async / sync" in printed


def test_the_ratios_with_each_loop_are_measured_side_by_side(capsys):
    args = argparse.Namespace(model=default_model_path(), seats=[2], prompt_len=4,
                              output_len=2, rounds=1, engine_requests=4, seed=0)
    ratios = overhead.main(args)["ratios"]
    assert set(ratios) == {f"continuous {loop} / {other}" for loop in ("sync", "async")
                           for other in ("static", "transformers")}
    assert all(r.median > 0 and len(r.per_round) == 1 for r in ratios.values())
    assert "continuous async / transformers" in capsys.readouterr().out


def test_the_benchmark_unwraps_what_it_timed():
    from minillm.llm import LLM

    llm = LLM(default_model_path(), device="cpu", max_num_seqs=2)
    overhead.run_once(llm, 2, 4, 2, seed=0)
    for _, path, method in overhead.PHASES:
        assert method not in vars(overhead.owner(llm, path))
    assert llm.stats()["num_free_blocks"] == llm.stats()["num_blocks"]


def test_overhead_is_a_bench_command():
    assert bench_cli.COMMANDS["overhead"] is overhead
