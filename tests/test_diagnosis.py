"""minillm.diagnosis: seeded mystery deployments show their cause and hide the knobs."""

from __future__ import annotations

import math

import pytest

from minillm.metrics import percentile
from minillm.plan import diagnosis
from minillm.plan.diagnosis import CAUSES, mystery_deployment, mystery_deployments, student_seeds


@pytest.fixture(scope="module")
def one_of_each() -> dict[str, diagnosis.Deployment]:
    return {cause: mystery_deployment(1, cause) for cause in CAUSES}


def test_each_student_gets_their_own_deployments_with_every_cause() -> None:
    ada, bob = student_seeds("Ada Lovelace", 14), student_seeds("Bob", 14)
    assert ada == student_seeds(" ada lovelace ", 14), "the same student, the same set"
    assert [s for s, _ in ada] != [s for s, _ in bob]
    assert [c for _, c in ada] != [c for _, c in bob]
    for seeds in (ada, bob):
        assert sorted(c for _, c in seeds[:7]) == sorted(CAUSES)
        assert sorted(c for _, c in seeds[7:]) == sorted(CAUSES)


def test_the_same_student_gets_the_same_deployments() -> None:
    first, again = mystery_deployments("Grace", 2), mystery_deployments("Grace", 2)
    assert [d.name for d in first] == [d.name for d in again]
    assert [d.summary() for d in first] == [d.summary() for d in again]
    other = mystery_deployments("Linus", 2)
    assert {d.name for d in first}.isdisjoint(d.name for d in other)


def test_a_seed_draws_a_cause_and_always_the_same_deployment() -> None:
    a, b = mystery_deployment(3), mystery_deployment(3)
    assert a._cause in CAUSES and a == b
    assert mystery_deployment(3, a._cause) == a, "naming the drawn cause changes nothing"


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="unknown cause 'oom'"):
        mystery_deployment(2, "oom")
    with pytest.raises(ValueError, match="non-empty name"):
        student_seeds(" ", 3)
    with pytest.raises(ValueError, match="positive number of deployments, got 0"):
        student_seeds("Ada", 0)


def test_the_knobs_and_the_cause_stay_hidden(one_of_each: dict[str, diagnosis.Deployment]
                                            ) -> None:
    for cause, d in one_of_each.items():
        assert set(d.stats()) == set(diagnosis.VISIBLE_STATS), "no prefix-cache counters"
        assert not hasattr(d, "config") and cause not in repr(d) and cause not in d.name
        assert len(d.prompts) == len(d.metrics) == len(set(e.request_id for step in d.trace
                                                           for e in step.scheduled))
        assert all(len(p) > 1 and len(set(p)) > 1 for p in d.prompts), "real ids, no filler"


def test_each_cause_shows_its_sign(one_of_each: dict[str, diagnosis.Deployment]) -> None:
    def prefill(d: diagnosis.Deployment) -> int:
        return sum(e.num_tokens for s in d.trace for e in s.scheduled if e.phase == "prefill")

    def largest_step(d: diagnosis.Deployment) -> int:
        return max(step.num_tokens for step in d.trace)

    def queued(d: diagnosis.Deployment) -> float:
        return percentile([m.queue_time for m in d.metrics], 90)

    d = one_of_each
    assert d["kv_pressure"].stats()["num_preemptions"] > 20
    assert all(x.stats()["num_preemptions"] == 0 for c, x in d.items() if c != "kv_pressure")
    assert largest_step(d["long_prefill_blocking"]) > 6000
    assert all(largest_step(x) <= 2048 for c, x in d.items() if c != "long_prefill_blocking")
    assert max(len(s.scheduled) for s in d["memory_bound_small_batch"].trace) <= 8
    assert queued(d["memory_bound_small_batch"]) > 0.5 and queued(d["static_batching"]) > 0.5
    assert queued(d["healthy"]) < 0.1
    assert d["batch_too_large"].summary().tpot.p99 > 1.3 * diagnosis.SLO["tpot"]
    assert d["healthy"].summary().tpot.p99 < diagnosis.SLO["tpot"]
    nocache = d["no_prefix_caching"]
    assert diagnosis.share_of_prompt_shared(nocache) > 0.9
    assert prefill(nocache) == nocache.prompt_tokens


def test_score_pairs_answers_with_causes(one_of_each: dict[str, diagnosis.Deployment]) -> None:
    rows = diagnosis.score(lambda d: "healthy", list(one_of_each.values()))
    assert [(answer, cause) for _, answer, cause in rows] == [("healthy", c) for c in CAUSES]


def test_the_dashboard_shows_the_signs_and_hides_the_cache(
        one_of_each: dict[str, diagnosis.Deployment]) -> None:
    boards = {cause: d.dashboard() for cause, d in one_of_each.items()}
    for cause, board in boards.items():
        assert math.isnan(board.prefix_hit_rate), f"{cause}: the cache's counters stay hidden"
        assert board.num_requests == len(one_of_each[cause].metrics)
    # Only a pool that runs dry preempts, and it runs full first (measured: 374/min, 100%).
    storm = boards["kv_pressure"]
    assert storm.preemptions_per_min > 100 and storm.kv_usage_peak >= 0.99
    assert all(b.preemptions_per_min == 0 and b.kv_usage_peak < 0.95
               for c, b in boards.items() if c != "kv_pressure")
    # GPU-Util reads ~100% on every deployment, sick or healthy: it tells none of them apart.
    assert all(b.gpu_util > 0.95 for b in boards.values())
    small = boards["memory_bound_small_batch"]
    assert small.dram_active > 0.9 and small.tensor_active < 0.1 and small.waiting_mean > 10
    assert boards["long_prefill_blocking"].stall_p99 > 3 * boards["healthy"].stall_p99
