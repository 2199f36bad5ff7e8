"""The table of plan parameters (`simulator.params.PARAMS`): one row per field of
`PlanParams`, and validation read from it."""

import dataclasses

import pytest

from simulator.errors import UserError
from simulator.params import PARAMS, PlanParams


def test_every_parameter_has_one_row_and_the_papers_come_first() -> None:
    fields = {f.name for f in dataclasses.fields(PlanParams)}
    names = [p.name for p in PARAMS]
    assert sorted(names) == sorted(fields)
    assert names[:3] == ["n_tensors", "lb", "ub"]
    assert len({p.option for p in PARAMS}) == len(PARAMS)


@pytest.mark.parametrize("param", [p for p in PARAMS if p.low is not None], ids=lambda p: p.name)
def test_a_value_under_a_rows_least_is_refused_naming_the_parameter(param) -> None:  # type: ignore[no-untyped-def]
    low = param.low
    at_least = {param.name: type(getattr(PlanParams(), param.name))(low)}
    PlanParams(**at_least)  # the least value itself is valid
    below = {param.name: type(getattr(PlanParams(), param.name))(low - 1)}
    with pytest.raises(UserError, match=f"^{param.name} must be at least"):
        PlanParams(**below)


@pytest.mark.parametrize("param", [p for p in PARAMS if p.choices], ids=lambda p: p.name)
def test_a_value_outside_a_rows_choices_is_refused(param) -> None:  # type: ignore[no-untyped-def]
    for value in param.choices:
        PlanParams(**{param.name: value})
    with pytest.raises(UserError, match=f"^{param.name} must be one of"):
        PlanParams(**{param.name: "nope"})


def test_lb_above_ub_is_refused() -> None:
    PlanParams(lb=3, ub=3)
    with pytest.raises(UserError, match="lb <= ub"):
        PlanParams(lb=4, ub=3)


def test_older_plan_files_limits_are_read_as_the_one_limit() -> None:
    """Plan files and studies from before `limit` name its two halves; `fit` set each to the
    budget where it applied, so either read alone, or both, give that budget."""
    budget = 15 << 30
    fresh = PlanParams(recompute="cheap", backward_swaps=True, limit=budget)
    assert PlanParams.from_dict(fresh.to_dict()) == fresh
    old = {k: v for k, v in fresh.to_dict().items() if k != "limit"}
    for halves in ({"recompute_limit": budget, "backward_limit": 0},
                   {"recompute_limit": 0, "backward_limit": budget},
                   {"recompute_limit": budget, "backward_limit": budget}):  # fmt: skip
        assert PlanParams.from_dict({**old, **halves}) == fresh
    assert PlanParams.from_dict({**old, "recompute_limit": 0}).limit == 0
