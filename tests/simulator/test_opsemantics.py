from simulator.opsemantics import scratch_bytes


def test_sparse_cross_entropy_holds_a_temporary_the_size_of_its_loss() -> None:
    # logits [64 x 4096 voxels, 2 classes] float32, int32 labels -> loss [262144], backprop
    rows = 64 * 4096
    inputs, outputs = [rows * 2 * 4, rows * 4], [rows * 4, rows * 2 * 4]
    assert scratch_bytes("SparseSoftmaxCrossEntropyWithLogits", inputs, outputs) == 1 << 20


def test_element_wise_ops_hold_no_temporary() -> None:
    assert scratch_bytes("AddV2", [1 << 20, 1 << 20], [1 << 20]) == 0


def test_constants_and_what_grappler_folds_from_them_are_foldable() -> None:
    from simulator import Graph, TensorKind
    from simulator.opsemantics import foldable_ops
    from tests.simulator.builders import add

    g = Graph()
    (x,) = add(g, "x", [], 64, type="Placeholder", kind=TensorKind.INPUT)
    (c,) = add(g, "c", [], 4, type="Const", kind=TensorKind.CONSTANT)
    (half,) = add(g, "half", [c], 2, type="Cast")
    (shape,) = add(g, "shape", [x], 8, type="Shape")
    (scaled,) = add(g, "scaled", [x, half], 64, type="Mul")  # x * constant
    (noise,) = add(g, "noise", [shape], 64, type="RandomUniform")
    (relu,) = add(g, "relu", [x], 64, type="Relu")
    add(g, "masked", [x, noise], 64, type="Mul")
    add(g, "twice", [scaled, relu], 64, type="Mul")
    assert foldable_ops(g) == {"c", "half", "shape"}
