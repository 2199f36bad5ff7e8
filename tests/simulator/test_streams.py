"""The copy streams: each direction's own bandwidth, or a link both directions share."""

from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import Link, Timeline, compile_program, simulate_plan
from simulator.derive import PlanContext, derive_plan
from simulator.streams import SharedStreams, Streams, streams_for
from tests.simulator.test_swap_properties import params, training_graphs


def _queue(streams: Streams) -> None:
    """a (10 B) and b (20 B) swapped out at 0, a swapped back in as soon as it is out."""
    streams.swap_out("a", 10, 0.0)
    streams.swap_out("b", 20, 0.0)
    streams.swap_in("a", 0, 10, 0.0)


def test_each_direction_keeps_its_bandwidth_unless_the_link_is_shared() -> None:
    alone = streams_for(Link(10.0, 10.0))
    _queue(alone)
    assert not isinstance(alone, SharedStreams)
    assert alone.arrival(("a", 0)) == pytest.approx(2.0)  # a out 0-1, back 1-2
    assert alone.arrival(("b", -1)) == pytest.approx(3.0)  # b out 1-3
    assert not Link(10.0, 10.0, both=10.0).shared


def test_a_shared_link_slows_both_directions_while_both_copy() -> None:
    shared = streams_for(Link(10.0, 10.0, both=5.0))
    _queue(shared)
    # 0-1: a out alone at 10 B/s. 1-3: a back and b out at 5 B/s each, so a is in at 3 with
    # 10 B of b copied; b's last 10 B go alone at 10 B/s, out at 4
    assert shared.arrival(("a", 0)) == pytest.approx(3.0)
    assert shared.arrival(("b", -1)) == pytest.approx(4.0)
    shared.finish()
    assert shared.transfers == [
        ("a", "d2h", 10, 0.0, pytest.approx(1.0)),
        ("b", "d2h", 20, pytest.approx(1.0), pytest.approx(4.0)),
        ("a", "h2d", 10, pytest.approx(1.0), pytest.approx(3.0)),
    ]


def test_a_copy_waited_for_that_was_never_queued_is_an_error() -> None:
    shared = SharedStreams(Link(10.0, 10.0, both=5.0))
    with pytest.raises(KeyError):
        shared.arrival(("a", 0))


def _time(g, p, link):  # type: ignore[no-untyped-def]
    ctx = PlanContext.build(g)
    plan = derive_plan(ctx, p)
    timeline = Timeline.build(ctx.order, {n: 1e-3 for n in g.ops})
    r = simulate_plan(compile_program(g, ctx.order), g, plan, timeline=timeline, link=link)
    assert r.time is not None
    return r.time


@settings(max_examples=150, deadline=None)
@given(training_graphs(), params, st.floats(1e4, 1e7), st.floats(0.2, 1.0))
def test_a_shared_link_times_plans_between_its_two_bandwidths(g, p, bw, share) -> None:  # type: ignore[no-untyped-def]
    """Copying at the shared rate only while both directions copy is no faster than at the
    full rate throughout and no slower than at the shared rate throughout."""
    fast = _time(g, p, Link(bw, bw))
    shared = _time(g, p, Link(bw, bw, both=bw * share))
    slow = _time(g, p, Link(bw * share, bw * share))
    assert fast.step_seconds <= shared.step_seconds * (1 + 1e-9)
    assert shared.step_seconds <= slow.step_seconds * (1 + 1e-9)


@settings(max_examples=150, deadline=None)
@given(training_graphs(), params, st.floats(1e4, 1e7))
def test_the_fluid_model_of_an_unshared_link_is_the_closed_form(g, p, bw) -> None:  # type: ignore[no-untyped-def]
    """The shared streams, given a link whose directions keep their rates, time every plan
    exactly as the streams that know each end when it is queued."""
    link = Link(bw, bw * 3)
    closed = _time(g, p, link)
    with patch("simulator.timing.streams_for", SharedStreams):
        fluid = _time(g, p, link)
    assert fluid.step_seconds == closed.step_seconds
    assert fluid.stalls == closed.stalls
    assert fluid.released == closed.released
    assert fluid.transfer_rows == closed.transfer_rows
