"""What kernels do with memory, against TensorFlow's allocator record of one step.

A fresh process runs a small step under the profiler (the CPU's BFC allocator reports every
request with the op that made it) and captures it: each op whose output takes over an input
buffer made no output request, each Einsum's temporaries are what it requested beyond its
output, and a commutative op tries its inputs in the order Grappler sorts them.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.tf, pytest.mark.slow]

_RECORD = r"""
import json
from autotune.run.measure import prepare_measurement
prepare_measurement()
import tensorflow as tf
from autotune.api import capture
from tests.allocations import recorded_requests

@tf.function
def step(q, k, v, a):
    x = a * 2.0
    y = tf.math.erfc(x)
    z = tf.math.xlogy(y, a)
    s = tf.einsum("BTNH,BSNH->BNTS", q * 1.0, k * 1.0)
    p = tf.nn.softmax(s)
    o = tf.einsum("BNTS,BSNH->BTNH", p, v)
    w = tf.add_n([a * 3.0, a * 4.0, z])
    return tf.reduce_sum(w) + tf.reduce_sum(o)

qkv = tf.random.normal([64, 32, 2, 16])
a = tf.random.uniform([256, 256], 0.5, 1.0)
args = (qkv, qkv, qkv, a)
step(*args)
recorded = recorded_requests(lambda: step(*args))
# not the kernels' small bookkeeping
requests = {op: [n for _, n in r if n >= 65536] for op, r in recorded.items()}
cap = capture(step, *args)
ops = {n: [op.type, list(op.inplace), op.scratch, [cap.graph.tensors[t].nbytes for t in op.outputs],
           [cap.graph.tensors[t].producer for t in op.inputs]]
       for n, op in cap.graph.ops.items()}
print(json.dumps({"ops": ops, "requests": requests}))
"""


@pytest.fixture(scope="module")
def record() -> dict:  # type: ignore[type-arg]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = subprocess.run(
        [sys.executable, "-c", _RECORD], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def _of_type(record: dict, op_type: str) -> dict:  # type: ignore[type-arg]
    return {n: op for n, op in record["ops"].items() if op[0] == op_type}


@pytest.mark.parametrize("op_type", ["Erfc", "Xlogy", "Softmax"])
def test_an_op_that_takes_over_its_input_requests_no_output(record: dict, op_type: str) -> None:  # type: ignore[type-arg]
    (name, (_, inplace, _, _, _)), *_ = _of_type(record, op_type).items()
    assert 0 in inplace
    assert record["requests"].get(name, []) == []  # it wrote into its input's buffer


def test_each_einsum_requests_its_temporaries_beyond_its_output(record: dict) -> None:  # type: ignore[type-arg]
    einsums = _of_type(record, "Einsum")
    assert len(einsums) == 2
    for name, (_, _, scratch, outputs, _) in einsums.items():
        assert scratch > 0
        assert sum(record["requests"][name]) == scratch + outputs[0], name


def test_a_commutative_op_tries_first_the_input_whose_name_sorts_first(record: dict) -> None:  # type: ignore[type-arg]
    (_, (_, inplace, _, _, producers)), *_ = _of_type(record, "AddN").items()
    assert [producers[i] for i in inplace] == sorted(producers)
    assert inplace != sorted(inplace)  # built in another order than Grappler sorts them


@pytest.mark.parametrize("dtype,per_element", [("float32", 4 + 4), ("float16", 2 + 4)])
def test_a_gpu_softmax_holds_row_maxima_and_sums_of_its_outputs_shape(
    dtype: str, per_element: int
) -> None:
    """softmax_op_gpu.cu.cc: two temporaries of the output's shape, the sums in float for
    half precision; the CPU's kernel has none (nothing here runs on a GPU)."""
    import tensorflow as tf

    from rewriter.cpukernels import CpuKernels, cpu_scratch_bytes
    from rewriter.kernels import kernel_scratch

    graph = tf.Graph()
    with graph.as_default():
        tf.nn.softmax(tf.zeros([8, 4, 16], dtype=dtype))
    (op,) = [op for op in graph.get_operations() if op.type == "Softmax"]
    assert kernel_scratch(op) == 8 * 4 * 16 * per_element
    for onednn in (False, True):
        kernels = CpuKernels(onednn=onednn, threads=2, l3_bytes=None)
        assert cpu_scratch_bytes("Softmax", [(8, 4, 16)], [(8, 4, 16)], 4, kernels) == 0
