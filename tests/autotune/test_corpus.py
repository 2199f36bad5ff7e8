"""The corpus (models nobody wrote for the tool): each builds small and captures."""

import pytest

tf = pytest.importorskip("tensorflow")

from autotune.api import capture  # noqa: E402
from autotune.benchmarks.corpus import CORPUS, Member, member  # noqa: E402
from autotune.zoo import ZOO  # noqa: E402

pytestmark = pytest.mark.tf


def _small(m: Member, seed: int = 3):  # type: ignore[no-untyped-def]
    """The small variant of `m` and its captured step."""
    built, batch = m.small_variant(seed)
    return built, capture(built.model, loss=built.loss, optimizer=built.optimizer, batch_size=batch)


@pytest.mark.parametrize("name", [m.name for m in CORPUS])
def test_each_corpus_model_is_in_the_zoo_and_its_small_variant_captures(name: str) -> None:
    assert name in ZOO
    _, cap = _small(member(name))
    assert cap.graph.ops and all(t.nbytes >= 0 for t in cap.graph.tensors.values())
    assert any(n.startswith("gradient_tape/") for n in cap.graph.ops)
