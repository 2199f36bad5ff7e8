"""Fixtures of the autotune tests."""

import pytest

from simulator import Link, get_preset
from simulator.engine import Engine
from tests.simulator.builders import training_chain


@pytest.fixture
def timed_chain() -> Engine:
    """The training chain on a V100 whose link copies 1 KiB in 3.5 s, each op taking 1 s."""
    g = training_chain()
    preset = get_preset("v100-16gb-nvlink2").with_overrides(link_bytes_per_s=1024 / 3.5)
    assert preset.link == Link(1024 / 3.5, 1024 / 3.5)
    return Engine.build(g, device=preset, cost={n: 1.0 for n in g.ops})
