"""Plan derivation's simulations kept for reuse (`simulator.reuse`): bounded over all engines,
least recently used dropped first."""

import simulator.reuse
from simulator import get_preset
from simulator.derive import PlanParams
from simulator.engine import Engine
from simulator.streams import Link
from tests.simulator.builders import held_gradient


def _engine() -> Engine:
    g = held_gradient()
    return Engine.build(g, device=get_preset("v100-16gb-nvlink2"), cost=dict.fromkeys(g.ops, 1.0))


def test_the_simulations_kept_for_reuse_are_bounded_over_all_engines(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(simulator.reuse, "BARE_MEMO", 3)
    one, two = _engine(), _engine()
    plan = one.evaluate(PlanParams(ub=1, sync_out=True)).plan
    for kept in (one._bare, two._bare, simulator.reuse._kept):
        kept.clear()
    links = [Link(float(b), float(b)) for b in (1e3, 2e3, 3e3)]
    for link in links:
        one.simulate_bare(plan, link)
    one.simulate_bare(plan, links[0])  # used again: now the most recent
    for link in links[1:]:
        two.simulate_bare(plan, link)
    # the least recently used two of `one` went for those of `two`
    assert [k[-1] for k in one._bare] == [links[0]]
    assert [k[-1] for k in two._bare] == links[1:]
