"""The names of the ops the rewriter adds, and of what Grappler makes of them."""

import pytest

from rewriter.names import copy_name, recompute_chain


@pytest.mark.parametrize(
    ("name", "chain"),
    [
        (copy_name("m/bn/batchnorm/add_1", 3), "recompute_3"),
        ("m/add/Add/ArithmeticOptimizer/AddOpsRewrite_recompute_12", "recompute_12"),
        ("m/add/Add/ArithmeticOptimizer/AddOpsRewrite_Leaf_1_recompute_2", "recompute_2"),
        ("m/add/ArithmeticOptimizer/AddOpsRewrite_Add", ""),
        ("m/recompute_3/conv", ""),
        ("m/norecompute_3", ""),
    ],
)
def test_a_copy_and_what_grappler_makes_of_copies_name_their_chain(name: str, chain: str) -> None:
    assert recompute_chain(name) == chain
