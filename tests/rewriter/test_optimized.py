"""The captured step as Grappler optimizes it: what TensorFlow really runs."""

from collections import Counter

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from autotune.api import capture  # noqa: E402
from autotune.zoo import get_entry  # noqa: E402
from rewriter.optimized import optimized_graph  # noqa: E402
from simulator import TensorKind  # noqa: E402
from simulator.graph import Graph  # noqa: E402

pytestmark = pytest.mark.tf


@pytest.fixture(scope="module")
def cnn():  # type: ignore[no-untyped-def]
    zm = get_entry("tiny-cnn").build(seed=3)
    return capture(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=4)


def _updates(graph: Graph) -> Counter[str]:
    return Counter(op.type for op in graph.ops.values() if "Assign" in op.type)


def _variable_bytes(graph: Graph) -> int:
    return sum(t.nbytes for t in graph.tensors.values() if t.kind is TensorKind.VARIABLE)


def test_fuses_convolutions_and_keeps_every_variable_update(cnn) -> None:  # type: ignore[no-untyped-def]
    graph = optimized_graph(cnn)
    types = Counter(op.type for op in graph.ops.values())
    convs = sum(1 for op in cnn.graph.ops.values() if op.type == "Conv2D")
    assert types["_FusedConv2D"] == convs > 0
    assert types["Conv2D"] == 0
    assert len(graph.ops) < len(cnn.graph.ops)
    assert _updates(graph) == _updates(cnn.graph)
    assert _variable_bytes(graph) == _variable_bytes(cnn.graph)


def test_follows_the_optimizer_settings_of_this_process(cnn) -> None:  # type: ignore[no-untyped-def]
    before = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options({"remapping": False})
    try:
        graph = optimized_graph(cnn)
    finally:
        tf.config.optimizer.set_experimental_options({"remapping": before.get("remapping", True)})
    types = Counter(op.type for op in graph.ops.values())
    assert types["_FusedConv2D"] == 0
    assert types["Conv2D"] > 0


def test_a_mixed_bfloat16_step_imports_with_every_tensor_of_its_size() -> None:
    # Grappler fuses bfloat16 convolutions into _FusedConv2D, whose registered signature lacks
    # bfloat16: the importer refused it ("Value for attr 'T' of bfloat16 is not in the list")
    import keras

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        zm = get_entry("tiny-cnn").build(seed=3)
        cap = capture(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=4)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    graph = optimized_graph(cap)
    # Grappler fuses them only where oneDNN computes bfloat16 (AVX-512 BF16 or AMX CPUs);
    # elsewhere they stay Conv2D: either way each must have bfloat16's size
    convs = [op for op in graph.ops.values() if op.type in ("_FusedConv2D", "Conv2D")]
    assert convs and _variable_bytes(graph) == _variable_bytes(cap.graph)
    for op in convs:  # two bytes an element, as in bfloat16
        out = graph.tensors[op.outputs[0]]
        assert out.dtype == "bfloat16" and out.nbytes == 2 * int(np.prod(out.shape))
    assert _updates(graph) == _updates(cap.graph)


def test_the_capture_records_the_sums_and_products_grappler_regroups() -> None:
    from rewriter.capture import capture_function

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        pushed = (x * 2.0) * 3.0  # constant folding pushes the constants down: x * 6
        kept = tf.identity(x * y) + y  # an identity Grappler removes changes no arithmetic
        twins = tf.sin(x) + tf.sin(x)  # the two sines are one after deduplication
        return pushed + kept + twins

    spec = tf.TensorSpec([8, 8])
    graph = capture_function(step, spec, spec).graph
    short = {name.split("/")[-1] for name in graph.rewritten}
    assert {"mul", "mul_1"} <= short  # the product of a product, regrouped
    assert not short & {"mul_2", "add"}  # x * y and its sum with y are computed as written
    assert all(graph.ops[n].type in ("Mul", "AddV2", "Add", "AddN") for n in graph.rewritten)


def test_the_capture_records_the_ops_grappler_fuses_into_one_kernel(cnn) -> None:  # type: ignore[no-untyped-def]
    # oneDNN's remapper makes each convolution and its bias one `_FusedConv2D`; a control edge
    # on either would keep them apart (`rewriter.optimized._fused`)
    graph = cnn.graph
    convs = {n for n, op in graph.ops.items() if op.type == "Conv2D"}
    biases = {n for n, op in graph.ops.items() if op.type == "BiasAdd"}
    assert convs and biases
    assert convs | biases <= graph.rewritten
    assert not any(graph.ops[n].type.endswith("Grad") for n in graph.rewritten)


def test_the_capture_sees_the_variables_shapes_as_a_running_step_does() -> None:
    # a batch norm's sum and the residual sum after it are summed as one tree of adds at run
    # time, where Grappler knows the variables' shapes; offline it did only once told them
    from tests.models import captured_residual_bn_cnn

    graph = captured_residual_bn_cnn()[1].graph
    residual = {n for n, op in graph.ops.items() if op.type == "AddV2" and n.endswith("/Add")}
    assert len(residual) == 2
    assert residual <= graph.rewritten
    feeding = {graph.tensors[t].producer for n in residual for t in graph.ops[n].inputs}
    assert any(n.endswith("batchnorm/add_1") for n in feeding & graph.rewritten)


def test_reads_of_two_variables_are_two_values_when_grappler_regroups_their_products() -> None:
    from rewriter.capture import capture_function

    a, b, rate = tf.Variable(tf.ones([8])), tf.Variable(tf.ones([8])), tf.Variable(0.5)

    @tf.function
    def step(x: tf.Tensor) -> tf.Tensor:
        # weight decay as AdamW writes it, (v * c) * rate, which Grappler regroups as
        # v * (c * rate) for each variable: the reads of a and b are not one value
        a.assign_sub((a * 0.01) * rate)
        b.assign_sub((b * 0.01) * rate)
        return x + 1.0

    graph = capture_function(step, tf.TensorSpec([8])).graph
    short = {name.split("/")[-1] for name in graph.rewritten}
    assert {"mul", "mul_1", "mul_2", "mul_3"} <= short


def test_a_graph_whose_functions_differ_from_those_of_the_same_name_imports() -> None:
    """Grappler optimizes the functions a step calls; wrapping a graph adds its functions to
    the process by name, and one with another body under a name already added is refused
    (the second plan `fit` confirms as run, on ConvNeXt's grouped convolutions). Renamed, both
    import, each call running its own body."""
    from rewriter.optimized import _fresh_function_names

    @tf.function
    def inner(x):  # type: ignore[no-untyped-def]
        return x * 2.0

    @tf.function
    def outer(x):  # type: ignore[no-untyped-def]
        return inner(x) + 1.0

    spec = tf.TensorSpec([2], tf.float32)
    cf = outer.get_concrete_function(spec)
    graph_def = cf.graph.as_graph_def()
    (function,) = graph_def.library.function
    name = function.signature.name
    (two,) = [n for n in function.node_def if n.op == "Const"]
    two.attr["value"].tensor.float_val[:] = [3.0]  # another body under the same name
    output = cf.outputs[0].name

    def wrapped():  # type: ignore[no-untyped-def]
        def body(x):  # type: ignore[no-untyped-def]
            return tf.graph_util.import_graph_def(
                graph_def, input_map={cf.inputs[0].name: x}, return_elements=[output]
            )[0]

        return tf.compat.v1.wrap_function(body, signature=[spec])

    with pytest.raises(tf.errors.InvalidArgumentError, match="duplicate function"):
        wrapped()
    _fresh_function_names(graph_def)
    assert function.signature.name != name
    np.testing.assert_array_equal(wrapped()(tf.constant([1.0, 2.0])), [4.0, 7.0])
