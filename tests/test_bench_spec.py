"""python -m minillm.bench spec: one quick run prints every method's row with its counters,
and a speculation that changed a greedy token is an error, not a figure."""

import argparse

import pytest

from minillm.bench import spec
from minillm.bench.__main__ import main as bench_main

pytestmark = pytest.mark.ch10


def test_the_quick_run_prints_a_row_per_method_with_its_counters(capsys):
    assert bench_main(["spec", "--quick"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()
            if line.split()[:1] in (["quotes"], ["free"])]
    assert [(r[0], r[2]) for r in rows] == [(w, m) for w in ("quotes", "free")
                                            for m in spec.METHODS]
    for row in rows:
        assert row[1] == "2" and float(row[3]) > 0  # batch, tokens/s
        if row[2] != "plain":
            proposed, accepted, alpha = int(row[-5]), int(row[-4]), float(row[-3])
            assert proposed > 0 and 0 <= accepted <= proposed and 0 <= alpha <= 1
            assert 1 <= float(row[-2]) <= 1 + 4  # tokens per verification: 1 to 1 + k
    assert "same tokens as plain in every run: yes" in out


def test_prompts_are_passages_of_the_play_and_bare_speaker_names():
    quotes, names = spec.quote_prompts(3), spec.free_prompts(3)
    assert len(set(quotes)) == 3 and all(q.endswith("\n") and len(q) > 100 for q in quotes)
    assert all(n.endswith(".\n") and n.count("\n") == 1 for n in names)


def test_a_run_whose_tokens_changed_is_refused(monkeypatch):
    real = spec.make_llm

    def broken(method, k, seats):
        llm = real(method, k, seats)
        if method == "ngram":  # a speculating engine that emits other tokens
            generate = llm.generate

            def wrong(*args, **kwargs):
                outs = generate(*args, **kwargs)
                for o in outs:
                    o.token_ids = [t + 1 for t in o.token_ids]
                return outs
            llm.generate = wrong
        return llm

    monkeypatch.setattr(spec, "make_llm", broken)
    with pytest.raises(AssertionError, match="lossless"):
        spec.measure("free", 1, max_tokens=8, rounds=1, methods=("plain", "ngram"))


def test_without_the_draft_model_it_says_what_is_missing(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(spec, "default_draft_path", lambda: tmp_path / "missing")
    args = argparse.Namespace(quick=True, k=4, max_tokens=8, batches=[1], rounds=1)
    assert spec.main(args) == 2
    assert "draft model is missing" in capsys.readouterr().err
