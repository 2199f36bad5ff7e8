from typing import Any

import pytest

from autotune.search.tuned import TrainingStep
from simulator import SwapPlan, get_preset
from simulator.errors import UserError
from simulator.params import PlanParams


class _Retuner:
    def __init__(self) -> None:
        self.asked: list[tuple[int, PlanParams]] = []

    def step_at(self, batch: int, params: PlanParams) -> Any:
        self.asked.append((batch, params))
        return f"step at {batch}"


def test_the_step_at_another_batch_is_made_once_from_the_tuned_parameters() -> None:
    params = PlanParams(ub=3)
    retuner = _Retuner()
    step = TrainingStep(None, SwapPlan(), params, get_preset("v100-16gb-nvlink2"), 32, retuner)
    assert step.at_batch(64) == step.at_batch(64) == "step at 64"
    assert retuner.asked == [(64, params)]


def test_a_step_without_a_retuner_names_the_batch_it_was_tuned_at() -> None:
    step = TrainingStep(None, SwapPlan(), PlanParams(), get_preset("v100-16gb-nvlink2"), 32)
    with pytest.raises(
        UserError, match="tuned at batch 32 and cannot capture the step at batch 64"
    ):
        step.at_batch(64)
    with pytest.raises(UserError, match="no captured step"):
        _ = step.rewritten
