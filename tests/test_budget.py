"""Unit and property tests of the VRAM budget policy (aiocubie._budget)."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiocubie._budget import (
    HIGH_USE_WARNING,
    MIN_AUTO_POOL,
    Budget,
    LimitMode,
    check_proportion,
    group_available,
)
from aiocubie._errors import AiocubieWarning, BudgetError

FAST = settings(max_examples=200, deadline=None)
GIB = 2**30

BAD_PROPORTIONS = [
    0,
    0.0,
    -0.0,
    -0.1,
    -1,
    1.0000001,
    1.5,
    2,
    float("nan"),
    float("inf"),
    float("-inf"),
    True,
    False,
    "0.5",
    "auto",
    None,
    [0.5],
    complex(0.5, 0),
]


@pytest.fixture(autouse=True)
def _warnings_are_errors() -> Any:
    """An unexpected AiocubieWarning fails the test; expected ones use pytest.warns."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", AiocubieWarning)
        yield


def state(budget: Budget, keys: Any) -> dict[str, Any]:
    """Everything the public API says about ``budget``, for before/after comparisons."""
    present = [k for k in keys if k in budget]
    return {
        "len": len(budget),
        "present": present,
        "manual": {k: budget.is_manual(k) for k in present},
        "proportion": {k: budget.proportion(k) for k in present},
        "cap": {k: budget.cap(k) for k in present},
        "manual_pool": budget.manual_pool_proportion,
        "auto_pool": budget.auto_pool_proportion,
    }


# -- check_proportion ------------------------------------------------------------------------
class TestCheckProportion:
    @pytest.mark.parametrize("good", [1, 1.0, 0.5, 1e-12, Fraction(1, 3), 0.05])
    def test_accepted(self, good: Any) -> None:
        value = check_proportion(good)
        assert type(value) is float
        assert value == float(good)

    def test_numpy_scalars_accepted(self) -> None:
        np = pytest.importorskip("numpy")
        assert check_proportion(np.float32(0.5)) == 0.5
        assert check_proportion(np.int64(1)) == 1.0

    @pytest.mark.parametrize("bad", BAD_PROPORTIONS)
    def test_rejected_and_named(self, bad: Any) -> None:
        with pytest.raises(BudgetError, match=r"\(0, 1\]") as info:
            check_proportion(bad)
        assert repr(bad) in str(info.value)

    def test_numpy_bool_rejected(self) -> None:
        np = pytest.importorskip("numpy")
        with pytest.raises(BudgetError):
            check_proportion(np.True_)


# -- registration ----------------------------------------------------------------------------
class TestRegistration:
    def test_empty(self) -> None:
        b = Budget(8 * GIB)
        assert len(b) == 0
        assert "a" not in b
        assert b.manual_pool_proportion == 0.0
        assert b.auto_pool_proportion == 0.0

    def test_negative_total_rejected(self) -> None:
        with pytest.raises(BudgetError, match="-1"):
            Budget(-1)

    def test_auto_alone_gets_everything(self) -> None:
        b = Budget(8 * GIB)
        b.add("a")
        assert "a" in b and len(b) == 1
        assert not b.is_manual("a")
        assert b.proportion("a") == 1.0
        assert b.cap("a") == 8 * GIB
        assert b.auto_pool_proportion == 1.0

    def test_manual(self) -> None:
        b = Budget(1000)
        b.add("m", 0.3)
        assert b.is_manual("m")
        assert b.proportion("m") == 0.3
        assert b.cap("m") == 300
        assert b.manual_pool_proportion == 0.3
        assert b.auto_pool_proportion == 0.0  # no auto members

    def test_second_registration_rejected(self) -> None:
        b = Budget(1000)
        b.add("a")
        b.add("m", 0.2)
        before = state(b, "am")
        for key, prop in [("a", None), ("a", 0.1), ("m", None), ("m", 0.2)]:
            with pytest.raises(BudgetError, match="already has a budget"):
                b.add(key, prop)
        assert state(b, "am") == before

    @pytest.mark.parametrize("bad", [p for p in BAD_PROPORTIONS if p is not None])
    def test_bad_manual_proportion_rejected(self, bad: Any) -> None:
        b = Budget(1000)
        b.add("a")
        before = state(b, "ax")
        with pytest.raises(BudgetError):
            b.add("x", bad)
        assert "x" not in b
        assert state(b, "ax") == before

    def test_unknown_keys(self) -> None:
        b = Budget(1000)
        for call in (b.proportion, b.cap, b.is_manual, b.remove, b.set_auto):
            with pytest.raises(BudgetError, match="register it first"):
                call("ghost")
        with pytest.raises(BudgetError, match="register it first"):
            b.set_manual("ghost", 0.5)
        with pytest.raises(BudgetError, match="register it first"):
            b.group_cap(["ghost"])

    def test_hashable_keys(self) -> None:
        b = Budget(1000)
        b.add(1)
        b.add((2, "x"), 0.5)
        assert b.proportion(1) == 0.5
        assert b.proportion((2, "x")) == 0.5


# -- auto pool rebalancing -------------------------------------------------------------------
class TestRebalancing:
    def test_equal_split(self) -> None:
        b = Budget(900)
        for k in "abc":
            b.add(k)
        assert [b.proportion(k) for k in "abc"] == pytest.approx([1 / 3] * 3)
        assert [b.cap(k) for k in "abc"] == [300, 300, 300]

    def test_manual_shrinks_auto(self) -> None:
        b = Budget(1000)
        b.add("a")
        b.add("b")
        b.add("m", 0.4)
        assert b.proportion("a") == pytest.approx(0.3)
        assert b.proportion("b") == pytest.approx(0.3)
        assert b.auto_pool_proportion == pytest.approx(0.6)
        assert b.manual_pool_proportion == pytest.approx(0.4)

    def test_remove_rebalances(self) -> None:
        b = Budget(1000)
        b.add("a")
        b.add("b")
        b.add("m", 0.4)
        b.remove("b")
        assert "b" not in b
        assert b.proportion("a") == pytest.approx(0.6)
        b.remove("m")
        assert b.proportion("a") == 1.0
        b.remove("a")
        assert len(b) == 0
        assert b.auto_pool_proportion == 0.0

    def test_set_manual_moves_out_of_auto(self) -> None:
        b = Budget(1000)
        b.add("a")
        b.add("b")
        b.set_manual("a", 0.7)
        assert b.is_manual("a")
        assert b.proportion("a") == 0.7
        assert b.proportion("b") == pytest.approx(0.3)
        assert b.cap("a") == 700
        assert b.cap("b") == math.floor((1 - 0.7) * 1000)

    def test_set_manual_changes_manual(self) -> None:
        b = Budget(1000)
        b.add("a")
        b.add("m", 0.5)
        b.set_manual("m", 0.2)
        assert b.proportion("m") == 0.2
        assert b.proportion("a") == pytest.approx(0.8)
        # its own old proportion does not count against the new one
        b.set_manual("m", 0.95)
        assert b.proportion("a") == pytest.approx(0.05)

    def test_set_auto_moves_back(self) -> None:
        b = Budget(1000)
        b.add("a")
        b.add("m", 0.5)
        b.set_auto("m")
        assert not b.is_manual("m")
        assert b.proportion("m") == b.proportion("a") == 0.5
        assert b.manual_pool_proportion == 0.0

    def test_set_auto_on_auto_rejected(self) -> None:
        b = Budget(1000)
        b.add("a")
        with pytest.raises(BudgetError, match="already in the auto pool"):
            b.set_auto("a")
        assert b.proportion("a") == 1.0

    @pytest.mark.parametrize("bad", BAD_PROPORTIONS)
    def test_set_manual_bad_proportion(self, bad: Any) -> None:
        b = Budget(1000)
        b.add("a")
        b.add("m", 0.5)
        before = state(b, "am")
        for key in "am":
            with pytest.raises(BudgetError):
                b.set_manual(key, bad)
        assert state(b, "am") == before

    def test_caps_floor(self) -> None:
        b = Budget(1001)
        for k in "abc":
            b.add(k)
        assert [b.cap(k) for k in "abc"] == [333, 333, 333]
        assert b.group_cap("abc") == 999
        assert b.group_cap([]) == 0

    def test_total_zero(self) -> None:
        b = Budget(0)
        b.add("a")
        assert b.cap("a") == 0


# -- the 5% auto pool ------------------------------------------------------------------------
class TestMinAutoPool:
    def test_constant(self) -> None:
        assert MIN_AUTO_POOL == 0.05

    def test_exactly_95_percent_manual_is_ok_with_auto(self) -> None:
        b = Budget(1000)
        b.add("a")
        b.add("m1", 0.5)
        b.add("m2", 0.45)  # 0.5 + 0.45 leaves exactly 0.05 (float noise tolerated)
        assert b.proportion("a") == pytest.approx(0.05)

    def test_manual_starving_auto_is_error(self) -> None:
        b = Budget(1000)
        b.add("a")
        before = state(b, ["a", "m"])
        with pytest.raises(BudgetError, match=r"under the 0\.05 minimum.*1 auto member"):
            b.add("m", 0.96)
        assert state(b, ["a", "m"]) == before

    def test_set_manual_starving_auto_is_error(self) -> None:
        b = Budget(1000)
        b.add("a")
        b.add("b")
        b.add("m", 0.5)
        before = state(b, "abm")
        with pytest.raises(BudgetError, match="minimum"):
            b.set_manual("m", 0.99)
        # moving one auto member to manual: the other still needs 5%
        with pytest.raises(BudgetError, match="minimum"):
            b.set_manual("a", 0.46)
        assert state(b, "abm") == before

    def test_set_manual_last_auto_member_only_warns(self) -> None:
        b = Budget(1000)
        b.add("a")
        b.add("m", 0.5)
        with pytest.warns(AiocubieWarning, match=r"under the 0\.05 minimum"):
            b.set_manual("a", 0.48)  # no auto member left: 0.98 manual is a warning
        assert b.manual_pool_proportion == pytest.approx(0.98)
        assert b.auto_pool_proportion == 0.0

    def test_manual_without_auto_only_warns(self) -> None:
        b = Budget(1000)
        with pytest.warns(AiocubieWarning, match=r"under the 0\.05 minimum"):
            b.add("m", 0.97)
        assert b.proportion("m") == 0.97
        assert b.cap("m") == 970

    def test_manual_full_without_auto_only_warns(self) -> None:
        b = Budget(1000)
        with pytest.warns(AiocubieWarning):
            b.add("m", 1.0)
        assert b.cap("m") == 1000

    def test_auto_cannot_join_starved_pool(self) -> None:
        b = Budget(1000)
        with pytest.warns(AiocubieWarning):
            b.add("m", 0.97)
        with pytest.raises(BudgetError, match="1 auto member"):
            b.add("a")
        assert "a" not in b

    def test_set_auto_into_starved_pool(self) -> None:
        b = Budget(1000)
        b.add("m1", 0.5)
        with pytest.warns(AiocubieWarning):
            b.add("m2", 0.48)
        with pytest.raises(BudgetError, match="minimum"):
            b.add("a")
        # m2 going auto leaves 0.5 for the auto pool: fine
        b.set_auto("m2")
        assert b.proportion("m2") == pytest.approx(0.5)

    def test_set_auto_needs_room_for_the_auto_pool(self) -> None:
        b = Budget(1000)
        with pytest.warns(AiocubieWarning):
            b.add("m1", 0.96)
        with pytest.warns(AiocubieWarning):
            b.add("m2", 0.04)
        before = state(b, ["m1", "m2"])
        # m2 joining the auto pool would leave it 0.04: an error, since m2 would be a member
        with pytest.raises(BudgetError, match=r"under the 0\.05 minimum.*1 auto member"):
            b.set_auto("m2")
        assert state(b, ["m1", "m2"]) == before
        b.set_auto("m1")  # leaves 0.96 for the auto pool
        assert b.proportion("m1") == pytest.approx(0.96)

    def test_float_slack_on_the_sum(self) -> None:
        b = Budget(1000)
        b.add("m1", 0.5)
        with pytest.warns(AiocubieWarning):
            b.add("m2", 0.5 + 5e-10)  # over 1 by float noise only: tolerated
        b = Budget(1000)
        b.add("m1", 0.5)
        with pytest.raises(BudgetError, match="over 1"):
            b.add("m2", 0.5 + 1e-6)

    def test_over_one_is_error_even_without_auto(self) -> None:
        b = Budget(1000)
        b.add("m1", 0.6)
        with pytest.raises(BudgetError, match="over 1"):
            b.add("m2", 0.5)
        with pytest.raises(BudgetError, match=r"\(0, 1\]"):
            b.set_manual("m1", 1.0000001)  # not a valid proportion at all
        with pytest.warns(AiocubieWarning):
            b.add("m2", 0.4)
        with pytest.raises(BudgetError, match="over 1"):
            b.set_manual("m1", 0.61)
        assert b.proportion("m1") == 0.6
        assert len(b) == 2

    def test_decimal_noise_tolerated(self) -> None:
        b = Budget(1000)
        b.add("a")
        for i in range(19):
            b.add(i, 0.05)  # 19 x 0.05 is 0.95 only up to float noise
        assert b.proportion("a") == pytest.approx(0.05)
        b.remove("a")
        with pytest.warns(AiocubieWarning):
            b.add("last", 0.05)  # sums to 1 up to float noise: not "over 1"
        assert b.manual_pool_proportion == pytest.approx(1.0)

    def test_warning_stacklevel_points_at_caller(self) -> None:
        b = Budget(1000)
        with pytest.warns(AiocubieWarning) as record:
            b.add("m", 0.99)
        assert record[0].filename == __file__


# -- group_available -------------------------------------------------------------------------
class TestGroupAvailable:
    def test_passive_is_free(self) -> None:
        assert group_available(LimitMode.PASSIVE, free=500, group_cap=100, group_held=90) == 500
        assert group_available(LimitMode.PASSIVE, free=-5, group_cap=100, group_held=0) == 0

    def test_passive_never_warns(self) -> None:
        # held far above 95% of the cap: passive mode does not look at caps
        assert group_available(LimitMode.PASSIVE, free=10, group_cap=100, group_held=100) == 10

    def test_active_is_cap_minus_held(self) -> None:
        assert group_available(LimitMode.ACTIVE, free=10_000, group_cap=1000, group_held=300) == 700

    def test_active_bounded_by_free(self) -> None:
        assert group_available(LimitMode.ACTIVE, free=200, group_cap=1000, group_held=300) == 200

    def test_active_never_negative(self) -> None:
        with pytest.warns(AiocubieWarning):
            assert group_available(LimitMode.ACTIVE, free=200, group_cap=1000, group_held=1200) == 0
        assert group_available(LimitMode.ACTIVE, free=-1, group_cap=1000, group_held=0) == 0

    def test_active_at_95_percent_does_not_warn(self) -> None:
        assert group_available(LimitMode.ACTIVE, free=10**6, group_cap=1000, group_held=950) == 50

    def test_active_above_95_percent_warns(self) -> None:
        with pytest.warns(AiocubieWarning, match=r"'solve' holds 951 of its 1000 bytes \(95%\)"):
            got = group_available(LimitMode.ACTIVE, free=10**6, group_cap=1000, group_held=951, group="solve")
        assert got == 49

    def test_active_warning_can_be_silenced(self) -> None:
        assert group_available(LimitMode.ACTIVE, free=10**6, group_cap=1000, group_held=999, warn=False) == 1

    def test_active_zero_cap_no_warning(self) -> None:
        assert group_available(LimitMode.ACTIVE, free=100, group_cap=0, group_held=0) == 0

    @FAST
    @given(
        free=st.integers(-(2**40), 2**40),
        cap=st.integers(0, 2**40),
        held=st.integers(0, 2**41),
    )
    def test_active_property(self, free: int, cap: int, held: int) -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = group_available(LimitMode.ACTIVE, free=free, group_cap=cap, group_held=held)
        assert got >= 0
        assert got <= max(free, 0)
        assert got <= max(cap - held, 0)
        assert got in (max(free, 0), max(cap - held, 0))
        warned = [w for w in caught if issubclass(w.category, AiocubieWarning)]
        # exact: held > 0.95 * cap  <=>  20 * held > 19 * cap (for integers)
        assert bool(warned) == (cap > 0 and 20 * held > 19 * cap)
        assert HIGH_USE_WARNING == 0.95


# -- properties over random operation sequences ----------------------------------------------
KEYS = ["k0", "k1", "k2", "k3", "k4", "k5"]
# proportions on a 1/1000 grid, so the model can reason exactly with Fractions;
# the 5% and 100% boundaries are hit exactly and often.
GRID = st.one_of(
    st.integers(1, 1000),
    st.sampled_from([50, 500, 450, 950, 951, 949, 1000, 999, 1, 25, 475]),
).map(lambda n: Fraction(n, 1000))
BAD = st.sampled_from([0, -0.25, 1.5, float("nan"), True, "0.5"])

OPS = st.one_of(
    st.tuples(st.just("add_auto"), st.sampled_from(KEYS)),
    st.tuples(st.just("add_manual"), st.sampled_from(KEYS), GRID),
    st.tuples(st.just("add_manual"), st.sampled_from(KEYS), BAD),
    st.tuples(st.just("remove"), st.sampled_from(KEYS)),
    st.tuples(st.just("set_manual"), st.sampled_from(KEYS), GRID),
    st.tuples(st.just("set_manual"), st.sampled_from(KEYS), BAD),
    st.tuples(st.just("set_auto"), st.sampled_from(KEYS)),
)


def _valid_proportion(p: Any) -> bool:
    return isinstance(p, Fraction) and 0 < p <= 1


def _apply(budget: Budget, op: tuple[Any, ...]) -> None:
    name, key, *rest = op
    value = rest[0] if rest else None
    value = float(value) if isinstance(value, Fraction) else value
    if name == "add_auto":
        budget.add(key)
    elif name == "add_manual":
        budget.add(key, value)
    elif name == "remove":
        budget.remove(key)
    elif name == "set_manual":
        budget.set_manual(key, value)
    else:
        budget.set_auto(key)


def _model_step(
    manual: dict[str, Fraction], auto: set[str], op: tuple[Any, ...]
) -> tuple[dict[str, Fraction], set[str]] | None:
    """The documented semantics, in exact arithmetic: the new (manual, auto), or None if invalid."""
    name, key, *rest = op
    known = key in manual or key in auto
    new_manual, new_auto = dict(manual), set(auto)
    if name == "add_auto":
        if known:
            return None
        new_auto.add(key)
    elif name == "add_manual":
        if known or not _valid_proportion(rest[0]):
            return None
        new_manual[key] = rest[0]
    elif name == "remove":
        if not known:
            return None
        new_manual.pop(key, None)
        new_auto.discard(key)
        return new_manual, new_auto  # removing never breaks the budget
    elif name == "set_manual":
        if not known or not _valid_proportion(rest[0]):
            return None
        new_auto.discard(key)
        new_manual[key] = rest[0]
    else:  # set_auto
        if key not in manual:
            return None
        del new_manual[key]
        new_auto.add(key)
    total = sum(new_manual.values(), Fraction(0))
    if total > 1:
        return None
    if new_auto and 1 - total < Fraction(5, 100):
        return None
    return new_manual, new_auto


def _check_invariants(b: Budget, manual: dict[str, Fraction], auto: set[str]) -> None:
    assert len(b) == len(manual) + len(auto)
    for k in KEYS:
        assert (k in b) == (k in manual or k in auto)
    manual_sum = sum(manual.values(), Fraction(0))
    assert b.manual_pool_proportion == pytest.approx(float(manual_sum), abs=1e-12)
    if auto:
        assert b.auto_pool_proportion == pytest.approx(float(1 - manual_sum), abs=1e-12)
        assert b.auto_pool_proportion >= MIN_AUTO_POOL - 1e-9
    else:
        assert b.auto_pool_proportion == 0.0
    # the pools are consistent: manual + auto == 1 when there are auto members
    if auto:
        assert b.manual_pool_proportion + b.auto_pool_proportion == pytest.approx(1.0, abs=1e-12)
    total_prop = 0.0
    auto_shares = []
    for k in KEYS:
        if k not in b:
            continue
        p = b.proportion(k)
        assert 0.0 <= p <= 1.0
        total_prop += p
        assert b.is_manual(k) == (k in manual)
        if k in manual:
            assert p == float(manual[k])  # manual members keep exactly what they were given
        else:
            auto_shares.append(p)
            assert p == pytest.approx(float((1 - manual_sum) / len(auto)), abs=1e-12)
            assert p == pytest.approx(b.auto_pool_proportion / len(auto), rel=0, abs=1e-15)  # float noise tidied
        assert b.cap(k) == math.floor(p * b.total)
        assert 0 <= b.cap(k) <= b.total
    assert len(set(auto_shares)) <= 1  # all auto shares exactly equal
    assert total_prop <= 1.0 + 1e-9
    assert b.group_cap(k for k in KEYS if k in b) <= b.total + len(b)  # floor never over-gives
    # group_cap keeps the caps it worked out until the next change: every change must be seen, by
    # every group it has worked out (the whole budget and a part of it)
    present = [k for k in KEYS if k in b]
    assert b.group_cap(present) == sum(b.cap(k) for k in present)
    assert b.group_cap(present[:2]) == sum(b.cap(k) for k in present[:2])


@FAST
@given(
    total=st.one_of(st.integers(0, 2**40), st.sampled_from([80 * GIB, 141 * GIB, 1000, 999])),
    ops=st.lists(OPS, max_size=30),
)
def test_budget_model(total: int, ops: list[tuple[Any, ...]]) -> None:
    """Random operation sequences agree with an exact model; invalid ones change nothing."""
    b = Budget(total)
    manual: dict[str, Fraction] = {}
    auto: set[str] = set()
    for op in ops:
        expected = _model_step(manual, auto, op)
        before = state(b, KEYS)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if expected is None:
                with pytest.raises(BudgetError):
                    _apply(b, op)
            else:
                _apply(b, op)
        warned = [w for w in caught if issubclass(w.category, AiocubieWarning)]
        if expected is None:
            assert state(b, KEYS) == before, op
            assert not warned
        else:
            manual, auto = expected
            # the 5% warning: only a change that sets manual proportions, leaves no auto
            # member, and leaves under 5% for the auto pool
            starving = 1 - sum(manual.values(), Fraction(0)) < Fraction(5, 100)
            expect_warning = op[0] in ("add_manual", "set_manual") and not auto and starving
            assert bool(warned) == expect_warning, (op, manual, auto)
        _check_invariants(b, manual, auto)


@FAST
@given(
    props=st.lists(
        st.one_of(st.none(), st.floats(min_value=-0.5, max_value=1.5), st.just(float("nan"))),
        max_size=12,
    ),
    total=st.integers(0, 2**44),
)
def test_budget_arbitrary_floats(props: list[float | None], total: int) -> None:
    """With arbitrary float proportions: errors change nothing, and the invariants hold."""
    b = Budget(total)
    keys = list(range(len(props)))
    for key, prop in zip(keys, props):
        before = state(b, keys)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AiocubieWarning)
            try:
                b.add(key, prop)
            except BudgetError:
                assert state(b, keys) == before
                assert prop is not None or b.manual_pool_proportion > 0.95 - 1e-9
                if prop is not None and 0 < prop <= 1:
                    assert b.manual_pool_proportion + prop > 0.95 - 1e-9
                continue
        assert prop is None or 0 < prop <= 1
        present = [k for k in keys if k in b]
        autos = [k for k in present if not b.is_manual(k)]
        assert math.fsum(b.proportion(k) for k in present) <= 1 + 1e-9
        shares = {b.proportion(k) for k in autos}
        assert len(shares) <= 1
        if autos:
            assert b.auto_pool_proportion >= MIN_AUTO_POOL - 1e-9
            (share,) = shares
            assert share == pytest.approx((1 - b.manual_pool_proportion) / len(autos))
        for k in present:
            assert b.cap(k) == math.floor(b.proportion(k) * total)


# issue 11 item 14: numbers no float holds are BudgetErrors naming them, not OverflowError
@pytest.mark.parametrize(
    "proportion, shown",
    [
        (10**400, "an integer of 401 digits"),
        (-(10**400), "an integer of 401 digits"),
        (Fraction(10**400, 3), "Fraction("),
        (Fraction(1, 10**400), "Fraction(1, "),
        (Fraction(-(10**400), 7), "Fraction(-"),
    ],
)
def test_proportions_no_float_holds_are_budget_errors(proportion: Any, shown: str) -> None:
    with pytest.raises(BudgetError, match=r"proportion must be in \(0, 1\]") as info:
        check_proportion(proportion)
    assert shown in str(info.value) and len(str(info.value)) < 200
    budget = Budget(1000)
    budget.add("a")
    with pytest.raises(BudgetError):
        budget.add("b", proportion)
    with pytest.raises(BudgetError):
        budget.set_manual("a", proportion)
    assert ("b" not in budget, budget.is_manual("a"), budget.proportion("a")) == (True, False, 1.0)


def test_reported_proportions_carry_no_float_noise() -> None:
    b = Budget(1000)
    b.add("a", 0.3)
    b.add("b", 0.6)
    b.add("c")
    assert (b.proportion("c"), b.auto_pool_proportion, b.cap("c")) == (0.1, 0.1, 100)
    third = Budget(900)
    for key in "xyz":
        third.add(key)
    assert third.proportion("x") == 1 / 3 and third.cap("x") == 300  # a real fraction stays exact
