"""Temporary buffers of TensorFlow's CPU kernels, which depend on the build and the machine.

TensorFlow's CPU build runs oneDNN kernels only where oneDNN is enabled: by default on CPUs
with AVX-512 VNNI, BF16 or AMX, or with `TF_ENABLE_ONEDNN_OPTS=1`. Elsewhere the convolution
gradients are TensorFlow's own im2col kernels (tensorflow/core/kernels/conv_grad_*), whose
column buffer goes through the allocator and, on a small model, dwarfs every activation:

- 2-D: the buffer holds `shard` images, as many as fit a 30 MiB working set (the constant the
  kernels assume for the L3 cache); the input gradient takes one image at a time when the batch
  is 1 or a thread's share of one image's matrices exceeds a 256 KiB L2.
- 3-D: the same with the L3 size Eigen reads from the CPU (on AMD CPUs the whole package's,
  `rewriter.cpuid`), and TensorFlow falls back to an Eigen kernel without the buffer when it
  would exceed 25 times the op's tensors.
- MaxPoolGrad keeps a copy of the pooled output and its int64 arg-max.

Each rule was checked against the allocator's own record (the profiler's memory events) on a
CPU without oneDNN; see tests/rewriter/test_cpukernels.py.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

from simulator.opsemantics import SOFTMAX

__all__ = [
    "CPU_SCRATCH_TYPES",
    "SWITCHING_TYPES",
    "CpuKernels",
    "cpu_kernels",
    "cpu_scratch_bytes",
]

_L2_ASSUMED = 256 << 10  # bytes, constant in conv_grad_input_ops.h
_L3_ASSUMED = 30 << 20  # bytes, constant in the 2-D kernels
_MAX_OVERHEAD_3D = 25  # kMaxTempAllocationOverhead of the 3-D kernels
_L3_FILE = "/sys/devices/system/cpu/cpu0/cache/index3/size"
_AMD = ("AuthenticAMD", "AMDisbetter!")  # the vendors Eigen queries as AMD

Shape = tuple[int, ...]

_INPUT_GRADS = frozenset({"Conv2DBackpropInput", "Conv3DBackpropInputV2", "Conv3DBackpropInput"})
_FILTER_GRADS = frozenset(
    {"Conv2DBackpropFilter", "Conv3DBackpropFilterV2", "Conv3DBackpropFilter"}
)
#: Op types whose CPU kernel may hold a buffer of its own (see `cpu_scratch_bytes`).
#: (Softmax's CPU kernels hold no temporaries, a GPU's do: `simulator.opsemantics.SOFTMAX`)
CPU_SCRATCH_TYPES = _INPUT_GRADS | _FILTER_GRADS | SOFTMAX | {"MaxPoolGrad", "MaxPool3DGrad"}
#: Op types whose CPU kernel changes algorithm with the size: the 3-D convolution gradients
SWITCHING_TYPES = frozenset(t for t in _INPUT_GRADS | _FILTER_GRADS if "3D" in t)


@dataclass(frozen=True)
class CpuKernels:
    """What selects the CPU kernels and sizes their buffers in this process."""

    onednn: bool
    threads: int  # intra-op threads: the share of work each thread gets
    l3_bytes: int | None  # the CPU's L3 cache, None where it cannot be read


@functools.cache
def cpu_kernels() -> CpuKernels:
    """This process's CPU kernels: oneDNN on or off, intra-op threads, L3 cache size."""
    import tensorflow as tf
    from tensorflow.python.util import _pywrap_util_port

    threads = tf.config.threading.get_intra_op_parallelism_threads()
    threads = threads or len(os.sched_getaffinity(0))
    return CpuKernels(bool(_pywrap_util_port.IsMklEnabled()), threads, _l3_bytes())


def _l3_bytes() -> int | None:
    """The L3 size the kernels read, or None: Eigen asks the CPU. On AMD CPUs that is the
    package's L3 (`rewriter.cpuid`); elsewhere one cache's, as Linux reports it."""
    from rewriter.cpuid import cpuid, eigen_amd_l3_bytes, vendor

    if vendor() in _AMD:
        top = cpuid(0x80000000)
        extended = cpuid(0x80000006) if top and top[0] >= 0x80000006 else None
        if extended and eigen_amd_l3_bytes(extended[3]):
            return eigen_amd_l3_bytes(extended[3])
    try:
        with open(_L3_FILE) as f:
            text = f.read().strip()
    except OSError:
        return None
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text.rstrip("KMG")
    return int(digits) * scale if digits.isdigit() else None


def cpu_scratch_bytes(
    op_type: str,
    inputs: list[Shape | None],
    outputs: list[Shape | None],
    itemsize: int,
    kernels: CpuKernels,
) -> int | None:
    """Bytes the CPU kernel of `op_type` allocates for itself while it runs, or None when it
    is what `simulator.opsemantics.scratch_bytes` says for every device (oneDNN builds, and op
    types without a CPU-specific buffer). Raise ValueError when a needed size is unknown."""
    if op_type in SOFTMAX:
        return 0
    if kernels.onednn:
        return None
    if op_type in _INPUT_GRADS:  # inputs: sizes (or input), filter, gradient; output: image
        return _column_buffer(outputs[0], inputs[1], inputs[2], itemsize, kernels, True)
    if op_type in _FILTER_GRADS:  # inputs: image, filter sizes, gradient; output: filter
        return _column_buffer(inputs[0], outputs[0], inputs[2], itemsize, kernels, False)
    if op_type == "MaxPoolGrad" and len(inputs) > 1 and inputs[1] is not None:
        return math.prod(inputs[1]) * (itemsize + 8)  # a copy of the pooled output, int64 argmax
    if op_type == "MaxPool3DGrad":
        return 0
    return None


def _column_buffer(
    image: Shape | None,
    filt: Shape | None,
    grad: Shape | None,
    itemsize: int,
    kernels: CpuKernels,
    of_input: bool,
) -> int:
    """Bytes of the im2col buffer [shard images, output pixels, filter size] of a convolution
    gradient (NHWC / NDHWC; `of_input`: the input gradient, else the filter gradient), from the
    image, filter and output-gradient shapes."""
    image, filt, grad = _known(image), _known(filt), _known(grad)
    batch, out_image, out_depth = grad[0], math.prod(grad[1:-1]), grad[-1]
    filter_total = math.prod(filt[:-1])
    work = out_image * out_depth + filter_total * out_depth + out_image * filter_total
    three_d = len(grad) == 5
    l3 = _needs_l3(kernels) if three_d else _L3_ASSUMED
    one_at_a_time = of_input and batch == 1
    if of_input and not three_d:  # the 2-D input gradient also weighs one image's work
        one_at_a_time |= work // kernels.threads >= _L2_ASSUMED // itemsize
    shard = 1 if one_at_a_time else -(-(l3 // itemsize) // work)
    col = shard * out_image * filter_total
    total = math.prod(image) + math.prod(filt) + math.prod(grad)
    if three_d and col // total > _MAX_OVERHEAD_3D:
        return 0  # TensorFlow falls back to Eigen's kernel, which needs no such buffer
    return col * itemsize


def _needs_l3(kernels: CpuKernels) -> int:
    if kernels.l3_bytes is None:
        raise ValueError(
            "3-D convolution gradients on this CPU size their buffer by the L3 cache, which "
            f"Linux does not report here ({_L3_FILE})"
        )
    return kernels.l3_bytes


def _known(shape: Shape | None) -> Shape:
    if shape is None:
        raise ValueError("a convolution gradient's shapes must be fully known")
    return shape
