"""Twin models, one trained by the original step and one by a tuned step, compared."""

from typing import Any

import numpy as np


def assert_same_state(a: Any, b: Any) -> None:
    """Every weight and optimizer variable of twins `a` and `b` (zoo models) bitwise equal."""
    state_a = [*a.model.weights, *a.optimizer.variables]
    state_b = [*b.model.weights, *b.optimizer.variables]
    for va, vb in zip(state_a, state_b, strict=True):
        assert np.array_equal(np.asarray(va), np.asarray(vb)), va.path
