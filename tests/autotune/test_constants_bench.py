"""The sweep of the constants in code (`autotune.benchmarks.constants`): its table and its
setting of one constant at a time."""

from autotune.benchmarks.constants import SWEEP, _set, markdown


def test_a_constant_is_set_for_the_block_only() -> None:
    from simulator import engine, recompute_chains, refine

    kept = recompute_chains.HOLD_STEPS, refine.GUARD_RELEASES
    with _set("HOLD_STEPS", 9):
        assert recompute_chains.HOLD_STEPS == 9 and kept[1] == refine.GUARD_RELEASES
    with _set("EDGE_REUSE", 2.5):
        assert engine.EDGE_REUSE == 2.5
    assert kept == (recompute_chains.HOLD_STEPS, refine.GUARD_RELEASES) and engine.EDGE_REUSE == 1.5


def test_the_table_has_a_cell_per_value_and_says_where_edges_were_found() -> None:
    tuned = {"peak_bytes": 3 << 30, "overhead": 1.25, "seconds": 0.5}
    row = {f"{n}={v}": dict(tuned) for n, (_, values) in SWEEP.items() for v in values}
    row |= {f"BACKWARD_GAP={v}": {"least_over_bound": 1.5} for v in SWEEP["BACKWARD_GAP"][1]}
    row["edges_own"] = {"found_at": 300, "least_over_bound": 1.0, **tuned}
    row["edges_reused"] = {"found_at": 200, "least_over_bound": 1.1, **tuned}
    lines = markdown([{"name": "m", **row}, {"name": "bad", "error": "boom"}], "# head")
    header, body, failed = lines[2], lines[4], lines[5]
    assert header.count("|") == body.count("|") == len(row) + 2
    assert "| 1.50 |" in body and "1.250x, 3.00 GiB, 0.5 s" in body
    own, reused = "1.00, 1.250x, 3.00 GiB, 0.5 s, @300", "1.10, 1.250x, 3.00 GiB, 0.5 s, @200"
    assert body.endswith(f"| {own} | {reused} |")
    assert failed == "| bad | error: boom |"
