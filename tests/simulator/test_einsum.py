"""The Einsum kernel's temporaries, against what TensorFlow's allocator recorded for a Keras
`MultiHeadAttention` (batch 128, 32 positions, 2 heads of 16; float32): its scores transpose
both operands (512 KiB each) and multiply into the output; its output transposes the value and
the product (512 KiB each). The recording itself is checked in tests/rewriter/test_kernels.py."""

from simulator.einsum import einsum_temporaries

QKV = (128, 32, 2, 16)
SCORES = (128, 2, 32, 32)
HALF_MIB = 512 << 10


def test_attention_scores_transpose_both_operands_into_the_product_order() -> None:
    assert einsum_temporaries("BTNH,BSNH->BNTS", [QKV, QKV], 4) == (HALF_MIB, HALF_MIB)


def test_attention_output_transposes_the_value_and_the_product() -> None:
    assert einsum_temporaries("BNTS,BSNH->BTNH", [SCORES, QKV], 4) == (HALF_MIB, HALF_MIB)


def test_operands_in_product_order_need_no_temporary() -> None:
    assert einsum_temporaries("ij,jk->ik", [(3, 4), (4, 5)], 4) == ()
    assert einsum_temporaries("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)], 2) == ()
    # free and contract swapped: the matrix product reads the operand transposed
    assert einsum_temporaries("ji,jk->ik", [(4, 3), (4, 5)], 4) == ()


def test_an_output_in_another_order_than_the_product_costs_the_product() -> None:
    assert einsum_temporaries("ij,jk->ki", [(3, 4), (4, 5)], 4) == (3 * 5 * 4,)


def test_what_the_rule_leaves_out_is_none() -> None:
    assert einsum_temporaries("...ij,jk->...ik", [(2, 3, 4), (4, 5)], 4) is None
    assert einsum_temporaries("ii->i", [(3, 3)], 4) is None
    assert einsum_temporaries("ij->i", [(3, 4)], 4) is None  # a reduction
    assert einsum_temporaries("ij,jk", [(3, 4), (4, 5)], 4) is None  # implicit output
    assert einsum_temporaries("ij,jk->ik", [(3, 4, 1), (4, 5)], 4) is None  # rank mismatch
