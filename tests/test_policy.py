"""The policy's decision for a batch that does not simply fit (chunk, wait or fail), pure and property-tested."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiocubie._errors import InsufficientMemoryError, PlanningError
from aiocubie._options import Policy
from aiocubie._planner import ChunkPlan
from aiocubie._policy import Totals, Wait, check_under_cap, decide, longest_head, waits_on_itself

TOTALS = st.builds(
    lambda runs, fixed, per_run, copies: Totals(runs, fixed, per_run, per_run * copies),
    st.integers(1, 10_000),
    st.integers(0, 1 << 20),
    st.integers(1, 1 << 12),
    st.integers(1, 3),
)


def now(totals: Totals, offered: int) -> ChunkPlan | None:
    """The plan the scheduler hands the decision: the plan against ``offered``, None if nothing fits."""
    try:
        return totals.plan(offered)
    except PlanningError:
        return None


def decided(totals: Totals, offered: int, policy: Policy, passive: bool, empty: int) -> ChunkPlan | Wait:
    return decide(
        now(totals, offered),
        totals,
        offered=offered,
        policy=policy,
        passive=passive,
        if_empty=lambda: empty,
        group="g",
    )


@given(TOTALS, st.integers(0, 1 << 26), st.integers(0, 1 << 26), st.sampled_from(Policy), st.booleans())
def test_a_decision_is_a_plan_within_the_offer_a_wait_or_an_error(
    totals: Totals, offered: int, more: int, policy: Policy, passive: bool
) -> None:
    empty = offered + more  # releasing memory never offers less
    try:
        result = decided(totals, offered, policy, passive, empty)
    except PlanningError as exc:
        if str(exc).startswith("policy 'fail'"):
            assert policy is Policy.FAIL and not passive  # fail refuses only what does not fit whole, in active mode
            plan = now(totals, offered)
            assert plan is None or plan.chunks > 1
        else:  # the planner's own error: nothing fits now (chunk, fail) or even once memory is released (wait)
            assert now(totals, empty if policy is Policy.WAIT else offered) is None
        return
    if isinstance(result, Wait):
        assert policy is Policy.WAIT  # only wait waits
        assert result.offered == empty and result.best == totals.plan(empty)
        plan = now(totals, offered)
        assert plan is None or plan.planned_bytes < result.best.planned_bytes
        return
    assert result.planned_bytes <= offered  # what is taken now fits what is offered now
    if policy is Policy.FAIL and not passive:
        assert result.chunks == 1
    if policy is Policy.WAIT:
        assert result.chunks == 1 or result.planned_bytes >= totals.plan(empty).planned_bytes


@given(TOTALS, st.integers(0, 1 << 26), st.booleans())
def test_chunk_takes_the_plan_there_is(totals: Totals, offered: int, passive: bool) -> None:
    plan = now(totals, offered)
    if plan is None:
        with pytest.raises(PlanningError):
            decided(totals, offered, Policy.CHUNK, passive, offered)
    else:
        assert decided(totals, offered, Policy.CHUNK, passive, 1 << 40) == plan


def test_the_empty_offer_is_read_only_under_wait() -> None:
    totals = Totals(100, 0, 8, 8)

    def if_empty() -> int:
        raise AssertionError("the empty offer was read")

    chunked = decide(
        totals.plan(400), totals, offered=400, policy=Policy.CHUNK, passive=False, if_empty=if_empty, group="g"
    )
    assert isinstance(chunked, ChunkPlan) and chunked.chunks == 2
    with pytest.raises(InsufficientMemoryError, match="policy 'fail'"):
        decide(totals.plan(400), totals, offered=400, policy=Policy.FAIL, passive=False, if_empty=if_empty, group="g")


def test_fail_names_the_group_and_the_bytes() -> None:
    totals = Totals(100, 0, 8, 8)
    with pytest.raises(InsufficientMemoryError, match=r"needs 800 bytes whole but group 'solve' is offered 400"):
        decide(
            now(totals, 400), totals, offered=400, policy=Policy.FAIL, passive=False, if_empty=lambda: 0, group="solve"
        )


def test_wait_takes_a_plan_as_good_as_the_best_there_could_be() -> None:
    totals = Totals(100, 0, 8, 8)
    assert decided(totals, 800, Policy.WAIT, False, 1600) == totals.plan(800)  # whole: no wait
    chunked = decided(totals, 400, Policy.WAIT, False, 400)  # no more room to come: take the chunks
    assert isinstance(chunked, ChunkPlan) and chunked.chunks == 2
    assert decided(totals, 400, Policy.WAIT, False, 800) == Wait(totals.plan(800), 800)
    with pytest.raises(PlanningError):  # cannot fit even with everything released: fails at once
        decided(totals, 0, Policy.WAIT, False, 7)


@given(TOTALS, st.integers(0, 1 << 26), st.integers(0, 1 << 26))
def test_a_batch_waits_on_itself_when_without_its_own_bytes_its_plan_is_worse(
    totals: Totals, empty: int, own: int
) -> None:
    best = now(totals, empty)
    if best is None:
        return
    wait = Wait(best, empty)
    without = now(totals, max(0, empty - own))
    assert waits_on_itself(totals, wait, own) == (without is None or without.planned_bytes < best.planned_bytes)
    assert not waits_on_itself(totals, wait, 0)


def test_check_under_cap() -> None:
    check_under_cap("g", 10, 10)
    with pytest.raises(InsufficientMemoryError, match=r"group 'g' holds 11 bytes, over its cap of 10"):
        check_under_cap("g", 11, 10)


@given(st.integers(2, 500), st.data())
def test_longest_head_finds_the_boundary(count: int, data: st.DataObject) -> None:
    boundary = data.draw(st.integers(1, count - 1))
    asked: list[int] = []

    def fits(n: int) -> bool:
        asked.append(n)
        return n <= boundary

    assert longest_head(count, fits) == boundary
    assert len(asked) <= count.bit_length()
