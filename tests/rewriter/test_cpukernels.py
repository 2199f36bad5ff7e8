"""The CPU kernels' temporary buffers: the rules, and the allocator's own record of a real step.

The record comes from the profiler's memory events of one step in a fresh process, with oneDNN
forced off (TensorFlow's own kernels, the default on CPUs without AVX-512 VNNI) or on.
"""

import json
import os
import subprocess
import sys

import pytest

from rewriter.cpukernels import CpuKernels, cpu_scratch_bytes

OFF = CpuKernels(onednn=False, threads=2, l3_bytes=36 << 20)


def test_onednn_kernels_keep_the_scratch_of_every_device() -> None:
    on = CpuKernels(onednn=True, threads=2, l3_bytes=None)
    shapes = [(32, 32, 32, 16), (4,), (32, 32, 32, 16)]
    assert cpu_scratch_bytes("Conv2DBackpropFilter", shapes, [(3, 3, 16, 16)], 4, on) is None
    assert cpu_scratch_bytes("Relu", [(8,)], [(8,)], 4, OFF) is None


def test_a_2d_filter_gradient_buffers_the_same_shard_of_images_at_any_batch() -> None:
    def scratch(batch: int) -> int | None:
        image, grad = (batch, 32, 32, 16), (batch, 32, 32, 16)
        return cpu_scratch_bytes(
            "Conv2DBackpropFilter", [image, (4,), grad], [(3, 3, 16, 16)], 4, OFF
        )

    one_image = 32 * 32 * (3 * 3 * 16) * 4  # output pixels x filter size, float32
    assert scratch(32) == scratch(128)  # the shard fills a working set, not the batch
    assert scratch(32) is not None and scratch(32) % one_image == 0 and scratch(32) > one_image


def test_a_2d_input_gradient_takes_one_image_at_a_time_at_batch_1_or_when_one_image_is_big() -> (
    None
):
    def scratch(batch: int, pixels: int, channels: int) -> int | None:
        grad = (batch, pixels, pixels, channels)
        filt = (3, 3, channels, channels)
        return cpu_scratch_bytes("Conv2DBackpropInput", [(4,), filt, grad], [grad], 4, OFF)

    small = 8 * 8 * 9 * 16 * 4
    assert scratch(1, 8, 16) == small
    assert scratch(32, 8, 16) is not None and scratch(32, 8, 16) > small  # sharded
    big = 56 * 56 * 9 * 64 * 4  # one image's work exceeds a thread's share of the L2
    assert scratch(32, 56, 64) == big


def test_a_3d_gradient_whose_buffer_would_dwarf_its_tensors_falls_back_to_eigen() -> None:
    image, grad = (2, 16, 16, 16, 1), (2, 16, 16, 16, 4)
    args = [image, (5,), grad], [(3, 3, 3, 1, 4)], 4
    assert cpu_scratch_bytes("Conv3DBackpropFilterV2", *args, OFF) == 0
    wide = (8, 16, 16, 16, 8), (5,), (8, 16, 16, 16, 4)
    kept = cpu_scratch_bytes("Conv3DBackpropFilterV2", list(wide), [(3, 3, 3, 8, 4)], 4, OFF)
    assert kept is not None and kept > 0


def test_a_3d_gradient_needs_the_l3_size() -> None:
    unknown = CpuKernels(onednn=False, threads=2, l3_bytes=None)
    wide = [(8, 16, 16, 16, 8), (5,), (8, 16, 16, 16, 4)]
    with pytest.raises(ValueError, match="L3 cache"):
        cpu_scratch_bytes("Conv3DBackpropFilterV2", wide, [(3, 3, 3, 8, 4)], 4, unknown)


def test_max_pool_grad_keeps_the_pooled_output_and_its_int64_argmax() -> None:
    pooled = (32, 16, 16, 16)
    got = cpu_scratch_bytes("MaxPoolGrad", [(32, 32, 32, 16), pooled, pooled], [(1,)], 4, OFF)
    assert got == 32 * 16 * 16 * 16 * (4 + 8)


_RECORD = r"""
import json, sys
from autotune.run.measure import example_tensors, prepare_measurement
prepare_measurement()
from autotune.api import capture
from autotune.zoo import get_entry
from tests.allocations import recorded_requests

model, batch, record = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "record"
zm = get_entry(model).build(cube=None)
cap = capture(zm.model, loss=zm.loss, optimizer=zm.optimizer, batch_size=batch)
ops = {n: [op.type, op.cpu_scratch, op.scratch] for n, op in cap.graph.ops.items()}
temps = {}
if record:
    fn, inputs = cap.concrete_function, example_tensors(cap.specs)
    fn(*inputs)
    requests = recorded_requests(lambda: fn(*inputs))
    temps = {op: [n for kind, n in r if kind == "temp"] for op, r in requests.items()}
print(json.dumps({"ops": ops, "temps": temps}))
"""


def _record(model: str, batch: int, onednn: str, record: bool) -> dict:  # type: ignore[type-arg]
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": onednn, "TF_CPP_MIN_LOG_LEVEL": "2"}
    args = [sys.executable, "-c", _RECORD, model, str(batch), "record" if record else "-"]
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]


_CONV_GRADS = ("Conv2DBackpropInput", "Conv2DBackpropFilter") + tuple(
    f"Conv3DBackprop{k}V2" for k in ("Input", "Filter")
)


def _keeping(model: str, batch: int) -> int:
    """`batch`, doubled until the model predicts some convolution gradient keeps a buffer on
    this CPU (up to 4 times): the 3-D gradients size it by the L3 cache and drop it when it
    would exceed 25 times their tensors, so the batch that keeps one depends on the L3 (the
    tiny U-Net keeps some at batch 64 with a 36 or 260 MiB L3, none with 480 MiB)."""
    for _ in range(3):
        ops = _record(model, batch, "0", record=False)["ops"].values()
        if any(s for t, s, _ in ops if t in _CONV_GRADS):
            break
        batch *= 2
    return batch


@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.parametrize("model,batch", [("tiny-cnn", 32), ("tiny-unet3d", 64)])
def test_without_onednn_each_kernel_buffer_is_what_the_allocator_recorded(
    model: str, batch: int
) -> None:
    r = _record(model, _keeping(model, batch), "0", record=True)
    checked = 0
    for name, (op_type, cpu_scratch, scratch) in r["ops"].items():
        temps = r["temps"].get(name, [])
        if op_type in _CONV_GRADS:
            assert cpu_scratch == max(temps, default=0), (name, temps)
            checked += 1
        elif op_type == "MaxPoolGrad":
            assert cpu_scratch == sum(temps), (name, temps)
        else:  # any large buffer is one the model holds for every device
            assert all(t < 1 << 20 or t == scratch for t in temps), (name, op_type, temps)
    assert checked >= 8
    assert any(s for t, s, _ in r["ops"].values() if t in _CONV_GRADS)


@pytest.mark.tf
@pytest.mark.slow
def test_with_onednn_no_op_has_a_cpu_specific_buffer() -> None:
    r = _record("tiny-cnn", 4, "1", record=False)
    assert all(cpu_scratch is None for _, cpu_scratch, _ in r["ops"].values())


def test_eigen_reads_an_amd_l3_from_bits_27_to_18_of_edx() -> None:
    from rewriter.cpuid import eigen_amd_l3_bytes

    assert eigen_amd_l3_bytes(134254912) == 256 << 20  # an EPYC VM's leaf 0x80000006
    assert eigen_amd_l3_bytes(0x3FF << 18) == 0x3FF * 512 * 1024
    assert eigen_amd_l3_bytes(0xF << 28) == 0  # Eigen's mask drops the field's top bits


def test_cpuid_names_the_vendor_linux_names() -> None:
    import platform

    from rewriter.cpuid import vendor
    from tests.cpu import cpu_vendor

    x86 = platform.machine() in ("x86_64", "AMD64")
    assert vendor() == (cpu_vendor() if x86 else "")
    assert vendor() or not x86
