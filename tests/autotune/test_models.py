"""The papers' models: built as their definitions say, and trained bitwise under a swap plan."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from autotune.api import capture  # noqa: E402
from autotune.run.measure import example_tensors  # noqa: E402
from autotune.zoo import get_entry  # noqa: E402
from rewriter.apply import apply_plan  # noqa: E402
from simulator.derive import PlanParams  # noqa: E402
from simulator.engine import Engine  # noqa: E402
from tests.twins import assert_same_state  # noqa: E402

pytestmark = pytest.mark.tf


def _conv(cin: int, cout: int, kernel: int) -> int:
    """A convolution block of the fork: Conv3D (kernel, bias) and instance norm (gamma, beta)."""
    return kernel**3 * cin * cout + cout + 2 * cout


def _isensee2017_counts(channels: int, labels: int, base: int, depth: int) -> tuple[int, int]:
    """Convolution blocks and parameters of `isensee2017_model`, from its definition: per level
    an entry convolution and a context module of two; per decoder level an upsampling
    convolution and a localization module (3x3x3, 1x1x1); a 1x1x1 segmentation block on each of
    the three finest levels."""
    filters = [base * 2**level for level in range(depth)]
    blocks, params, cin = 0, 0, channels
    for f in filters:
        params += _conv(cin, f, 3) + 2 * _conv(f, f, 3)
        blocks, cin = blocks + 3, f
    for level in range(depth - 2, -1, -1):
        f = filters[level]
        params += _conv(cin, f, 3) + _conv(2 * f, f, 3) + _conv(f, f, 1)
        blocks, cin = blocks + 3, f
        if level < 3:
            params += _conv(f, labels, 1)
            blocks += 1
    return blocks, params


@pytest.mark.parametrize("depth", [3, 5])
def test_isensee2017_has_the_layers_and_parameters_of_its_definition(depth: int) -> None:
    model = get_entry("unet3d-isensee2017").build(cube=16, depth=depth).model
    blocks, params = _isensee2017_counts(channels=4, labels=3, base=16, depth=depth)
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds.count("Conv3D") == kinds.count("GroupNormalization") == blocks
    assert kinds.count("LeakyReLU") == blocks
    assert kinds.count("SpatialDropout3D") == depth
    supervised = min(3, depth - 1)
    assert kinds.count("UpSampling3D") == (depth - 1) + supervised - 1  # decoder, supervision
    assert model.count_params() == params
    assert model.outputs[0].shape[1:] == (16, 16, 16, 3)


def test_isensee2017_refuses_a_cube_its_depth_cannot_halve() -> None:
    from simulator.errors import UserError

    with pytest.raises(UserError, match="divisible by 16"):
        get_entry("unet3d-isensee2017").build(cube=40)


def test_gpt2_small_has_124m_parameters() -> None:
    width, vocab, context, n_layers = 768, 50257, 1024, 12
    block = 2 * 2 * width + 4 * (width * width + width) + 2 * 4 * width * width + 5 * width
    expected = vocab * width + context * width + n_layers * block + 2 * width
    assert expected == 124_439_808
    assert get_entry("gpt2-small").build().model.count_params() == expected


TINY = {
    "unet3d-isensee2017": ({"cube": 16, "base_filters": 2, "depth": 3}, 1),
    "gpt2-small": ({"layers_": 2, "heads": 2, "width": 16, "vocab": 50, "context": 16}, 2),
}


@pytest.mark.parametrize("model", list(TINY))
def test_papers_models_train_one_step_bitwise_under_a_swap_plan(model: str) -> None:
    sizes, batch = TINY[model]
    a, b = (get_entry(model).build(seed=5, **sizes) for _ in range(2))
    cap_a = capture(a.model, loss=a.loss, optimizer=a.optimizer, batch_size=batch)
    cap_b = capture(b.model, loss=b.loss, optimizer=b.optimizer, batch_size=batch)
    plan = Engine.build(cap_b.graph).evaluate(PlanParams(), allocator=False, timed=False).plan
    assert len(plan.swaps) >= 5
    tuned = apply_plan(cap_b, plan)
    inputs = example_tensors(cap_a.specs, seed=3)
    assert np.array_equal(cap_a.concrete_function(*inputs).numpy(), tuned(*inputs).numpy())
    assert_same_state(a, b)
    fresh = get_entry(model).build(seed=5, **sizes).model.weights[0]
    assert not np.array_equal(np.asarray(a.model.weights[0]), np.asarray(fresh))
