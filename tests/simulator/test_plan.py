import dataclasses

from simulator.plan import Swap, SwapIn


def test_a_swap_with_other_swap_ins_keeps_every_other_field() -> None:
    """`with_swap_ins` is `dataclasses.replace` without its cost: every field but the swap-ins
    stays (a field added to `Swap` and not carried fails here)."""
    values = {"tensor": "t:0", "nbytes": 7, "swap_ins": (SwapIn("a", ("b",)),), "sync": True}
    values["waiter"] = "w"
    assert set(values) == {f.name for f in dataclasses.fields(Swap)}
    swap = Swap(**values)  # type: ignore[arg-type]
    ins = (SwapIn("c", ("d", "e")),)
    assert swap.with_swap_ins(ins) == dataclasses.replace(swap, swap_ins=ins)
    assert swap.with_swap_ins(ins).swap_ins == ins
