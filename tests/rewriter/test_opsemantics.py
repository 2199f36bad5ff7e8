from rewriter.opsemantics import scratch_bytes


def test_sparse_cross_entropy_holds_a_temporary_the_size_of_its_loss() -> None:
    # logits [64 x 4096 voxels, 2 classes] float32, int32 labels -> loss [262144], backprop
    rows = 64 * 4096
    inputs, outputs = [rows * 2 * 4, rows * 4], [rows * 4, rows * 2 * 4]
    assert scratch_bytes("SparseSoftmaxCrossEntropyWithLogits", inputs, outputs) == 1 << 20


def test_element_wise_ops_hold_no_temporary() -> None:
    assert scratch_bytes("AddV2", [1 << 20, 1 << 20], [1 << 20]) == 0
