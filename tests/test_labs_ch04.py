"""Chapter 04's graded exercises name the common wrong answers."""

from __future__ import annotations

import pytest

from minillm.labs import check


def ceil_blocks(n: int, P: int) -> int:
    return -(-n // P)


def contiguous(c: list[int], r: int) -> float:
    return 1 - sum(c) / (r * len(c))


def paged(c: list[int], P: int) -> float:
    return 1 - sum(c) / sum(ceil_blocks(n, P) * P for n in c)


@pytest.mark.ch04
@pytest.mark.parametrize("wrong, hint", [
    (lambda p, t, P: p, "look up its logical block"),
    (lambda p, t, P: t[p // P] + p % P, "multiply the physical block id by block_size"),
    (lambda p, t, P: t[p // P] * P, "add the offset"),
    (lambda p, t, P: t[p % P] * P + p // P, "you swapped them"),
    (lambda p, t, P: t[p // P] * P + p % P + 1, "off by one"),
])
def test_slot_of_wrong_answers_are_named(wrong, hint: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert check("04.1", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch04
def test_slot_of_is_checked_against_the_engines_batch(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    # Right on the fixed cases (all with block_size >= 4 and tables of >= 1 entry), wrong for
    # the last logical block of a longer table: only the engine's own step catches it.
    def almost(p: int, t: list[int], P: int) -> int:
        return (t[p // P] if p // P < 3 else t[-1]) * P + p % P

    assert check("04.1", almost) is False
    assert "build_batch" in capsys.readouterr().out


@pytest.mark.ch04
@pytest.mark.parametrize("wrong, hint", [
    (lambda c, P, r: (1 - sum(c) / sum(n // P * P for n in c), contiguous(c, r)), "ceil(n"),
    (lambda c, P, r: (1 - sum(c) / sum((n // P + 1) * P for n in c), contiguous(c, r)),
     "not n // P + 1"),
    (lambda c, P, r: (sum(1 - n / (ceil_blocks(n, P) * P) for n in c) / len(c),
                      contiguous(c, r)), "pool the counts"),
    (lambda c, P, r: (1 - paged(c, P), 1 - contiguous(c, r)), "not the used fraction"),
    (lambda c, P, r: (sum(ceil_blocks(n, P) * P - n for n in c) / sum(c), contiguous(c, r)),
     "not of the tokens"),
    (lambda c, P, r: (contiguous(c, r), paged(c, P)), "in that order"),
])
def test_kv_waste_wrong_answers_are_named(wrong, hint: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert check("04.2", wrong) is False
    assert hint in capsys.readouterr().out


def allocator(blocks_for, take_first=True, remove=True, all_or_nothing=True, count_all=False):
    """grow_table variants: blocks_for(n, P, table) -> blocks to add."""
    def grow_table(table: list[int], n: int, P: int, free: list[int]) -> bool:
        add = max(blocks_for(n, P, table), 0)
        short = (ceil_blocks(n, P) if count_all else add) > len(free)
        if short and all_or_nothing:
            return False
        for i in range(min(add, len(free))):
            table.append(free.pop(0) if remove else free[i])
        return not short
    return grow_table


def missing(n: int, P: int, table: list[int]) -> int:
    return ceil_blocks(n, P) - len(table)


@pytest.mark.ch04
@pytest.mark.parametrize("wrong, hint", [
    (allocator(lambda n, P, t: n // P - len(t)), "a partly filled block is still a block"),
    (allocator(lambda n, P, t: n // P + 1 - len(t)), "needs k blocks"),
    (allocator(lambda n, P, t: ceil_blocks(n, P)), "add only the missing ones"),
    (allocator(missing, remove=False), "remove the blocks you take"),
    (allocator(missing, all_or_nothing=False), "all or nothing"),
    (allocator(missing, count_all=True), "count the blocks the table still needs"),
])
def test_grow_table_wrong_answers_are_named(wrong, hint: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert check("04.3", wrong) is False
    assert hint in capsys.readouterr().out


@pytest.mark.ch04
def test_grow_table_is_checked_inside_the_engine(capsys: pytest.CaptureFixture[str]) -> None:
    # Right on the small fixed cases; with a big free list it hands out block 0 again, which
    # only the run through the engine's BlockManager can catch.
    def reuses_block_zero(table: list[int], n: int, P: int, free: list[int]) -> bool:
        add = ceil_blocks(n, P) - len(table)
        if add > len(free):
            return False
        for _ in range(max(add, 0)):
            table.append(0 if len(free) > 10 and 0 not in table else free.pop(0))
        return True

    assert check("04.3", reuses_block_zero) is False
    assert "two requests would write into one block" in capsys.readouterr().out


@pytest.mark.ch04
def test_the_open_ended_exercise_has_a_model_answer_and_a_rubric() -> None:
    from minillm.labs.solutions.ch04 import MODEL_ANSWERS

    assert sorted(MODEL_ANSWERS) == ["04.4"]
    assert "Rubric" in MODEL_ANSWERS["04.4"] and "| 16 | 2.3% | 20.5 |" in MODEL_ANSWERS["04.4"]
